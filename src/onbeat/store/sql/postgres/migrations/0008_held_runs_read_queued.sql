-- Every run, as the API, the dashboard and the audit read them. A run a worker claimed ahead of
-- its due time and has not started yet (running, no start: Store.execution_claim's ahead) reads
-- as queued, which is what it is to whoever looks: waiting for its time, held by that worker.
CREATE OR REPLACE VIEW executions AS
    SELECT id, job_id, shard, trigger, scheduled_for, due_at,
           CASE WHEN status = 'running' AND started_at IS NULL THEN 'queued' ELSE status END AS status,
           attempt, priority, lease_owner, lease_expires_at, fencing_token, result, last_error,
           reason, created_at, started_at, finished_at, catchup, queued_at
    FROM runs
    UNION ALL
    SELECT * FROM execution_history;
