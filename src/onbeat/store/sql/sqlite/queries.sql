-- SQLite statements of SQLiteStore, by name. Times are integer microseconds (UTC).
-- Lists of ids travel as one JSON array parameter, read with json_each().

-- name: job_insert
INSERT INTO jobs (id, tenant, task, params, schedule_kind, schedule_expression, schedule_at,
                  timezone, max_attempts, backoff_base, backoff_cap, timeout, overlap, misfire,
                  catchup_window, priority, jitter, status, next_fire_at, shard, created_at,
                  updated_at)
VALUES (:id, :tenant, :task, :params, :schedule_kind, :schedule_expression, :schedule_at,
        :timezone, :max_attempts, :backoff_base, :backoff_cap, :timeout, :overlap, :misfire,
        :catchup_window, :priority, :jitter, :status, :next_fire_at, :shard, :now, :now);

-- name: job_get
SELECT * FROM jobs WHERE id = :id;

-- name: job_list
-- Keyset page in id (creation) order; a NULL filter matches everything.
SELECT * FROM jobs
WHERE (:tenant IS NULL OR tenant = :tenant)
  AND (:status IS NULL OR status = :status)
  AND (:task IS NULL OR task = :task)
  AND id > :after_id
ORDER BY id
LIMIT :limit;

-- name: job_update
UPDATE jobs
SET params = :params, schedule_kind = :schedule_kind, schedule_expression = :schedule_expression,
    schedule_at = :schedule_at, timezone = :timezone, max_attempts = :max_attempts,
    backoff_base = :backoff_base, backoff_cap = :backoff_cap, timeout = :timeout,
    overlap = :overlap, misfire = :misfire, priority = :priority, jitter = :jitter,
    status = :status, next_fire_at = :next_fire_at, updated_at = :now
WHERE id = :id;

-- name: job_set_status
UPDATE jobs SET status = :status, updated_at = :now WHERE id = :id;

-- name: execution_due_now
-- A pending run that waited on purpose (a pause) is due now, not a misfire.
UPDATE runs SET due_at = :now WHERE id = :id AND due_at < :now;

-- name: job_set_next_fire
UPDATE jobs SET next_fire_at = :next_fire_at, updated_at = :now WHERE id = :id;

-- name: job_complete_one_shot
-- A now/once job is done when its scheduled run reached a final state.
UPDATE jobs SET status = 'completed', updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND schedule_kind != 'cron' AND status = 'active';

-- name: execution_insert
-- Idempotent on (job_id, scheduled_for, trigger): two schedulers planning the same fire insert one row.
INSERT INTO runs (id, job_id, shard, trigger, scheduled_for, due_at, status, priority, reason,
                   catchup, created_at, queued_at, finished_at)
SELECT :id, :job_id, :shard, :trigger, :scheduled_for, :due_at, :status, :priority,
       :reason, :catchup, :now, CASE WHEN :status = 'queued' THEN :now END,
       CASE WHEN :status IN ('skipped', 'cancelled') THEN :now END
WHERE NOT EXISTS (SELECT 1 FROM execution_history h
                  WHERE h.job_id = :job_id AND h.scheduled_for = :scheduled_for
                    AND h.trigger = :trigger)
ON CONFLICT (job_id, scheduled_for, trigger) DO NOTHING;

-- name: executions_existing
SELECT id FROM runs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: execution_get
SELECT * FROM executions WHERE id = :id;

-- name: execution_list
-- A run held ahead (running, not started) is filtered as it reads: queued (rows.execution_of).
SELECT * FROM executions
WHERE job_id = :job_id
  AND (:status IS NULL
       OR CASE WHEN status = 'running' AND started_at IS NULL THEN 'queued' ELSE status END
          = :status)
  AND (:before_scheduled_for IS NULL OR (scheduled_for, id) < (:before_scheduled_for, :before_id))
ORDER BY scheduled_for DESC, id DESC
LIMIT :limit;

-- name: attempts_of
SELECT * FROM attempts WHERE execution_id IN (SELECT value FROM json_each(:ids))
ORDER BY started_at, fencing_token;

-- name: executions_cancel_pending
-- Tombstone a cancelled job's runs that have not started.
UPDATE runs
SET status = 'cancelled', reason = :reason, finished_at = :now, fencing_token = fencing_token + 1
WHERE job_id = :job_id AND status IN ('scheduled', 'queued')
RETURNING id;

