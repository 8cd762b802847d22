-- Idempotency-Key of a job submission: a retried submission returns the first job. Kept for a day.

CREATE TABLE idempotency_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,                      -- sha256 of the submission, to refuse key reuse
    job_id      TEXT NOT NULL REFERENCES jobs (id),
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
