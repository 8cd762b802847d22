-- Hot runs and execution history (issue 7, "schema for growth"): runs not final yet live in the
-- narrow table runs; final runs move once into execution_history, partitioned by fire time (one
-- partition per UTC day, created ahead by Store.history_maintain, plus a DEFAULT partition);
-- executions becomes a view of both. attempts is partitioned like the history and, like
-- dead_letters, no longer references executions (a view) and carries the run's fire time.

-- The hot state: runs not final yet (scheduled, queued, running), inserted, claimed and deleted.
-- A run that becomes final moves to execution_history in the transaction that ends it.
CREATE TABLE runs (
    id               TEXT COLLATE "C" PRIMARY KEY,
    job_id           TEXT COLLATE "C" NOT NULL REFERENCES jobs (id),
    shard            INTEGER NOT NULL,
    trigger          TEXT NOT NULL,
    scheduled_for    BIGINT NOT NULL,
    due_at           BIGINT NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    priority         INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    fencing_token    BIGINT NOT NULL DEFAULT 0,
    result           TEXT,                           -- JSON
    last_error       TEXT,
    reason           TEXT,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    catchup          BOOLEAN NOT NULL DEFAULT FALSE,
    queued_at        BIGINT,
    UNIQUE (job_id, scheduled_for, trigger)          -- also the look-up of a job's runs
);
-- Pending runs of a shard by due time: dispatch and sweep read ranges of it.
CREATE INDEX runs_dispatch ON runs (shard, status, due_at) WHERE status IN ('scheduled', 'queued');
-- The reaper's range read, and a worker's heartbeat.
CREATE INDEX runs_lease_expiry ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_lease_owner ON runs (lease_owner) WHERE status = 'running';

-- Final runs (succeeded, failed, cancelled, skipped), written once, partitioned by fire time into
-- one partition per UTC day (execution_history_pYYYYMMDD, created ahead by
-- Store.history_maintain and dropped by retention); the DEFAULT partition takes what falls on a
-- day without one, so an insert never fails. A fire time's record is one partition probe.
CREATE TABLE execution_history (
    id               TEXT COLLATE "C" NOT NULL,
    job_id           TEXT COLLATE "C" NOT NULL,
    shard            INTEGER NOT NULL,
    trigger          TEXT NOT NULL,
    scheduled_for    BIGINT NOT NULL,
    due_at           BIGINT NOT NULL,
    status           TEXT NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    priority         INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    fencing_token    BIGINT NOT NULL DEFAULT 0,
    result           TEXT,
    last_error       TEXT,
    reason           TEXT,
    created_at       BIGINT NOT NULL,
    started_at       BIGINT,
    finished_at      BIGINT,
    catchup          BOOLEAN NOT NULL DEFAULT FALSE,
    queued_at        BIGINT,
    PRIMARY KEY (id, scheduled_for)
) PARTITION BY RANGE (scheduled_for);
CREATE INDEX execution_history_fire ON execution_history (job_id, scheduled_for, trigger);
-- Covering: the dashboard's last hour of finished runs, read from the index alone.
CREATE INDEX execution_history_finished
    ON execution_history (finished_at, status, started_at, due_at, job_id);
CREATE TABLE execution_history_default PARTITION OF execution_history DEFAULT;

INSERT INTO runs
SELECT * FROM executions WHERE status IN ('scheduled', 'queued', 'running');
INSERT INTO execution_history
SELECT * FROM executions WHERE status NOT IN ('scheduled', 'queued', 'running');

ALTER TABLE attempts RENAME TO attempts_old;
ALTER INDEX attempts_pkey RENAME TO attempts_old_pkey;
-- Partitioned like execution_history (same day bounds), so retention drops a day's attempts with
-- its runs.
CREATE TABLE attempts (
    execution_id  TEXT COLLATE "C" NOT NULL,
    scheduled_for BIGINT NOT NULL,                  -- the run's, the partition key
    attempt       INTEGER NOT NULL,
    worker        TEXT NOT NULL,
    fencing_token BIGINT NOT NULL,
    started_at    BIGINT NOT NULL,
    finished_at   BIGINT,
    outcome       TEXT NOT NULL,
    error         TEXT,
    PRIMARY KEY (execution_id, scheduled_for, fencing_token)
) PARTITION BY RANGE (scheduled_for);
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;

INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token, started_at,
                      finished_at, outcome, error)
SELECT a.execution_id, e.scheduled_for, a.attempt, a.worker, a.fencing_token, a.started_at,
       a.finished_at, a.outcome, a.error
FROM attempts_old a JOIN executions e ON e.id = a.execution_id;
DROP TABLE attempts_old;

ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_execution_id_fkey;
ALTER TABLE dead_letters ADD COLUMN scheduled_for BIGINT;
UPDATE dead_letters d SET scheduled_for = e.scheduled_for FROM executions e WHERE e.id = d.execution_id;
UPDATE dead_letters SET scheduled_for = created_at WHERE scheduled_for IS NULL;
ALTER TABLE dead_letters ALTER COLUMN scheduled_for SET NOT NULL;

DROP TABLE executions;
-- Every run, as the API, the dashboard and the audit read them.
CREATE VIEW executions AS
    SELECT * FROM runs
    UNION ALL
    SELECT * FROM execution_history;
