-- onbeat schema v1 for SQLite. Times are INTEGER microseconds since the Unix epoch, UTC.

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

CREATE TABLE executions (
    id               TEXT PRIMARY KEY,
    job_id           TEXT NOT NULL REFERENCES jobs (id),
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
    result           TEXT,                           -- JSON
    last_error       TEXT,
    reason           TEXT,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    UNIQUE (job_id, scheduled_for, trigger)
);
-- The scheduler's range reads: pending executions of a shard by due time.
CREATE INDEX executions_dispatch ON executions (shard, status, due_at);
-- The reaper's range read, and a worker's heartbeat.
CREATE INDEX executions_lease_expiry ON executions (lease_expires_at) WHERE status = 'running';
CREATE INDEX executions_lease_owner ON executions (lease_owner) WHERE status = 'running';
CREATE INDEX executions_job ON executions (job_id, status);

CREATE TABLE attempts (
    execution_id  TEXT NOT NULL REFERENCES executions (id),
    attempt       INTEGER NOT NULL,
    worker        TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    outcome       TEXT NOT NULL,
    error         TEXT,
    PRIMARY KEY (execution_id, fencing_token)
);

CREATE TABLE dead_letters (
    execution_id TEXT PRIMARY KEY REFERENCES executions (id),
    job_id       TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    created_at   INTEGER NOT NULL
);

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
