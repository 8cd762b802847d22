-- onbeat's whole SQLite schema as its migrations leave it, in one place to read.
-- tests/contract/test_schema.py checks that a store migrated from empty has exactly this schema.
-- Times are INTEGER microseconds since the Unix epoch, UTC.

CREATE TABLE jobs (
    id                  TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    task                TEXT NOT NULL,
    params              TEXT NOT NULL,               -- JSON object
    schedule_kind       TEXT NOT NULL,               -- now | once | cron
    schedule_expression TEXT,
    schedule_at         INTEGER,
    timezone            TEXT NOT NULL,
    max_attempts        INTEGER NOT NULL,
    backoff_base        REAL NOT NULL,
    backoff_cap         REAL NOT NULL,
    timeout             REAL,
    overlap             TEXT NOT NULL,
    misfire             TEXT NOT NULL,
    catchup_window      REAL NOT NULL,
    priority            INTEGER NOT NULL,
    jitter              REAL NOT NULL,
    status              TEXT NOT NULL,
    next_fire_at        INTEGER,
    shard               INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
);
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
CREATE INDEX jobs_tenant_status ON jobs (tenant, status, id);
CREATE INDEX jobs_tenant_task ON jobs (tenant, task, id);
CREATE INDEX jobs_shard_active ON jobs (shard, id) WHERE status = 'active' AND schedule_kind = 'cron';

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
CREATE INDEX runs_dispatch ON runs (shard, status, due_at, id);
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

-- Every run, as the API, the dashboard and the audit read them.
CREATE VIEW executions AS
    SELECT * FROM runs
    UNION ALL
    SELECT * FROM execution_history;

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
CREATE INDEX attempts_age ON attempts (scheduled_for);

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

CREATE TABLE shard_leases (
    shard            INTEGER PRIMARY KEY,
    owner            TEXT,
    lease_expires_at INTEGER NOT NULL DEFAULT 0,
    epoch            INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE schedulers (
    owner     TEXT PRIMARY KEY,
    last_seen INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    key_hash   TEXT NOT NULL UNIQUE,                -- sha256 hex of the whole key
    tenant     TEXT NOT NULL,
    role       TEXT NOT NULL,                       -- admin | writer | reader
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);

CREATE TABLE job_events (
    job_id              TEXT NOT NULL REFERENCES jobs (id),
    at                  INTEGER NOT NULL,
    kind                TEXT NOT NULL,              -- created | paused | resumed | rescheduled | cancelled
    schedule_kind       TEXT NOT NULL,              -- the schedule in force from this event on
    schedule_expression TEXT,
    schedule_at         INTEGER,
    timezone            TEXT NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, at);

CREATE TABLE idempotency_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,                      -- sha256 of the submission, to refuse key reuse
    job_id      TEXT NOT NULL REFERENCES jobs (id),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

-- The tasks workers run, with their default policies (the last worker to publish a task wins).
CREATE TABLE tasks (
    name         TEXT PRIMARY KEY,
    max_attempts INTEGER NOT NULL,
    backoff_base REAL NOT NULL,
    backoff_cap  REAL NOT NULL,
    timeout      REAL,
    is_async     INTEGER NOT NULL,
    worker       TEXT NOT NULL,                     -- the last worker to publish it
    seen_at      INTEGER NOT NULL
) WITHOUT ROWID;

-- The alert outbox (see migrations/*_alert_outbox.sql): written with the dead letter or skip it
-- reports, deleted once a scheduler delivered it to the webhook.
CREATE TABLE alerts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL,                   -- dead_letter | skipped
    job_id          TEXT NOT NULL,
    payload         TEXT NOT NULL,                   -- JSON
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,                -- also the hold of the sender delivering it
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT
);
CREATE INDEX alerts_due ON alerts (next_attempt_at, id);

-- Fleet limits: per-tenant overrides (NULL: the fleet's default), and the counters a claim
-- decides on: runs in flight and the starts/s limit's theoretical arrival time (µs), one row per
-- tenant and one for the fleet (tenant '').
CREATE TABLE tenant_limits (
    tenant                TEXT PRIMARY KEY,
    max_in_flight         INTEGER,
    max_starts_per_second REAL,
    updated_at            INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE tenant_usage (
    tenant  TEXT PRIMARY KEY,
    running INTEGER NOT NULL,
    tat     INTEGER
) WITHOUT ROWID;
