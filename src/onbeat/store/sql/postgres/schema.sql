-- onbeat's whole PostgreSQL schema as its migrations leave it, in one place to read.
-- tests/contract/test_schema.py checks that a store migrated from empty has exactly this schema.
-- Times are BIGINT microseconds since the Unix epoch, UTC. Keys that
-- pages are read by (ids, tenants, task names) are COLLATE "C": they sort by code point, as in
-- SQLite and in Python, whatever the database's locale.

CREATE TABLE jobs (
    id                  TEXT COLLATE "C" PRIMARY KEY,
    tenant              TEXT COLLATE "C" NOT NULL,
    task                TEXT COLLATE "C" NOT NULL,
    params              TEXT NOT NULL,               -- JSON object, as submitted
    schedule_kind       TEXT NOT NULL,               -- now | once | cron
    schedule_expression TEXT,
    schedule_at         BIGINT,
    timezone            TEXT NOT NULL,
    max_attempts        INTEGER NOT NULL,
    backoff_base        DOUBLE PRECISION NOT NULL,
    backoff_cap         DOUBLE PRECISION NOT NULL,
    timeout             DOUBLE PRECISION,
    overlap             TEXT NOT NULL,
    misfire             TEXT NOT NULL,
    catchup_window      DOUBLE PRECISION NOT NULL,
    priority            INTEGER NOT NULL,
    jitter              DOUBLE PRECISION NOT NULL,
    status              TEXT NOT NULL,
    next_fire_at        BIGINT,
    shard               INTEGER NOT NULL,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
) WITH (fillfactor = 70);  -- room in each page: a fire's update of next_fire_at can be HOT
CREATE INDEX jobs_tenant_id ON jobs (tenant, id);
CREATE INDEX jobs_tenant_status ON jobs (tenant, status, id);
CREATE INDEX jobs_tenant_task ON jobs (tenant, task, id);
-- The reconciler's page of a shard's active cron jobs.
CREATE INDEX jobs_shard_active ON jobs (shard, id) WHERE status = 'active' AND schedule_kind = 'cron';

-- The hot state: runs not final yet (scheduled, queued, running), inserted, claimed and deleted.
-- A run that becomes final moves to execution_history in the transaction that ends it.
CREATE TABLE runs (
    id               TEXT COLLATE "C" PRIMARY KEY,
    job_id           TEXT COLLATE "C" NOT NULL,       -- a job of jobs (no foreign key: migration 0010)
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
-- Pending runs of a shard by due time: dispatch and sweep read ranges of it (a sweep page in
-- (shard, due_at, id) order, so that it ends at its last run).
CREATE INDEX runs_dispatch ON runs (shard, status, due_at, id) WHERE status IN ('scheduled', 'queued');
-- The reaper's range read, and a worker's heartbeat.
CREATE INDEX runs_lease_expiry ON runs (lease_expires_at) WHERE status = 'running';

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

-- Every run, as the API, the dashboard and the audit read them.
CREATE VIEW executions AS
    SELECT * FROM runs
    UNION ALL
    SELECT * FROM execution_history;

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
-- An attempt is written once, when it ends: a running attempt is its run's row.
CREATE TABLE attempts_default PARTITION OF attempts DEFAULT;

CREATE TABLE dead_letters (
    execution_id  TEXT COLLATE "C" PRIMARY KEY,
    job_id        TEXT NOT NULL,
    tenant        TEXT COLLATE "C" NOT NULL,
    attempts      INTEGER NOT NULL,
    last_error    TEXT,
    created_at    BIGINT NOT NULL,
    scheduled_for BIGINT NOT NULL                   -- the run's: retention keeps its day
);
CREATE INDEX dead_letters_tenant ON dead_letters (tenant, execution_id);

CREATE TABLE shard_leases (
    shard            INTEGER PRIMARY KEY,
    owner            TEXT,
    lease_expires_at BIGINT NOT NULL DEFAULT 0,
    epoch            BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE schedulers (
    owner     TEXT PRIMARY KEY,
    last_seen BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id         TEXT COLLATE "C" PRIMARY KEY,
    key_hash   TEXT NOT NULL UNIQUE,                -- sha256 hex of the whole key
    tenant     TEXT NOT NULL,
    role       TEXT NOT NULL,                       -- admin | writer | reader
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE job_events (
    seq                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id              TEXT NOT NULL,              -- a job of jobs (no foreign key: migration 0010)
    at                  BIGINT NOT NULL,
    kind                TEXT NOT NULL,              -- created | paused | resumed | rescheduled | cancelled
    schedule_kind       TEXT NOT NULL,              -- the schedule in force from this event on
    schedule_expression TEXT,
    schedule_at         BIGINT,
    timezone            TEXT NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, at);

CREATE TABLE idempotency_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,                      -- sha256 of the submission, to refuse key reuse
    job_id      TEXT NOT NULL REFERENCES jobs (id),
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- The tasks workers run, with their default policies (the last worker to publish a task wins).
CREATE TABLE tasks (
    name         TEXT COLLATE "C" PRIMARY KEY,
    max_attempts INTEGER NOT NULL,
    backoff_base DOUBLE PRECISION NOT NULL,
    backoff_cap  DOUBLE PRECISION NOT NULL,
    timeout      DOUBLE PRECISION,
    is_async     BOOLEAN NOT NULL,
    worker       TEXT NOT NULL,                     -- the last worker to publish it
    seen_at      BIGINT NOT NULL
);

-- The alert outbox (see migrations/*_alert_outbox.sql): written with the dead letter or skip it
-- reports, deleted once a scheduler delivered it to the webhook.
CREATE TABLE alerts (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            TEXT NOT NULL,                   -- dead_letter | skipped
    job_id          TEXT NOT NULL,
    payload         TEXT NOT NULL,                   -- JSON
    created_at      BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,                 -- also the hold of the sender delivering it
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT
);
CREATE INDEX alerts_due ON alerts (next_attempt_at, id);

-- Fleet limits: per-tenant overrides (NULL: the fleet's default), and the counters a claim
-- decides on: runs in flight and the starts/s limit's theoretical arrival time (µs), one row per
-- tenant and one for the fleet (tenant ''). Locked in that order: '' first, then by name.
CREATE TABLE tenant_limits (
    tenant                TEXT COLLATE "C" PRIMARY KEY,
    max_in_flight         INTEGER,
    max_starts_per_second DOUBLE PRECISION,
    updated_at            BIGINT NOT NULL
);

-- Each tenant's counters are spread over stripes (0-15): a transaction that decides no limit
-- adds its change to one stripe, so claims and finishes do not queue on one row; a claim under a
-- limit locks every stripe of what it reads and sums them. tat lives on stripe 0.
CREATE TABLE tenant_usage (
    tenant  TEXT COLLATE "C" NOT NULL,
    running BIGINT NOT NULL,
    tat     BIGINT,
    stripe  SMALLINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, stripe)
);
