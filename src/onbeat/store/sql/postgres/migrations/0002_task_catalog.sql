-- The tasks workers run, with their default policies, so that a process without the user's code
-- (`onbeat api`) can validate a job's task and fill in its defaults. One row per task name: the
-- last worker to publish a task writes its defaults and stamps seen_at.

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