-- name: executions_drop_future
-- A schedule edit: the old schedule's fire times after now were never due, so their planned runs
-- go (a tombstone would hold the fire time's unique key against the new schedule). Runs that were
-- ever claimed (fencing_token > 0) or are retries keep their history.
DELETE FROM runs
WHERE job_id = :job_id AND trigger = 'schedule' AND status IN ('scheduled', 'queued')
  AND scheduled_for > :after AND attempt = 0 AND fencing_token = 0;

-- name: jobs_cron_page
-- The reconciler's page: the next :limit active cron jobs of the held shards after (:after_shard,
-- :after_id), a range read of jobs_shard_active, each with whether it has a planned (scheduled)
-- run at its next fire time (a job without one is a suspect, judged again by jobs_next_run_state).
WITH page AS (
    SELECT j.id, j.shard, j.next_fire_at FROM jobs j
    WHERE j.shard IN (SELECT value FROM json_each(:shards))
      AND j.status = 'active' AND j.schedule_kind = 'cron'
      AND (j.shard, j.id) > (:after_shard, :after_id)
    ORDER BY j.shard, j.id
    LIMIT :limit
)
SELECT p.id, p.shard,
       EXISTS (SELECT 1 FROM runs e
               WHERE e.job_id = p.id AND e.trigger = 'schedule'
                 AND e.scheduled_for = p.next_fire_at AND e.status = 'scheduled') AS has_next_run
FROM page p
ORDER BY p.shard, p.id;

-- name: jobs_lock_active_cron
-- The reconciler's suspects, if still active cron jobs (the write transaction is the lock).
SELECT j.id FROM jobs j
WHERE j.id IN (SELECT value FROM json_each(:ids))
  AND j.status = 'active' AND j.schedule_kind = 'cron';

-- name: jobs_next_run_state
-- The jobs of a page, each with whether it has a planned (scheduled) run at its next fire time:
-- without one, nothing would ever plan its next run.
SELECT j.*,
       EXISTS (SELECT 1 FROM runs e
               WHERE e.job_id = j.id AND e.trigger = 'schedule'
                 AND e.scheduled_for = j.next_fire_at AND e.status = 'scheduled') AS has_next_run,
       CASE WHEN j.next_fire_at IS NULL THEN
           (SELECT max(e.scheduled_for) FROM executions e
            WHERE e.job_id = j.id AND e.trigger = 'schedule') END AS latest_fire
FROM jobs j
WHERE j.id IN (SELECT value FROM json_each(:ids))
ORDER BY j.shard, j.id;

-- name: execution_schedule_run_at
SELECT id, status FROM executions
WHERE job_id = :job_id AND scheduled_for = :scheduled_for AND trigger = 'schedule';

-- name: executions_pending_of_job
SELECT * FROM runs WHERE job_id = :job_id AND status IN ('scheduled', 'queued');

