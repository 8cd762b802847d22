-- The alert outbox: a dead letter or a skipped fire time writes its alert in the same transaction
-- that records it, so no restart loses one; schedulers deliver them to the webhook and delete
-- them once delivered (or given up). A row is never updated on the hot path.

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
