-- The claim and finish statements of src/onbeat/store/sql/postgres/queries.sql in two other
-- shapes, for bench/store_drivers.py (never used by onbeat itself). Same `-- name:` format and
-- `:name` parameters; a name here replaces the statement of that name in queries.sql.
--
-- Shape "arrays": lists of ids travel as native text[] parameters (= ANY) instead of one JSON
-- text parameter unpacked with jsonb_array_elements_text(); per-run statements stay executemany.
-- Shape "unnest": as "arrays", and every per-run statement becomes ONE statement over parallel
-- arrays (unnest), so a batch of 256 runs is one row set for the server, not 256 executions.

-- name: jobs_lock_of_runs
SELECT id FROM jobs
WHERE id IN (SELECT job_id FROM executions WHERE id = ANY(CAST(:ids AS text[])))
ORDER BY id
FOR UPDATE;

-- name: execution_claim_candidates
SELECT e.*, j.task, j.params, j.timeout, j.max_attempts, j.backoff_base, j.backoff_cap,
       j.overlap, j.misfire, j.catchup_window, j.schedule_kind, j.status AS job_status
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.id = ANY(CAST(:ids AS text[]))
FOR UPDATE OF e;

-- name: execution_running_of_jobs
SELECT id, job_id, started_at FROM executions
WHERE status = 'running' AND job_id = ANY(CAST(:job_ids AS text[]));

-- name: execution_start_many
UPDATE executions
SET status = 'running', attempt = attempt + 1, fencing_token = fencing_token + 1,
    lease_owner = :owner, lease_expires_at = :lease_expires_at, started_at = :now, reason = NULL
WHERE id = ANY(CAST(:ids AS text[])) AND status = 'queued'
RETURNING *;

-- name: execution_current_tokens
SELECT e.id, e.job_id, e.trigger, e.fencing_token, e.status, e.attempt, e.lease_owner,
       j.status AS job_status, j.tenant
FROM executions e JOIN jobs j ON j.id = e.job_id
WHERE e.id = ANY(CAST(:ids AS text[]))
ORDER BY e.id
FOR UPDATE OF e;

-- name: job_complete_one_shot
UPDATE jobs SET status = 'completed', updated_at = :now
WHERE id = ANY(CAST(:ids AS text[])) AND schedule_kind != 'cron' AND status = 'active';

-- name: executions_wake_waiting
UPDATE executions SET due_at = :now
WHERE job_id = ANY(CAST(:job_ids AS text[]))
  AND status = 'scheduled' AND reason LIKE 'waiting for %' AND due_at > :now;

-- name: attempt_insert_unnest
INSERT INTO attempts (execution_id, attempt, worker, fencing_token, started_at, outcome)
SELECT a.id, a.attempt, :owner, a.fencing_token, :now, 'running'
FROM unnest(CAST(:ids AS text[]), CAST(:attempts AS int[]), CAST(:fencing_tokens AS bigint[]))
     AS a(id, attempt, fencing_token);

-- name: execution_finish_unnest
UPDATE executions AS e
SET status = d.status, due_at = coalesce(d.due_at, e.due_at), result = d.result,
    last_error = d.error, reason = d.reason, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN d.status IN ('scheduled', 'queued') THEN NULL ELSE :now END,
    attempt = e.attempt - d.uncount_attempt
FROM unnest(CAST(:ids AS text[]), CAST(:fencing_tokens AS bigint[]), CAST(:statuses AS text[]),
            CAST(:due_ats AS bigint[]), CAST(:results AS text[]), CAST(:errors AS text[]),
            CAST(:reasons AS text[]), CAST(:uncount_attempts AS int[]))
     AS d(id, fencing_token, status, due_at, result, error, reason, uncount_attempt)
WHERE e.id = d.id AND e.fencing_token = d.fencing_token AND e.status = 'running';

-- name: attempt_finish_unnest
UPDATE attempts AS a
SET finished_at = :now, outcome = d.outcome, error = d.error
FROM unnest(CAST(:ids AS text[]), CAST(:fencing_tokens AS bigint[]), CAST(:outcomes AS text[]),
            CAST(:errors AS text[]))
     AS d(id, fencing_token, outcome, error)
WHERE a.execution_id = d.id AND a.fencing_token = d.fencing_token;
