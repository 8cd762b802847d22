-- The tasks workers run, with their default policies, so that a process without the user's code
-- (`onbeat api`) can validate a job's task and fill in its defaults. One row per task name: every
-- worker publishes its tasks on start and periodically, and the last one to publish a task writes
-- its defaults and stamps seen_at, so seen_at is when a worker that has the task was last alive.

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
