-- API keys (only a hash of the secret is kept) and the history of a job's schedule and status,
-- which the audit replays to know which fire times were expected.

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