-- name: execution_dispatch_candidates
-- Pending runs of active jobs due within the window, in the held shards: a range read on
-- runs_dispatch per shard, in index order. No global ORDER BY: it would read and sort every
-- due row before the LIMIT, under the write lock; the caller loops until a short batch anyway.
SELECT e.id, e.job_id, e.trigger, e.status, e.scheduled_for, e.due_at, e.attempt, e.shard,
       j.priority, j.next_fire_at, j.schedule_kind, j.schedule_expression, j.schedule_at,
       j.timezone, j.misfire, j.catchup_window, j.jitter,
       -- Read only where plan_dispatch uses it (a cron run's first dispatch): a burst of
       -- one-shot runs must not probe the history's every day partition per run.
       CASE WHEN j.schedule_kind = 'cron' AND e.attempt = 0 AND e.trigger = 'schedule' THEN
         (SELECT min(n.scheduled_for) FROM executions n
          WHERE n.job_id = e.job_id AND n.trigger = 'schedule' AND n.scheduled_for > e.scheduled_for)
       END AS next_recorded
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard IN (SELECT value FROM json_each(:shards))
  AND e.status = 'scheduled'
  AND e.due_at <= :horizon
  AND j.status IN ('active', 'completed')
LIMIT :limit;

-- name: execution_mark_queued
UPDATE runs SET status = 'queued', queued_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'scheduled';

-- name: execution_mark_catchup
-- Runs the misfire policy chose to run although their fire time was missed.
UPDATE runs SET catchup = 1 WHERE id IN (SELECT value FROM json_each(:ids));

-- name: execution_end_pending
-- A run that will not start: skipped (policy) or cancelled, always with a reason.
UPDATE runs SET status = :status, reason = :reason, finished_at = :now
WHERE id = :id AND status IN ('scheduled', 'queued');

-- name: execution_sweep
-- One shard's queued runs due before :before, after the (:after_due_at, :after_id) position: a
-- range read on runs_dispatch (only runs sharing one due_at are sorted, by id).
SELECT e.id, e.shard, e.due_at, j.priority
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard = :shard AND e.status = 'queued' AND e.due_at < :before
  AND (e.due_at, e.id) > (:after_due_at, :after_id)
ORDER BY e.due_at, e.id
LIMIT :limit;

-- name: execution_expired_leases
-- Running runs whose lease expired, in every shard, longest expired first: a range read on
-- runs_lease_expiry.
SELECT e.id, e.job_id, e.attempt, e.fencing_token, e.started_at, e.lease_owner,
       j.max_attempts, j.backoff_base, j.backoff_cap, j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.lease_expires_at < :now
ORDER BY e.lease_expires_at
LIMIT :limit;

-- name: execution_reap
-- Apply reap decisions (JSON objects: id, fencing_token, status, due_at, error, reason), each only
-- while its run is still running under that token with its lease expired: a heartbeat or an
-- outcome that committed since the decision wins, and no run is reaped twice.
UPDATE runs AS e
SET status = json_extract(d.value, '$.status'),
    due_at = coalesce(json_extract(d.value, '$.due_at'), e.due_at),
    last_error = coalesce(json_extract(d.value, '$.error'), e.last_error),
    reason = json_extract(d.value, '$.reason'),
    lease_owner = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN json_extract(d.value, '$.status') = 'queued' THEN NULL ELSE :now END
FROM json_each(:decisions) AS d
WHERE e.id = json_extract(d.value, '$.id')
  AND e.fencing_token = json_extract(d.value, '$.fencing_token')
  AND e.status = 'running' AND e.lease_expires_at < :now
RETURNING *;

-- name: execution_claim_candidates
SELECT e.*, j.task, j.params, j.timeout, j.max_attempts, j.backoff_base, j.backoff_cap,
       j.overlap, j.misfire, j.catchup_window, j.schedule_kind, j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.id IN (SELECT value FROM json_each(:ids));

-- name: execution_earliest_due_of_jobs
-- Per job, its earliest fire time with a pending run that is due: a later run of a backlog waits
-- for it, so a backlog runs in fire-time order whatever order the queue hands its runs out in.
SELECT job_id, id, min(scheduled_for) AS scheduled_for FROM runs
WHERE job_id IN (SELECT value FROM json_each(:job_ids)) AND status IN ('scheduled', 'queued')
  AND due_at <= :now
GROUP BY job_id;

-- name: execution_running_of_jobs
SELECT id, job_id, fencing_token, coalesce(started_at, due_at) AS started_at FROM runs
WHERE status = 'running' AND job_id IN (SELECT value FROM json_each(:job_ids));

-- name: execution_newest_missed_of_jobs
-- Per job, its newest recorded fire time older than the grace line: a run_once misfire runs
-- only if it is that one.
SELECT job_id, max(scheduled_for) AS newest FROM executions
WHERE job_id IN (SELECT value FROM json_each(:job_ids)) AND trigger = 'schedule'
  AND scheduled_for < :grace_line
GROUP BY job_id;

-- name: execution_start_many
-- The runs' attempts are not written yet: a running attempt is its run's row, written once when
-- it ends (attempt_end).
UPDATE runs
SET status = 'running', attempt = attempt + 1, fencing_token = fencing_token + 1,
    lease_owner = :owner, lease_expires_at = :lease_expires_at, started_at = :now, reason = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'queued'
RETURNING *;

-- name: execution_claim_ahead_many
-- Claim runs ahead of their due time (plan.plan_claim's start_ahead): running under the lease,
-- but not started: no started_at, no attempt, the fencing token unchanged until the worker
-- confirms the run at its due time (execution_confirm_many); leased until :grace after it.
UPDATE runs
SET status = 'running', lease_owner = :owner, lease_expires_at = due_at + :grace,
    started_at = NULL, reason = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'queued'
RETURNING *;

-- name: execution_confirm_many
-- Start the runs a worker claimed ahead, at their due time: each only if still claimed ahead by
-- it under that token and its job is active, so a cancel, pause or edit committed before wins.
UPDATE runs SET started_at = :now, attempt = attempt + 1, fencing_token = fencing_token + 1,
    lease_expires_at = :lease_expires_at
WHERE (id, fencing_token) IN (SELECT key, value FROM json_each(:held))
  AND +lease_owner = :owner AND status = 'running' AND started_at IS NULL
  AND (SELECT j.status FROM jobs AS j WHERE j.id = runs.job_id) = 'active'
RETURNING id, scheduled_for, fencing_token, attempt, started_at;

-- name: executions_requeue
-- Runs the queue handed to a worker that will not claim them: scheduled again, for the dispatch.
UPDATE runs SET status = 'scheduled'
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'queued'
RETURNING id;

-- name: executions_unclaim
-- Runs claimed ahead that will not start here (their worker releases them): scheduled again at
-- their due time, for the dispatch to queue.
UPDATE runs SET status = 'scheduled', lease_owner = NULL, lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running' AND started_at IS NULL
RETURNING id;

-- name: executions_unclaim_of_job
-- A job's runs claimed ahead and not started, before an edit or a cancel decides on its pending
-- runs: they are pending again, so the edit or cancel treats them as it treats any.
UPDATE runs SET status = 'scheduled', lease_owner = NULL, lease_expires_at = NULL
WHERE job_id = :job_id AND status = 'running' AND started_at IS NULL
RETURNING id;

-- name: attempt_end
-- An attempt's one write, as it ends, from its run's row (before the run moves on; :worker when
-- the row no longer names it: a reap). An attempt a version before this one recorded at its
-- start is updated instead.
INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token, started_at,
                      finished_at, outcome, error)
SELECT id, scheduled_for, attempt, coalesce(:worker, lease_owner), fencing_token, started_at,
       :now, :outcome, :error
FROM runs
WHERE id = :id AND fencing_token = :fencing_token AND started_at IS NOT NULL
ON CONFLICT (execution_id, fencing_token) DO UPDATE
SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error;

-- name: execution_defer
-- Not started now: held for a paused job, or waiting for a running predecessor (overlap=queue).
UPDATE runs SET status = 'scheduled', due_at = :due_at, reason = :reason
WHERE id = :id AND status = 'queued';

-- name: executions_wake_waiting
-- Runs of these jobs waiting for a running predecessor are due now: one of the jobs' runs ended.
-- 'waiting for ' is plan.WAITING (tests/unit/test_queries.py keeps them equal).
UPDATE runs SET due_at = :now
WHERE job_id IN (SELECT value FROM json_each(:job_ids)) AND status = 'scheduled'
  AND reason LIKE 'waiting for %' AND due_at > :now;

-- name: execution_replace
-- overlap=replace: the running predecessor is cancelled and its token bumped, fencing its writes.
UPDATE runs
SET status = 'cancelled', reason = :reason, finished_at = :now, fencing_token = fencing_token + 1,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = :id AND status = 'running'
RETURNING id, scheduled_for, fencing_token - 1 AS fencing_token;

-- name: execution_heartbeat
-- Only the (id, fencing token) pairs the worker runs: a run it claimed but lost track of is not
-- kept alive, so the reaper frees it. :held is a JSON object {id: token}. The unary + keeps the
-- planner on the primary key (one lookup per pair) rather than scanning the owner's leases.
UPDATE runs SET lease_expires_at = :lease_expires_at
WHERE (id, fencing_token) IN (SELECT key, value FROM json_each(:held))
  AND +lease_owner = :owner AND status = 'running'
RETURNING id, fencing_token;

-- name: execution_current_tokens
SELECT e.id, e.job_id, e.trigger, e.scheduled_for, e.fencing_token, e.status, e.attempt, e.lease_owner,
       e.started_at,
       j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.id IN (SELECT value FROM json_each(:ids));

-- name: execution_finish
-- Every terminal or retry transition of a running execution; the caller checked its token.
UPDATE runs
SET status = :status, due_at = coalesce(:due_at, due_at), result = :result, last_error = :error,
    reason = :reason, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN :status IN ('scheduled', 'queued') THEN NULL ELSE :now END,
    attempt = attempt - :uncount_attempt
WHERE id = :id AND fencing_token = :fencing_token AND status = 'running';

-- name: execution_finish_final
-- A running run's final outcome (the caller checked its token): copied into the history with its
-- final values (execution_finish_final_delete then deletes it), no update of the hot row first.
INSERT INTO execution_history (id, job_id, shard, trigger, scheduled_for, due_at, status, attempt,
                               priority, lease_owner, lease_expires_at, fencing_token, result,
                               last_error, reason, created_at, started_at, finished_at, catchup,
                               queued_at)
SELECT id, job_id, shard, trigger, scheduled_for, due_at, :status, attempt - :uncount_attempt,
       priority, NULL, NULL, fencing_token, :result, :error, :reason, created_at, started_at, :now,
       catchup, queued_at
FROM runs WHERE id = :id AND fencing_token = :fencing_token AND status = 'running';

-- name: execution_finish_final_delete
DELETE FROM runs WHERE id = :id AND fencing_token = :fencing_token AND status = 'running';

-- name: dead_letter_insert
INSERT INTO dead_letters (execution_id, job_id, tenant, attempts, last_error, created_at,
                          scheduled_for)
VALUES (:id, :job_id, :tenant, :attempts, :error, :now, :scheduled_for)
ON CONFLICT (execution_id) DO UPDATE
SET attempts = excluded.attempts, last_error = excluded.last_error, created_at = excluded.created_at;

-- name: dead_letter_list
SELECT d.*, j.task, j.params FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE (:tenant IS NULL OR d.tenant = :tenant) AND d.execution_id > :after_id
ORDER BY d.execution_id
LIMIT :limit;

-- name: dead_letter_delete
DELETE FROM dead_letters WHERE execution_id = :id;

-- name: execution_replay
UPDATE runs
SET status = 'scheduled', due_at = :now, attempt = 0, last_error = NULL, finished_at = NULL,
    reason = 'replayed from the dead-letter table'
WHERE id = :id AND status = 'failed';

-- name: shard_init
INSERT OR IGNORE INTO shard_leases (shard) VALUES (:shard);

-- name: shard_count
SELECT count(*) FROM shard_leases;

-- name: scheduler_live
SELECT owner FROM schedulers ORDER BY owner;

-- name: scheduler_register
INSERT INTO schedulers (owner, last_seen) VALUES (:owner, :now)
ON CONFLICT (owner) DO UPDATE SET last_seen = excluded.last_seen;

-- name: scheduler_forget_dead
DELETE FROM schedulers WHERE last_seen < :dead_before;

-- name: shard_renew
UPDATE shard_leases SET lease_expires_at = :lease_expires_at
WHERE owner = :owner AND lease_expires_at > :now
RETURNING shard, epoch;

-- name: shard_take
-- Free or expired shards, up to :wanted; taking one bumps its epoch, fencing the previous owner.
UPDATE shard_leases
SET owner = :owner, lease_expires_at = :lease_expires_at, epoch = epoch + 1
WHERE shard IN (SELECT shard FROM shard_leases
                WHERE owner IS NULL OR lease_expires_at <= :now
                ORDER BY shard LIMIT :wanted)
RETURNING shard, epoch;

-- name: shard_give_up
UPDATE shard_leases SET owner = NULL, lease_expires_at = 0
WHERE owner = :owner AND shard IN (SELECT value FROM json_each(:shards));

-- name: shard_release
UPDATE shard_leases SET owner = NULL, lease_expires_at = 0 WHERE owner = :owner;

-- name: scheduler_unregister
DELETE FROM schedulers WHERE owner = :owner;

-- name: shard_held
SELECT shard, epoch FROM shard_leases WHERE owner = :owner AND lease_expires_at > :now;

-- name: job_event_insert
INSERT INTO job_events (job_id, at, kind, schedule_kind, schedule_expression, schedule_at, timezone)
SELECT id, :now, :kind, schedule_kind, schedule_expression, schedule_at, timezone
FROM jobs WHERE id = :id;

-- name: job_events
SELECT * FROM job_events WHERE job_id = :job_id ORDER BY at, rowid;

-- name: execution_fire_times
-- Records of the schedule's fire times in a range, for the audit.
SELECT scheduled_for, status FROM executions
WHERE job_id = :job_id AND trigger = 'schedule' AND scheduled_for BETWEEN :since AND :until;

-- name: api_key_insert
INSERT INTO api_keys (id, key_hash, tenant, role, created_at)
VALUES (:id, :key_hash, :tenant, :role, :now);

-- name: api_key_by_hash
SELECT * FROM api_keys WHERE key_hash = :key_hash AND revoked_at IS NULL;

-- name: api_key_list
SELECT * FROM api_keys ORDER BY created_at, id;

-- name: api_key_revoke
UPDATE api_keys SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL;

-- name: api_key_count_active
SELECT count(*) FROM api_keys WHERE revoked_at IS NULL;

-- name: idempotency_keys_get
-- A batch's keys of one tenant, in one statement: :keys is a JSON array of keys.
SELECT key, fingerprint, job_id FROM idempotency_keys
WHERE tenant = :tenant AND key IN (SELECT value FROM json_each(:keys));

-- name: idempotency_keys_insert
-- :keys is a JSON array of {tenant, key, fingerprint, job_id}; returns the keys inserted
-- ("WHERE true": SQLite's parser needs it before ON CONFLICT after a SELECT).
INSERT INTO idempotency_keys (tenant, key, fingerprint, job_id, created_at)
SELECT json_extract(value, '$.tenant'), json_extract(value, '$.key'),
       json_extract(value, '$.fingerprint'), json_extract(value, '$.job_id'), :now
FROM json_each(:keys) WHERE true
ON CONFLICT (tenant, key) DO NOTHING
RETURNING key;

-- name: idempotency_key_prune
DELETE FROM idempotency_keys WHERE created_at < :before;

-- name: write_probe_create
-- The write probe (SQLiteStore.write_refusal): a table made, filled and dropped in one
-- transaction, so it needs fresh pages as a new job does, and leaves nothing behind.
CREATE TABLE onbeat_write_probe (filler BLOB);

-- name: write_probe_fill
INSERT INTO onbeat_write_probe VALUES (zeroblob(:bytes));

-- name: write_probe_drop
DROP TABLE onbeat_write_probe;

-- --- dashboard reads: each an index range (tests/dashboard/test_scale.py checks the plans) -----

-- name: job_tenant_from
-- The first tenant from :from on: walking the tenants costs one index seek each.
SELECT min(tenant) FROM jobs WHERE tenant >= :from;

-- name: job_task_from
-- The first task name of a tenant in [:from, :to).
SELECT min(task) FROM jobs WHERE tenant = :tenant AND task >= :from AND task < :to;

-- name: job_search_ids
-- Ids of one tenant's jobs in one status, in [:id_from, :id_to), in id order.
SELECT id FROM jobs
WHERE tenant = :tenant AND status = :status AND id >= :id_from AND id < :id_to
ORDER BY id
LIMIT :limit;

-- name: job_search_ids_of_task
-- Ids of one tenant's jobs of one task in one status, from :id_from on, in id order.
SELECT id FROM jobs
WHERE tenant = :tenant AND task = :task AND status = :status AND id >= :id_from
ORDER BY id
LIMIT :limit;

-- name: jobs_by_ids
SELECT * FROM jobs WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: execution_activity
-- The last hour (or any [:since, :until)) in buckets of :bucket us, in one pass over three range
-- reads. Runs that ended: per bucket, by status and by the class (decade and leading digit) of
-- their start delay (due -> start; store.base.delay_class, written in SQL). The queue depth as
-- runs joining and leaving it: a run joined when it came due (at :since if it was waiting
-- already) and left when it started; runs that ended, runs running and runs pending in any
-- shard each count once. A tenant's runs are picked by their job id in a list of the tenant's
-- (built once, from an index); "+" keeps the planner reading the time ranges rather than each
-- job's whole history.
SELECT (e.finished_at - :since) / :bucket AS ended, e.status,
       CASE WHEN e.started_at IS NOT NULL THEN
           9 * (length(max(e.started_at - e.due_at, 1)) - 1)
           + substr(max(e.started_at - e.due_at, 1), 1, 1) - 1
       END AS delay_class,
       CASE WHEN e.started_at >= :since
           THEN (min(max(e.due_at, :since), e.started_at) - :since) / :bucket END AS joined,
       CASE WHEN e.started_at >= :since THEN (e.started_at - :since) / :bucket END AS left_at,
       count(*) AS runs
FROM execution_history e
WHERE e.finished_at >= :since AND e.finished_at < :until
  AND (:tenant IS NULL OR +e.job_id IN (SELECT id FROM jobs WHERE tenant = :tenant))
GROUP BY 1, 2, 3, 4, 5
UNION ALL
SELECT NULL, NULL, NULL, (min(max(e.due_at, :since), e.started_at) - :since) / :bucket,
       (e.started_at - :since) / :bucket, count(*)
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.started_at >= :since AND e.started_at < :until
  AND (:tenant IS NULL OR j.tenant = :tenant)
GROUP BY 4, 5
UNION ALL
SELECT NULL, NULL, NULL, (max(e.due_at, :since) - :since) / :bucket, NULL, count(*)
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard IN (SELECT value FROM json_each(:shards))
  AND e.status IN ('scheduled', 'queued') AND e.due_at < :until
  AND j.status = 'active' AND (:tenant IS NULL OR j.tenant = :tenant)
GROUP BY 4;

-- name: execution_running_by_owner
SELECT e.lease_owner AS owner, sum(e.lease_expires_at > :now) AS running,
       sum(e.lease_expires_at <= :now) AS expired
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.started_at IS NOT NULL  -- not a run held ahead: it reads queued
  AND (:tenant IS NULL OR j.tenant = :tenant)
GROUP BY e.lease_owner
ORDER BY e.lease_owner;

-- name: execution_backlog
-- The queue depth by priority: pending runs already due (a range of runs_dispatch per status).
SELECT priority, count(*) AS runs FROM runs
WHERE status IN ('scheduled', 'queued') AND due_at <= :now
GROUP BY priority;

-- name: scheduler_shards
SELECT s.owner, s.last_seen,
       (SELECT count(*) FROM shard_leases l
        WHERE l.owner = s.owner AND l.lease_expires_at > :now) AS shards
FROM schedulers s
ORDER BY s.owner;

-- name: dead_letter_count_of_tenant
SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE tenant = :tenant LIMIT :limit);

-- name: execution_last_of_jobs
-- Per job, its newest final run (the history's (job_id, scheduled_for) index, backwards) and its
-- newest running one (runs' unique key): the caller keeps the later of the two. Each table is
-- read alone: a join through the view by id would read all of it.
SELECT h.* FROM json_each(:ids) AS j
JOIN execution_history h ON h.id = (
    SELECT n.id FROM execution_history n
    WHERE n.job_id = j.value
    ORDER BY n.scheduled_for DESC
    LIMIT 1)
UNION ALL
SELECT r.* FROM json_each(:ids) AS j
JOIN runs r ON r.id = (
    SELECT n.id FROM runs n
    WHERE n.job_id = j.value AND n.status = 'running' AND n.started_at IS NOT NULL
    ORDER BY n.scheduled_for DESC
    LIMIT 1);

-- name: api_key_get
SELECT * FROM api_keys WHERE id = :id AND revoked_at IS NULL;

-- name: secret_insert
INSERT INTO secrets (name, value, created_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO NOTHING;

-- name: secret_get
SELECT value FROM secrets WHERE name = :name;

-- name: dead_letter_list_of_tenant
-- dead_letter_list for one tenant: a range of dead_letters_tenant, not a walk past other tenants'.
SELECT d.*, j.task, j.params FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE d.tenant = :tenant AND d.execution_id > :after_id
ORDER BY d.execution_id
LIMIT :limit;

-- name: job_get_for_update
-- The job an edit, pause, resume, cancel or manual run decides on (BEGIN IMMEDIATE holds the
-- write lock already; PostgreSQL's version locks the row).
SELECT * FROM jobs WHERE id = :id;

-- name: task_publish
INSERT INTO tasks (name, max_attempts, backoff_base, backoff_cap, timeout, is_async, worker, seen_at)
VALUES (:name, :max_attempts, :backoff_base, :backoff_cap, :timeout, :is_async, :worker, :now)
ON CONFLICT (name) DO UPDATE SET
    max_attempts = excluded.max_attempts, backoff_base = excluded.backoff_base,
    backoff_cap = excluded.backoff_cap, timeout = excluded.timeout, is_async = excluded.is_async,
    worker = excluded.worker, seen_at = excluded.seen_at;

-- name: task_catalog
SELECT * FROM tasks WHERE seen_at >= :since ORDER BY name;

-- name: task_catalog_of_names
-- task_catalog for a few names (a job's task on submission): one primary-key look-up each.
SELECT t.* FROM tasks t
WHERE t.name IN (SELECT value FROM json_each(:names)) AND t.seen_at >= :since
ORDER BY t.name;

-- --- alert outbox ----------------------------------------------------------------------------

-- name: alert_insert
INSERT INTO alerts (kind, job_id, payload, created_at, next_attempt_at)
VALUES (:kind, :job_id, :payload, :now, :now);

-- name: alerts_due
SELECT a.id, a.kind, a.job_id, a.payload, a.created_at, a.attempts, j.tenant, j.task
FROM alerts a JOIN jobs j ON j.id = a.job_id
WHERE a.next_attempt_at <= :now
ORDER BY a.next_attempt_at, a.id
LIMIT :limit;

-- name: alerts_hold
UPDATE alerts SET next_attempt_at = :until, attempts = attempts + 1
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: alerts_delete
DELETE FROM alerts WHERE id IN (SELECT value FROM json_each(:ids));

-- name: alert_retry
UPDATE alerts SET next_attempt_at = :next_attempt_at, last_error = :error WHERE id = :id;

-- --- fleet limits (onbeat.limits) ------------------------------------------------------------

-- name: tenant_limits_of
SELECT tenant, max_in_flight, max_starts_per_second FROM tenant_limits
WHERE tenant IN (SELECT value FROM json_each(:tenants));

-- name: tenant_limits_put
INSERT INTO tenant_limits (tenant, max_in_flight, max_starts_per_second, updated_at)
VALUES (:tenant, :max_in_flight, :max_starts_per_second, :now)
ON CONFLICT (tenant) DO UPDATE SET
    max_in_flight = excluded.max_in_flight,
    max_starts_per_second = excluded.max_starts_per_second, updated_at = excluded.updated_at;

-- name: tenant_usage_lock
-- The counters a claim decides on (created at zero if missing), locked until commit: in
-- PostgreSQL the upsert locks each row, in the order given ('' first, then by name).
INSERT INTO tenant_usage (tenant, running)
SELECT value, 0 FROM json_each(:tenants) WHERE true ORDER BY value
ON CONFLICT (tenant) DO UPDATE SET running = running
RETURNING tenant, running, tat;

-- name: tenant_usage_add
-- One statement per transaction that starts or ends runs: :changes is a JSON array of
-- {tenant, running (the change), tat (NULL: unchanged)}, sorted by tenant ('' first).
INSERT INTO tenant_usage (tenant, running, tat)
SELECT json_extract(value, '$.tenant'), json_extract(value, '$.running'),
       json_extract(value, '$.tat')
FROM json_each(:changes) WHERE true ORDER BY 1
ON CONFLICT (tenant) DO UPDATE SET
    running = running + excluded.running, tat = coalesce(excluded.tat, tat);

-- name: tenant_usage_get
SELECT running, tat FROM tenant_usage WHERE tenant = :tenant;

-- name: execution_hold_for_slot
-- A run given a slot under its tenant's starts/s limit: the slot is its hand-over to the queue
-- (queued_at, so its lateness counts from the slot), the reason says it holds one.
UPDATE runs SET queued_at = :slot, reason = :reason WHERE id = :id AND status = 'queued';

-- --- hot runs and history ------------------------------------------------------------------

-- name: runs_archive
-- Copy the runs that are final now to execution_history (runs_delete_final then deletes them):
-- the history is written once, at the final state.
INSERT INTO execution_history
SELECT * FROM runs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('succeeded', 'failed', 'cancelled', 'skipped');

-- name: runs_delete_final
DELETE FROM runs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('succeeded', 'failed', 'cancelled', 'skipped');

-- name: execution_unarchive
-- A dead letter replayed: its run goes back from the history to runs.
INSERT INTO runs
SELECT * FROM execution_history
WHERE id = :id AND scheduled_for = :scheduled_for AND status = 'failed';

-- name: history_delete_run
DELETE FROM execution_history WHERE id = :id AND scheduled_for = :scheduled_for;

-- name: history_protected_days
-- The UTC days (number since the epoch) before :cutoff that retention must keep: a day holding an
-- unresolved dead letter (a human decides about those), a run not final yet, or a run that
-- ended within the retention (a late retry, a replayed dead letter: read through the
-- history's finished_at index, a short range).
SELECT scheduled_for / 86400000000 AS day FROM dead_letters WHERE scheduled_for < :cutoff
UNION
SELECT scheduled_for / 86400000000 FROM runs WHERE scheduled_for < :cutoff
UNION
SELECT scheduled_for / 86400000000 FROM execution_history
WHERE finished_at >= :cutoff AND scheduled_for < :cutoff;

-- name: history_delete_expired
-- A batch of the runs older than the retention, except on protected days (:days, a JSON array).
DELETE FROM execution_history
WHERE rowid IN (
    SELECT rowid FROM execution_history
    WHERE scheduled_for < :cutoff
      AND scheduled_for / 86400000000 NOT IN (SELECT value FROM json_each(:days))
    LIMIT :limit);

-- name: attempts_delete_expired
DELETE FROM attempts
WHERE rowid IN (
    SELECT rowid FROM attempts
    WHERE scheduled_for < :cutoff
      AND scheduled_for / 86400000000 NOT IN (SELECT value FROM json_each(:days))
    LIMIT :limit);
