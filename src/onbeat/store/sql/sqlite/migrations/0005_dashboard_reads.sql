-- What the web dashboard reads, each as an index range rather than a scan: job lists by tenant and
-- status or task (in id order, for keyset pages), dead letters by tenant, the last hour's
-- finished runs, and the secret that signs dashboard sessions.

CREATE INDEX jobs_tenant_status ON jobs (tenant, status, id);
CREATE INDEX jobs_tenant_task ON jobs (tenant, task, id);
CREATE INDEX dead_letters_tenant ON dead_letters (tenant, execution_id);
-- Partial: a run gets its entry when it ends, so planning and claiming runs pay nothing for it;
-- covering: the last hour's figures are read from the index alone.
CREATE INDEX executions_finished ON executions (finished_at, status, started_at, due_at, job_id)
    WHERE finished_at IS NOT NULL;

CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
