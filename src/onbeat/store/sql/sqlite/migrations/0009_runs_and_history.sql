-- Hot runs and execution history (issue 7, "schema for growth"): runs not final yet live in the
-- narrow table runs; final runs move once into execution_history; executions becomes a view of
-- both. attempts and dead_letters no longer reference executions (a view) and carry the run's
-- fire time, which retention deletes by.

-- The hot state: runs not final yet (scheduled, queued, running). A run that becomes final moves
-- to execution_history in the transaction that ends it.
CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs (id),
    shard            INTEGER NOT NULL,
    trigger          TEXT NOT NULL,                  -- schedule | manual
    scheduled_for    INTEGER NOT NULL,
    due_at           INTEGER NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    priority         INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    fencing_token    INTEGER NOT NULL DEFAULT 0,
    result           TEXT,                           -- JSON
    last_error       TEXT,
    reason           TEXT,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    catchup          INTEGER NOT NULL DEFAULT 0,     -- run by the misfire policy although missed
    queued_at        INTEGER,                        -- handed to the delay queue
    UNIQUE (job_id, scheduled_for, trigger)          -- also the look-up of a job's runs
);
CREATE INDEX runs_dispatch ON runs (shard, status, due_at);
CREATE INDEX runs_lease_expiry ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_lease_owner ON runs (lease_owner) WHERE status = 'running';

-- Final runs (succeeded, failed, cancelled, skipped), written once; retention deletes them by
-- fire time (Store.history_maintain).
CREATE TABLE execution_history (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL,
    shard            INTEGER NOT NULL,
    trigger          TEXT NOT NULL,
    scheduled_for    INTEGER NOT NULL,
    due_at           INTEGER NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    priority         INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    fencing_token    INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    last_error       TEXT,
    reason           TEXT,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    catchup          INTEGER NOT NULL DEFAULT 0,
    queued_at        INTEGER
);
CREATE INDEX execution_history_fire ON execution_history (job_id, scheduled_for, trigger);
CREATE INDEX execution_history_finished
    ON execution_history (finished_at, status, started_at, due_at, job_id);
CREATE INDEX execution_history_age ON execution_history (scheduled_for);

INSERT INTO runs
SELECT * FROM executions WHERE status IN ('scheduled', 'queued', 'running');
INSERT INTO execution_history
SELECT * FROM executions WHERE status NOT IN ('scheduled', 'queued', 'running');

ALTER TABLE attempts RENAME TO attempts_old;
CREATE TABLE attempts (
    execution_id  TEXT NOT NULL,
    scheduled_for INTEGER NOT NULL,                 -- the run's: retention deletes by it
    attempt       INTEGER NOT NULL,
    worker        TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    outcome       TEXT NOT NULL,
    error         TEXT,
    PRIMARY KEY (execution_id, fencing_token)
);

INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token, started_at,
                      finished_at, outcome, error)
SELECT a.execution_id, e.scheduled_for, a.attempt, a.worker, a.fencing_token, a.started_at,
       a.finished_at, a.outcome, a.error
FROM attempts_old a JOIN executions e ON e.id = a.execution_id;
DROP TABLE attempts_old;
CREATE INDEX attempts_age ON attempts (scheduled_for);

ALTER TABLE dead_letters RENAME TO dead_letters_old;
DROP INDEX dead_letters_tenant;
CREATE TABLE dead_letters (
    execution_id  TEXT PRIMARY KEY,
    job_id        TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    attempts      INTEGER NOT NULL,
    last_error    TEXT,
    created_at    INTEGER NOT NULL,
    scheduled_for INTEGER NOT NULL                  -- the run's: retention keeps its day
);
CREATE INDEX dead_letters_tenant ON dead_letters (tenant, execution_id);
INSERT INTO dead_letters (execution_id, job_id, tenant, attempts, last_error, created_at,
                          scheduled_for)
SELECT d.execution_id, d.job_id, d.tenant, d.attempts, d.last_error, d.created_at,
       coalesce(e.scheduled_for, d.created_at)
FROM dead_letters_old d LEFT JOIN executions e ON e.id = d.execution_id;
DROP TABLE dead_letters_old;

DROP TABLE executions;
-- Every run, as the API, the dashboard and the audit read them.
CREATE VIEW executions AS
    SELECT * FROM runs
    UNION ALL
    SELECT * FROM execution_history;
