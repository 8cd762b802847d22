-- PostgreSQL statements of PostgresStore, by name: the same names and parameters as
-- sql/sqlite/queries.sql (store/sql_store/ runs both). Times are bigint microseconds (UTC).
-- Lists of ids travel as one JSON array parameter, read with jsonb_array_elements_text(). A list
-- of keys is matched as `key = ANY (ARRAY(SELECT jsonb_array_elements_text(...)))`, which the
-- planner reads through the key's index: as a join or `IN (SELECT ...)` it guesses 100 ids and,
-- on a table of a few thousand rows, hashes them against a scan of the whole table (a claim's
-- three look-ups of 16-64 runs took 1-3 ms each with 8,000 runs stored, 0.2-0.4 ms by the index).
-- Under READ COMMITTED, the reads a decision rests on lock what they read (FOR UPDATE / FOR SHARE)
-- and every UPDATE re-checks its conditions, so a concurrent writer waits or loses, never both win.
--
-- Tokens by id: a statement given {id: token} pairs (:held) reads each run's token from the JSON
-- object, `e.fencing_token = CAST((SELECT tokens FROM held_tokens) ->> e.id AS bigint)`, instead of
-- joining the pairs. The planner guesses 100 pairs and 10 runs for the ids, so a join was a coin
-- toss (costs 83.45 and 84.41) between a hash join and a nested loop that compares every run with
-- every pair: 12 s for 10,000 runs held, and confirms of 50,000 runs that ran for minutes in W3 at
-- 100,000 cron jobs (docs/performance.md). The object is read through a scalar subquery: joined as
-- a row, FOR UPDATE would copy it into every row it locks (4.7 GB sorted for 10,000 runs).

-- name: jobs_insert_created
-- A batch of new jobs (:rows, a JSON array of job_insert rows as SQLite's) and their creation
-- events in one statement. Nothing comes back: the caller built every column's value.
WITH created AS (
    INSERT INTO jobs (id, tenant, task, params, schedule_kind, schedule_expression, schedule_at,
                      timezone, max_attempts, backoff_base, backoff_cap, timeout, overlap,
                      misfire, catchup_window, priority, jitter, status, next_fire_at, shard,
                      created_at, updated_at)
    SELECT r.id, r.tenant, r.task, r.params, r.schedule_kind, r.schedule_expression,
           r.schedule_at, r.timezone, r.max_attempts, r.backoff_base, r.backoff_cap, r.timeout,
           r.overlap, r.misfire, r.catchup_window, r.priority, r.jitter, r.status,
           r.next_fire_at, r.shard, :now, :now
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        id text, tenant text, task text, params text, schedule_kind text,
        schedule_expression text, schedule_at bigint, timezone text, max_attempts integer,
        backoff_base double precision, backoff_cap double precision, timeout double precision,
        overlap text, misfire text, catchup_window double precision, priority integer,
        jitter double precision, status text, next_fire_at bigint, shard integer)
    RETURNING id, schedule_kind, schedule_expression, schedule_at, timezone
)
INSERT INTO job_events (job_id, at, kind, schedule_kind, schedule_expression, schedule_at, timezone)
SELECT id, :now, :kind, schedule_kind, schedule_expression, schedule_at, timezone
FROM created;

-- name: job_get
SELECT * FROM jobs WHERE id = :id;

-- name: job_get_for_update
-- The job an edit, pause, resume, cancel or manual run decides on, locked until commit.
SELECT * FROM jobs WHERE id = :id FOR UPDATE;

-- name: jobs_lock_of_runs
-- Lock the jobs of these runs, in id order (every transaction locks jobs before their runs, so
-- two never wait on each other): claims of one job's runs are decided one after the other.
-- Driven by the run ids (runs_pkey, then jobs_pkey), each list an array (see "Lists of ids"
-- at the top).
SELECT j.id FROM jobs AS j
WHERE j.id = ANY (ARRAY(
    SELECT r.job_id FROM runs AS r
    WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))))
ORDER BY j.id
FOR UPDATE;

-- name: shard_map_lock
-- shard_acquire reads the live schedulers and the leases, then takes its share: one at a time.
SELECT pg_advisory_xact_lock(7243000001);

-- name: sessions_end_stalled
-- onbeat's sessions of this database and user (those holding the session marker,
-- SESSION_MARKER_LOCK; pg_locks splits a bigint key into classid, its high half, and objid)
-- inside a transaction, waiting for a client that has sent nothing for :after seconds
-- (state_change: when its last statement began, or when it went idle): a frozen process's.
-- 'active' is a client frozen mid-pipeline; 'idle in transaction' one frozen after a
-- pipeline, whose timeout the server turned off (PostgresStore.session_end_stalled says why).
-- Another application's or an administrator's open transaction (S6's LOCK TABLE) holds no
-- marker: not ours to end. Not a COPY, whose client may be slow for its own reasons.
SELECT a.pid, pg_terminate_backend(a.pid)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.usename = current_user AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend' AND a.wait_event = 'ClientRead'
  AND a.state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
  AND a.xact_start IS NOT NULL
  AND a.state_change < clock_timestamp() - make_interval(secs => :after)
  AND a.query NOT ILIKE 'copy%'
  AND EXISTS (
    SELECT 1 FROM pg_locks AS l
    WHERE l.pid = a.pid AND l.granted AND l.locktype = 'advisory' AND l.objsubid = 1
      AND (CAST(l.classid AS bigint) << 32 | CAST(l.objid AS bigint)) = 7243000003);

-- name: job_list
SELECT * FROM jobs
WHERE (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
  AND (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:task AS text) IS NULL OR task = :task)
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
UPDATE runs SET due_at = :now WHERE id = :id AND due_at < :now;

-- name: job_set_next_fire
UPDATE jobs SET next_fire_at = :next_fire_at, updated_at = :now WHERE id = :id;

-- name: jobs_set_next_fire_many
-- Each job's next fire time from :heads, a JSON object {job id: microseconds or null}: one
-- statement for a dispatch page. Looked up by id, not joined (as "Tokens by id" at the top).
WITH heads AS MATERIALIZED (SELECT CAST(:heads AS jsonb) AS fires)
UPDATE jobs AS j
SET next_fire_at = CAST((SELECT fires FROM heads) ->> j.id AS bigint), updated_at = :now
WHERE j.id = ANY (ARRAY(SELECT jsonb_object_keys(fires) FROM heads));

-- name: job_complete_one_shot
-- "Not paused, cancelled or completed" is "active", written so that it does not match a partial
-- index on active jobs, which the planner would read whole for the few ids of a batch.
UPDATE jobs AS j SET status = 'completed', updated_at = :now
WHERE j.id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))) AND j.schedule_kind != 'cron'
  AND j.status NOT IN ('paused', 'cancelled', 'completed');

-- name: executions_insert_many
-- New runs (:rows, a JSON array of SQLite's execution_insert rows) in one statement, in the
-- order given; returns the ids inserted. Idempotent on (job_id, scheduled_for, trigger): two
-- schedulers planning the same fire insert one row, and a fire time in the history gets none.
-- That check is a probe of execution_history_fire per new run, in its day's partition: OFFSET 0
-- keeps it a subplan run per row. As an anti-join, planned for the 100 rows PostgreSQL assumes
-- of any jsonb_to_recordset, it was a hash of the whole day's history for each insert while the
-- history was under ~80,000 rows, or was so when last analyzed (one POST /jobs: 10 ms at 9,000).
INSERT INTO runs (id, job_id, shard, trigger, scheduled_for, due_at, status, priority, reason,
                  catchup, created_at, queued_at, finished_at)
SELECT r.id, r.job_id, r.shard, r.trigger, r.scheduled_for, r.due_at, r.status, r.priority,
       r.reason, r.catchup, r.now, CASE WHEN r.status = 'queued' THEN r.now END,
       CASE WHEN r.status IN ('skipped', 'cancelled') THEN r.now END
FROM ROWS FROM (jsonb_to_recordset(CAST(:rows AS jsonb)) AS (
         id text, job_id text, shard integer, trigger text, scheduled_for bigint,
         due_at bigint, status text, priority integer, reason text, catchup boolean,
         now bigint))
     WITH ORDINALITY AS r(id, job_id, shard, trigger, scheduled_for, due_at, status, priority,
                          reason, catchup, now, position)
WHERE NOT EXISTS (SELECT 1 FROM execution_history h
                  WHERE h.job_id = r.job_id AND h.scheduled_for = r.scheduled_for
                    AND h.trigger = r.trigger
                  OFFSET 0)
ORDER BY r.position
ON CONFLICT (job_id, scheduled_for, trigger) DO NOTHING
RETURNING id;

-- name: execution_get
SELECT * FROM executions WHERE id = :id;

-- name: execution_list
-- A run held ahead (running, not started) is filtered as it reads: queued (rows.execution_of).
SELECT * FROM executions
WHERE job_id = :job_id
  AND (CAST(:status AS text) IS NULL
       OR CASE WHEN status = 'running' AND started_at IS NULL THEN 'queued' ELSE status END
          = :status)
  AND (CAST(:before_scheduled_for AS bigint) IS NULL
       OR (scheduled_for, id) < (:before_scheduled_for, :before_id))
ORDER BY scheduled_for DESC, id DESC
LIMIT :limit;

-- name: attempts_of
SELECT * FROM attempts
WHERE execution_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
ORDER BY started_at, fencing_token;

-- name: executions_cancel_pending
UPDATE runs
SET status = 'cancelled', reason = :reason, finished_at = :now, fencing_token = fencing_token + 1
WHERE job_id = :job_id AND status IN ('scheduled', 'queued')
RETURNING id;

-- name: executions_drop_future
DELETE FROM runs
WHERE job_id = :job_id AND trigger = 'schedule' AND status IN ('scheduled', 'queued')
  AND scheduled_for > :after AND attempt = 0 AND fencing_token = 0;

-- name: jobs_cron_page
-- The reconciler's page, read without a lock: the next :limit active cron jobs of the held shards
-- after (:after_shard, :after_id), each with whether it has a planned (scheduled) run at its next
-- fire time. One snapshot judges job and runs alike, so a job a dispatch is moving on is judged
-- before or after it, never half way; a job found without one is only a suspect, locked and judged
-- again by jobs_next_run_state (almost every pass finds none, and locks nothing). A range read of
-- jobs_shard_active: = ANY of an array on its leading column keeps (shard, id) order, so the LIMIT
-- ends the scan at the page's last job; the caller passes only the shards from :after_shard on (an
-- earlier shard in the array costs a scan of its own).
WITH page AS (
    SELECT j.id, j.shard, j.next_fire_at FROM jobs j
    WHERE j.shard = ANY(ARRAY(SELECT CAST(jsonb_array_elements_text(CAST(:shards AS jsonb)) AS int)))
      AND j.status = 'active' AND j.schedule_kind = 'cron'
      AND (j.shard, j.id) > (CAST(:after_shard AS int), CAST(:after_id AS text))
    ORDER BY j.shard, j.id
    LIMIT :limit
)
SELECT p.id, p.shard, next_run.id IS NOT NULL AS has_next_run
FROM page p
LEFT JOIN LATERAL (
    -- LIMIT 1: one look-up of the runs' unique index per job, never a hash of every run
    SELECT e.id FROM runs e
    WHERE e.job_id = p.id AND e.trigger = 'schedule'
      AND e.scheduled_for = p.next_fire_at AND e.status = 'scheduled'
    LIMIT 1
) next_run ON true
ORDER BY p.shard, p.id;

-- name: jobs_lock_active_cron
-- The reconciler's suspects, locked as dispatch locks them (a job being dispatched or edited is
-- left to the next pass), if still active cron jobs.
SELECT j.id FROM jobs j
WHERE j.id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND j.status = 'active' AND j.schedule_kind = 'cron'
FOR UPDATE OF j SKIP LOCKED;

-- name: jobs_next_run_state
-- The locked suspects of a page, each with whether it has a planned (scheduled) run at its next fire
-- time. A statement of its own, after the lock: in the locking statement a job that a dispatch
-- moved on meanwhile would be read at its new next fire time but its runs at the statement's
-- older snapshot, without the run that dispatch planned (a false repair).
SELECT j.*,
       EXISTS (SELECT 1 FROM runs e
               WHERE e.job_id = j.id AND e.trigger = 'schedule'
                 AND e.scheduled_for = j.next_fire_at AND e.status = 'scheduled') AS has_next_run,
       CASE WHEN j.next_fire_at IS NULL THEN
           (SELECT max(e.scheduled_for) FROM executions e
            WHERE e.job_id = j.id AND e.trigger = 'schedule') END AS latest_fire
FROM jobs j
WHERE j.id = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
ORDER BY j.shard, j.id;

-- name: execution_schedule_run_at
SELECT id, status FROM executions
WHERE job_id = :job_id AND scheduled_for = :scheduled_for AND trigger = 'schedule';

-- name: executions_pending_of_job
SELECT * FROM runs WHERE job_id = :job_id AND status IN ('scheduled', 'queued');

-- name: execution_dispatch_candidates
-- The runs and their jobs, locked: the job's schedule cannot change (an edit) between this read
-- and the next run this dispatch plans from it. SKIP LOCKED: a run or job another transaction is
-- changing is left to the next pass, so dispatch never waits (and never deadlocks with a claim,
-- which locks jobs and then runs).
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
WHERE e.shard IN (SELECT CAST(jsonb_array_elements_text(CAST(:shards AS jsonb)) AS int))
  AND e.status = 'scheduled'
  AND e.due_at <= :horizon
  AND j.status IN ('active', 'completed')
LIMIT :limit
FOR UPDATE OF e, j SKIP LOCKED;

-- name: execution_mark_queued
-- Driven by the ids; "scheduled" as the complement of the other statuses (not to match
-- runs_dispatch, as in execution_start_many).
UPDATE runs SET status = 'queued', queued_at = :now
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND status NOT IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped');

-- name: execution_mark_catchup
UPDATE runs SET catchup = TRUE
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))));

-- name: execution_end_pending
UPDATE runs SET status = :status, reason = :reason, finished_at = :now
WHERE id = :id AND status IN ('scheduled', 'queued');

-- name: execution_sweep
SELECT e.id, e.shard, e.due_at, j.priority
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard = :shard AND e.status = 'queued' AND e.due_at < :before
  AND (e.due_at, e.id) > (CAST(:after_due_at AS bigint), CAST(:after_id AS text))
ORDER BY e.due_at, e.id
LIMIT :limit;

-- name: execution_sweep_shards
-- execution_sweep over many shards in one statement: an index scan of runs_dispatch over the
-- shard array yields the runs in (shard, due_at) order, so the LIMIT ends it at the page's last
-- row instead of one round trip per shard (1,024 shards took 0.6-2.6 s per pass on a busy box).
SELECT e.id, e.shard, e.due_at, j.priority
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard = ANY(ARRAY(SELECT CAST(jsonb_array_elements_text(CAST(:shards AS jsonb)) AS int)))
  AND e.status = 'queued' AND e.due_at < :before
  AND (e.shard, e.due_at, e.id)
      > (CAST(:after_shard AS int), CAST(:after_due_at AS bigint), CAST(:after_id AS text))
ORDER BY e.shard, e.due_at, e.id
LIMIT :limit;

-- name: execution_expired_leases
-- None within :restart_grace seconds of the server's start: no holder could renew while it was
-- down (server time only, so an injected clock does not matter).
SELECT e.id, e.job_id, e.attempt, e.fencing_token, e.started_at, e.lease_owner,
       j.max_attempts, j.backoff_base, j.backoff_cap, j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.lease_expires_at < :now
  AND clock_timestamp() - pg_postmaster_start_time()
      >= make_interval(secs => CAST(:restart_grace AS double precision))
ORDER BY e.lease_expires_at
LIMIT :limit;

-- name: execution_reap
-- Each decision applies only while its run is still running under that token with its lease
-- expired, re-checked on the locked row: a heartbeat or an outcome that committed first wins.
UPDATE runs AS e
SET status = d.status,
    due_at = coalesce(d.due_at, e.due_at),
    last_error = coalesce(d.error, e.last_error),
    reason = d.reason,
    lease_owner = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN d.status = 'queued' THEN NULL ELSE :now END
FROM jsonb_to_recordset(CAST(:decisions AS jsonb))
     AS d(id text, fencing_token bigint, status text, due_at bigint, error text, reason text)
WHERE e.id = d.id
  AND e.fencing_token = d.fencing_token
  AND e.status = 'running' AND e.lease_expires_at < :now
RETURNING e.*;

-- name: execution_claim_candidates
-- The runs to claim, locked (their jobs are locked already, by jobs_lock_of_runs) in id order,
-- as outcomes and the heartbeat lock theirs: in the order of the plan, two statements could each
-- hold a run the other waits for (N1: 46 deadlocks an hour, each a second of waiting).
SELECT e.*, j.task, j.params, j.timeout, j.max_attempts, j.backoff_base, j.backoff_cap,
       j.overlap, j.misfire, j.catchup_window, j.schedule_kind, j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
ORDER BY e.id
FOR UPDATE OF e;

-- name: execution_earliest_due_of_jobs
-- Per job, its earliest pending run already due: one range of the unique index (job_id,
-- scheduled_for, trigger) per job, stopped at the first match. Driven by the job ids (LATERAL):
-- as a join the planner guesses 100 ids and hashes them against a scan of every run (190 ms a
-- claim with 100,000 cron jobs behind, which only put them further behind). "Pending" is written
-- as the complement of the other statuses so that it does not match runs_dispatch.
SELECT t.job_id, r.id, r.scheduled_for
FROM jsonb_array_elements_text(CAST(:job_ids AS jsonb)) AS t(job_id)
CROSS JOIN LATERAL (
    SELECT r.id, r.scheduled_for FROM runs AS r
    WHERE r.job_id = t.job_id
      AND r.status NOT IN ('running', 'succeeded', 'failed', 'cancelled', 'skipped')
      AND r.due_at <= :now
    ORDER BY r.scheduled_for
    LIMIT 1) AS r;

-- name: execution_running_of_jobs
-- Driven by the job ids (= ANY of an array: the unique index leads with job_id; as a join the
-- planner guesses 100 ids and hashes them against a scan of every run). The status test is
-- written as the complement of 'running' so that it does not match the partial index of running
-- runs: the planner would read all of it (every running run, and the dead entries a bitmap scan
-- never prunes) for the few jobs of a claim.
SELECT r.id, r.job_id, r.fencing_token, coalesce(r.started_at, r.due_at) AS started_at
FROM runs AS r
WHERE r.job_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:job_ids AS jsonb))))
  AND r.status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped');

-- name: execution_newest_missed_of_jobs
SELECT job_id, max(scheduled_for) AS newest FROM executions
WHERE job_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:job_ids AS jsonb))))
  AND trigger = 'schedule' AND scheduled_for < :grace_line
GROUP BY job_id;

-- name: execution_start_many
-- Start the queued runs of :ids. Their attempts are not written yet: a running attempt is the
-- runs row (attempt, lease_owner, fencing_token, started_at; SQLStore._with_attempts reads it
-- from there), and it is written once, when it ends (attempt_end). The ids drive
-- (runs_pkey, = ANY of the array); "queued" is written as the complement of the other statuses
-- so that it does not match runs_dispatch, which the planner would AND with the ids (reading
-- every queued run of every shard). :waited: the lease runs from the commit, not from when the
-- claim began (see the heartbeat).
WITH started AS (
    UPDATE runs
    SET status = 'running', attempt = attempt + 1, fencing_token = fencing_token + 1,
        lease_owner = :owner, started_at = :now, reason = NULL,
        lease_expires_at = :lease_expires_at + CASE WHEN CAST(:waited AS boolean)
            THEN greatest(0, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - :now)
            ELSE 0 END
    WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
      AND status NOT IN ('scheduled', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')
    RETURNING *)
SELECT * FROM started;

-- name: execution_claim_ahead_many
-- Claim runs ahead of their due time (plan.plan_claim's start_ahead): running under the lease,
-- but not started: no started_at, no attempt, the fencing token unchanged until the worker
-- confirms the run at its due time (execution_confirm_many); leased until :grace after it.
-- "queued" as in execution_start_many.
UPDATE runs
SET status = 'running', lease_owner = :owner, lease_expires_at = due_at + :grace,
    started_at = NULL, reason = NULL
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND status NOT IN ('scheduled', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')
RETURNING *;

-- name: execution_confirm_many
-- Start the runs a worker claimed ahead, at their due time: each only if still claimed ahead by
-- it under that token and its job is active, so a cancel, pause or edit committed before wins.
-- The runs are locked in id order first (see execution_heartbeat); the attempt begins here (its
-- record is written when it ends, as in execution_start_many), with a lease from the commit
-- (:waited, as in execution_start_many) that the heartbeat renews. Tokens are looked up, not
-- joined (see "Tokens by id" at the top).
WITH held_tokens AS MATERIALIZED (
    SELECT CAST(:held AS jsonb) AS tokens),
held AS MATERIALIZED (
    SELECT e.id
    FROM runs AS e
    JOIN jobs AS j ON j.id = e.job_id
    WHERE e.id = ANY (ARRAY(SELECT jsonb_object_keys(tokens) FROM held_tokens))
      AND e.fencing_token = CAST((SELECT tokens FROM held_tokens) ->> e.id AS bigint)
      AND e.lease_owner = :owner
      AND e.status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')
      AND e.started_at IS NULL AND j.status = 'active'
    ORDER BY e.id
    FOR UPDATE OF e
),
started AS (
    UPDATE runs AS e
    SET started_at = :now, attempt = e.attempt + 1, fencing_token = e.fencing_token + 1,
        lease_expires_at = :lease_expires_at + CASE WHEN CAST(:waited AS boolean)
            THEN greatest(0, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - :now)
            ELSE 0 END
    FROM held
    WHERE e.id = held.id
    RETURNING e.*)
SELECT id, fencing_token, attempt, started_at FROM started;

-- name: executions_requeue
-- Runs the queue handed to a worker that will not claim them: scheduled again, for the dispatch.
UPDATE runs SET status = 'scheduled'
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))) AND status = 'queued'
RETURNING id;

-- name: executions_unclaim
-- Runs claimed ahead that will not start here (their worker releases them): scheduled again at
-- their due time, for the dispatch to queue. The caller locked them.
UPDATE runs SET status = 'scheduled', lease_owner = NULL, lease_expires_at = NULL
WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
  AND status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')
  AND started_at IS NULL
RETURNING id;

-- name: executions_unclaim_of_job
-- A job's runs claimed ahead and not started, before an edit or a cancel decides on its pending
-- runs: they are pending again, so the edit or cancel treats them as it treats any.
UPDATE runs SET status = 'scheduled', lease_owner = NULL, lease_expires_at = NULL
WHERE job_id = :job_id
  AND status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')
  AND started_at IS NULL
RETURNING id;

-- name: attempt_end
-- An attempt's one write, as it ends, from its run's row (before the run moves on; :worker when
-- the row no longer names it: a reap). An attempt a version before this one recorded at its
-- start is updated instead.
INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token, started_at,
                      finished_at, outcome, error)
SELECT id, scheduled_for, attempt, coalesce(CAST(:worker AS text), lease_owner), fencing_token,
       started_at, :now, :outcome, :error
FROM runs
WHERE id = :id AND fencing_token = :fencing_token AND started_at IS NOT NULL
ON CONFLICT (execution_id, scheduled_for, fencing_token) DO UPDATE
SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error;

-- name: execution_defer
UPDATE runs SET status = 'scheduled', due_at = :due_at, reason = :reason
WHERE id = :id AND status = 'queued';

-- name: executions_wake_waiting
-- 'waiting for ' is plan.WAITING (tests/unit/test_queries.py keeps them equal).
-- "scheduled" as the complement of the other statuses: not to match runs_dispatch (as above).
UPDATE runs AS r SET due_at = :now
WHERE r.job_id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:job_ids AS jsonb))))
  AND r.status NOT IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')
  AND r.reason LIKE 'waiting for %' AND r.due_at > :now;

-- name: execution_replace
UPDATE runs
SET status = 'cancelled', reason = :reason, finished_at = :now, fencing_token = fencing_token + 1,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = :id AND status = 'running'
RETURNING id, scheduled_for, fencing_token - 1 AS fencing_token;

-- name: execution_heartbeat
-- Only the (id, fencing token) pairs the worker runs; :held is a JSON object {id: token}.
-- :waited: the renewal is pushed back by the server time that passed since :now (the store's
-- server-clock reading when the heartbeat was made), so a heartbeat that waited for a pooled
-- connection or a lock (LOCK TABLE, a long migration) renews from when it commits, not to a
-- time already past: a holder merely blocked keeps its lease.
-- "running" is written as the complement of the other statuses so that it does not match
-- runs_lease_expiry: with it the planner could compare each held lease with every running run
-- through that index (42 s for 5,000 leases among 10,000 running runs, bench/inflight.py);
-- without, each lease is one runs_pkey look-up. The pairs drive the plan as an array of ids
-- (see "Lists of ids" at the top): as a join on the pairs, a heartbeat read all 4,000 runs of a store.
-- Each run's token is looked up in :held (see "Tokens by id" at the top), not joined to it.
-- The runs are locked first, in id order (see execution_claim_candidates): an UPDATE locks them
-- in the order of its plan, and deadlocked with outcomes and claims (N1: 46 an hour).
WITH held_tokens AS MATERIALIZED (
    SELECT CAST(:held AS jsonb) AS tokens),
held AS MATERIALIZED (
    SELECT e.id
    FROM runs AS e
    WHERE e.id = ANY (ARRAY(SELECT jsonb_object_keys(tokens) FROM held_tokens))
      AND e.fencing_token = CAST((SELECT tokens FROM held_tokens) ->> e.id AS bigint)
      AND e.lease_owner = :owner
      AND e.status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')
    ORDER BY e.id
    FOR UPDATE OF e
)
UPDATE runs AS e
SET lease_expires_at = :lease_expires_at + CASE WHEN CAST(:waited AS boolean)
    THEN greatest(0, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - :now)
    ELSE 0 END
FROM held
WHERE e.id = held.id
RETURNING e.id, e.fencing_token;

-- name: execution_current_tokens
-- The runs an outcome or a release is about, locked: a reap or another outcome waits, then
-- finds the token moved on.
SELECT e.id, e.job_id, e.trigger, e.scheduled_for, e.fencing_token, e.status, e.attempt, e.lease_owner,
       e.started_at,
       j.status AS job_status, j.tenant
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
ORDER BY e.id
FOR UPDATE OF e;

-- name: execution_finish
UPDATE runs
SET status = :status, due_at = coalesce(:due_at, due_at), result = :result, last_error = :error,
    reason = :reason, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN CAST(:status AS text) IN ('scheduled', 'queued') THEN NULL ELSE :now END,
    attempt = attempt - :uncount_attempt
WHERE id = :id AND fencing_token = :fencing_token AND status = 'running';

-- name: execution_finish_final
-- A batch of running runs' final outcomes (the caller checked their tokens; :finishes is a JSON
-- array of execution_finish's parameters plus scheduled_for and the attempt's outcome), in one
-- statement: each run moves from runs straight into the history with its final values (no
-- update of the hot row first), its attempt is written from the row the DELETE returns (its one
-- write, as attempt_end), the runs of its job waiting for a predecessor are due now
-- (executions_wake_waiting: one statement fewer per outcome batch; the jobs are locked by then,
-- so this statement's snapshot holds every deferral a claim committed), and a one-shot job whose
-- run this was is completed.
-- The ids drive every step (= ANY of an array: primary keys); "running" is written as the
-- complement of the other statuses so that it does not match the partial index
-- runs_lease_expiry.
WITH f AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(CAST(:finishes AS jsonb))
        AS f(id text, job_id text, fencing_token bigint, scheduled_for bigint, status text,
             outcome text, result text, error text, reason text, uncount_attempt int)),
gone AS (
    DELETE FROM runs AS r USING f
    WHERE r.id = ANY (ARRAY(SELECT id FROM f))
      AND r.id = f.id AND r.fencing_token = f.fencing_token
      AND r.status NOT IN ('scheduled', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped')
    RETURNING r.*, f.status AS final_status, f.result AS final_result, f.error AS final_error,
              f.reason AS final_reason, f.uncount_attempt),
moved AS (
    INSERT INTO execution_history (id, job_id, shard, trigger, scheduled_for, due_at, status,
                                   attempt, priority, lease_owner, lease_expires_at,
                                   fencing_token, result, last_error, reason, created_at,
                                   started_at, finished_at, catchup, queued_at)
    SELECT id, job_id, shard, trigger, scheduled_for, due_at, final_status,
           attempt - uncount_attempt, priority, NULL, NULL, fencing_token, final_result,
           final_error, final_reason, created_at, started_at, :now, catchup, queued_at
    FROM gone
    RETURNING job_id, trigger),
attempt AS (
    INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token, started_at,
                          finished_at, outcome, error)
    SELECT g.id, g.scheduled_for, g.attempt, g.lease_owner, g.fencing_token, g.started_at, :now,
           f.outcome, f.error
    FROM gone AS g JOIN f ON f.id = g.id
    ON CONFLICT (execution_id, scheduled_for, fencing_token) DO UPDATE
    SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error),
woken AS (
    -- executions_wake_waiting's UPDATE for these jobs (waiting runs are scheduled, never the
    -- running runs this statement moves)
    UPDATE runs AS w SET due_at = :now
    WHERE w.job_id = ANY (ARRAY(SELECT DISTINCT job_id FROM f))
      AND w.status NOT IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')
      AND w.reason LIKE 'waiting for %' AND w.due_at > :now)
UPDATE jobs AS j SET status = 'completed', updated_at = :now
WHERE j.id = ANY (ARRAY(SELECT job_id FROM moved WHERE trigger = 'schedule'))
  AND j.schedule_kind != 'cron' AND j.status NOT IN ('paused', 'cancelled', 'completed');

-- name: dead_letter_insert
INSERT INTO dead_letters (execution_id, job_id, tenant, attempts, last_error, created_at,
                          scheduled_for)
VALUES (:id, :job_id, :tenant, :attempts, :error, :now, :scheduled_for)
ON CONFLICT (execution_id) DO UPDATE
SET attempts = excluded.attempts, last_error = excluded.last_error, created_at = excluded.created_at;

-- name: dead_letter_list
SELECT d.*, j.task, j.params FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE (CAST(:tenant AS text) IS NULL OR d.tenant = :tenant) AND d.execution_id > :after_id
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
INSERT INTO shard_leases (shard) VALUES (:shard) ON CONFLICT DO NOTHING;

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
-- FOR UPDATE: waits for a dispatch still writing under the previous owner's lease (its FOR KEY
-- SHARE, shard_held), which a plain UPDATE of no key column would not.
UPDATE shard_leases
SET owner = :owner, lease_expires_at = :lease_expires_at, epoch = epoch + 1
WHERE shard IN (SELECT shard FROM shard_leases
                WHERE owner IS NULL OR lease_expires_at <= :now
                ORDER BY shard LIMIT :wanted
                FOR UPDATE)
RETURNING shard, epoch;

-- name: shard_give_up
UPDATE shard_leases SET owner = NULL, lease_expires_at = 0
WHERE owner = :owner
  AND shard IN (SELECT CAST(jsonb_array_elements_text(CAST(:shards AS jsonb)) AS int));

-- name: shard_release
UPDATE shard_leases SET owner = NULL, lease_expires_at = 0 WHERE owner = :owner;

-- name: scheduler_unregister
DELETE FROM schedulers WHERE owner = :owner;

-- name: shard_held
-- FOR KEY SHARE: a takeover (shard_take locks the rows FOR UPDATE) waits until this
-- transaction's writes are committed, and after it, this check fails: a stalled scheduler never
-- writes to a shard it lost. The owner's own renewal (shard_renew, an UPDATE of no key column)
-- does not wait for it: a long dispatch pass never lets its scheduler's leases lapse.
SELECT shard, epoch FROM shard_leases WHERE owner = :owner AND lease_expires_at > :now
FOR KEY SHARE;

-- name: job_event_insert
INSERT INTO job_events (job_id, at, kind, schedule_kind, schedule_expression, schedule_at, timezone)
SELECT id, :now, :kind, schedule_kind, schedule_expression, schedule_at, timezone
FROM jobs WHERE id = :id;

-- name: job_events
SELECT * FROM job_events WHERE job_id = :job_id ORDER BY at, seq;

-- name: execution_fire_times
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
WHERE tenant = :tenant AND key = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:keys AS jsonb))));

-- name: idempotency_keys_insert
-- :keys is a JSON array of {tenant, key, fingerprint, job_id}; returns the keys inserted. A key a
-- concurrent submission holds waits for it to commit, then inserts nothing (the caller retries).
INSERT INTO idempotency_keys (tenant, key, fingerprint, job_id, created_at)
SELECT k->>'tenant', k->>'key', k->>'fingerprint', k->>'job_id', :now
FROM jsonb_array_elements(CAST(:keys AS jsonb)) AS k
ON CONFLICT (tenant, key) DO NOTHING
RETURNING key;

-- name: idempotency_key_prune
DELETE FROM idempotency_keys WHERE created_at < :before;

-- --- dashboard reads -----------------------------------------------------------------------

-- name: job_tenant_from
SELECT min(tenant) FROM jobs WHERE tenant >= :from;

-- name: job_task_from
SELECT min(task) FROM jobs WHERE tenant = :tenant AND task >= :from AND task < :to;

-- name: job_search_ids
SELECT id FROM jobs
WHERE tenant = :tenant AND status = :status AND id >= :id_from AND id < :id_to
ORDER BY id
LIMIT :limit;

-- name: job_search_ids_of_task
SELECT id FROM jobs
WHERE tenant = :tenant AND task = :task AND status = :status AND id >= :id_from
ORDER BY id
LIMIT :limit;

-- name: jobs_by_ids
SELECT * FROM jobs WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))) ORDER BY id;

-- name: execution_activity
-- As in sql/sqlite/queries.sql: runs that ended, runs running and runs pending, per bucket.
SELECT (e.finished_at - :since) / :bucket AS ended, e.status,
       CASE WHEN e.started_at IS NOT NULL THEN
           9 * (length(CAST(greatest(e.started_at - e.due_at, 1) AS text)) - 1)
           + CAST(substr(CAST(greatest(e.started_at - e.due_at, 1) AS text), 1, 1) AS int) - 1
       END AS delay_class,
       CASE WHEN e.started_at >= :since
           THEN (least(greatest(e.due_at, :since), e.started_at) - :since) / :bucket END AS joined,
       CASE WHEN e.started_at >= :since THEN (e.started_at - :since) / :bucket END AS left_at,
       count(*) AS runs
FROM execution_history e
WHERE e.finished_at >= :since AND e.finished_at < :until
  AND (CAST(:tenant AS text) IS NULL OR e.job_id IN (SELECT id FROM jobs WHERE tenant = :tenant))
GROUP BY 1, 2, 3, 4, 5
UNION ALL
SELECT NULL, NULL, NULL, (least(greatest(e.due_at, :since), e.started_at) - :since) / :bucket,
       (e.started_at - :since) / :bucket, count(*)
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.started_at >= :since AND e.started_at < :until
  AND (CAST(:tenant AS text) IS NULL OR j.tenant = :tenant)
GROUP BY 4, 5
UNION ALL
SELECT NULL, NULL, NULL, (greatest(e.due_at, :since) - :since) / :bucket, NULL, count(*)
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.shard IN (SELECT CAST(jsonb_array_elements_text(CAST(:shards AS jsonb)) AS int))
  AND e.status IN ('scheduled', 'queued') AND e.due_at < :until
  AND j.status = 'active' AND (CAST(:tenant AS text) IS NULL OR j.tenant = :tenant)
GROUP BY 4;

-- name: execution_running_by_owner
SELECT e.lease_owner AS owner, count(*) FILTER (WHERE e.lease_expires_at > :now) AS running,
       count(*) FILTER (WHERE e.lease_expires_at <= :now) AS expired
FROM runs e JOIN jobs j ON j.id = e.job_id
WHERE e.status = 'running' AND e.started_at IS NOT NULL  -- not a run held ahead: it reads queued
  AND (CAST(:tenant AS text) IS NULL OR j.tenant = :tenant)
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
SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE tenant = :tenant LIMIT :limit) AS d;

-- name: execution_last_of_jobs
-- Per job, its newest run that is not pending: one index range per arm of the view (runs by
-- job; each history partition by (job_id, scheduled_for)).
SELECT e.* FROM jsonb_array_elements_text(CAST(:ids AS jsonb)) AS j(value)
CROSS JOIN LATERAL (
    SELECT n.* FROM executions n
    WHERE n.job_id = j.value AND n.status NOT IN ('scheduled', 'queued')
      AND (n.status <> 'running' OR n.started_at IS NOT NULL)  -- held ahead: not started
    ORDER BY n.scheduled_for DESC
    LIMIT 1) AS e;

-- name: api_key_get
SELECT * FROM api_keys WHERE id = :id AND revoked_at IS NULL;

-- name: secret_insert
INSERT INTO secrets (name, value, created_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO NOTHING;

-- name: secret_get
SELECT value FROM secrets WHERE name = :name;

-- name: dead_letter_list_of_tenant
SELECT d.*, j.task, j.params FROM dead_letters d JOIN jobs j ON j.id = d.job_id
WHERE d.tenant = :tenant AND d.execution_id > :after_id
ORDER BY d.execution_id
LIMIT :limit;

-- --- task catalog --------------------------------------------------------------------------

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
SELECT t.* FROM tasks t
WHERE t.name IN (SELECT jsonb_array_elements_text(CAST(:names AS jsonb))) AND t.seen_at >= :since
ORDER BY t.name;

-- --- alert outbox ----------------------------------------------------------------------------

-- name: alert_insert
INSERT INTO alerts (kind, job_id, payload, created_at, next_attempt_at)
VALUES (:kind, :job_id, :payload, :now, :now);

-- name: alerts_due
-- Of two schedulers delivering at once, each takes alerts the other has not locked.
SELECT a.id, a.kind, a.job_id, a.payload, a.created_at, a.attempts, j.tenant, j.task
FROM alerts a JOIN jobs j ON j.id = a.job_id
WHERE a.next_attempt_at <= :now
ORDER BY a.next_attempt_at, a.id
LIMIT :limit
FOR UPDATE OF a SKIP LOCKED;

-- name: alerts_hold
UPDATE alerts SET next_attempt_at = :until, attempts = attempts + 1
WHERE id IN (SELECT CAST(jsonb_array_elements_text(CAST(:ids AS jsonb)) AS BIGINT));

-- name: alerts_delete
DELETE FROM alerts
WHERE id IN (SELECT CAST(jsonb_array_elements_text(CAST(:ids AS jsonb)) AS BIGINT));

-- name: alert_retry
UPDATE alerts SET next_attempt_at = :next_attempt_at, last_error = :error WHERE id = :id;

-- --- fleet limits (onbeat.limits) ------------------------------------------------------------

-- name: tenant_limits_of
SELECT tenant, max_in_flight, max_starts_per_second FROM tenant_limits
WHERE tenant IN (SELECT jsonb_array_elements_text(CAST(:tenants AS jsonb)));

-- name: tenant_limits_put
INSERT INTO tenant_limits (tenant, max_in_flight, max_starts_per_second, updated_at)
VALUES (:tenant, :max_in_flight, :max_starts_per_second, :now)
ON CONFLICT (tenant) DO UPDATE SET
    max_in_flight = excluded.max_in_flight,
    max_starts_per_second = excluded.max_starts_per_second, updated_at = excluded.updated_at;

-- name: tenant_usage_lock
-- The counters a claim decides on (created at zero if missing), locked until commit: the upsert
-- locks every stripe of each, in (tenant, stripe) order ('' first, then by name), the order every
-- writer of them takes; returns each tenant's sum (tat is kept on stripe 0).
WITH locked AS (
    INSERT INTO tenant_usage (tenant, stripe, running)
    SELECT t, s, 0
    FROM jsonb_array_elements_text(CAST(:tenants AS jsonb)) AS t
    CROSS JOIN generate_series(0, 15) AS s
    ORDER BY t, s
    ON CONFLICT (tenant, stripe) DO UPDATE SET running = tenant_usage.running
    RETURNING tenant, running, tat)
SELECT tenant, CAST(sum(running) AS bigint) AS running, max(tat) AS tat FROM locked
GROUP BY tenant;

-- name: tenant_usage_add
-- One statement per transaction that starts or ends runs: :changes is a JSON array of
-- {tenant, running (the change), tat (NULL: unchanged)}. The changes go to one stripe, chosen at
-- random (stripe 0 when a tat is written: it lives there, and such a claim locked every stripe),
-- applied in (tenant, stripe) order, the lock order of tenant_usage_lock.
WITH pick AS MATERIALIZED (SELECT CAST(floor(random() * 16) AS smallint) AS stripe),
changes AS (
    SELECT c.tenant, c.running, c.tat
    FROM jsonb_to_recordset(CAST(:changes AS jsonb)) AS c(tenant text, running bigint, tat bigint))
INSERT INTO tenant_usage (tenant, stripe, running, tat)
SELECT c.tenant,
       CASE WHEN EXISTS (SELECT 1 FROM changes WHERE tat IS NOT NULL) THEN 0 ELSE pick.stripe END,
       c.running, c.tat
FROM changes AS c CROSS JOIN pick
ORDER BY 1, 2
ON CONFLICT (tenant, stripe) DO UPDATE SET
    running = tenant_usage.running + excluded.running,
    tat = coalesce(excluded.tat, tenant_usage.tat);

-- name: tenant_usage_get
SELECT CAST(sum(running) AS bigint) AS running, max(tat) AS tat FROM tenant_usage
WHERE tenant = :tenant
HAVING count(*) > 0;

-- name: execution_hold_for_slot
-- A run given a slot under its tenant's starts/s limit: the slot is its hand-over to the queue
-- (queued_at, so its lateness counts from the slot), the reason says it holds one.
UPDATE runs SET queued_at = :slot, reason = :reason WHERE id = :id AND status = 'queued';

-- --- hot runs and history ------------------------------------------------------------------

-- name: runs_archive
-- Move the runs that are final now from runs to execution_history, in one statement: the history
-- is written once, at the final state. The partition is chosen by scheduled_for (DEFAULT if the
-- day has none).
WITH moved AS (
    DELETE FROM runs
    WHERE id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))))
      AND status IN ('succeeded', 'failed', 'cancelled', 'skipped')
    RETURNING *)
INSERT INTO execution_history SELECT * FROM moved;

-- name: execution_unarchive
-- A dead letter replayed: its run goes back from the history to runs (one partition probe).
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
-- A batch of the DEFAULT partition's runs older than the retention (day partitions are dropped
-- whole), except on protected days (:days, a JSON array).
DELETE FROM execution_history_default
WHERE ctid IN (
    SELECT ctid FROM execution_history_default
    WHERE scheduled_for < :cutoff
      AND scheduled_for / 86400000000 NOT IN (
          SELECT CAST(jsonb_array_elements_text(CAST(:days AS jsonb)) AS bigint))
    LIMIT :limit);

-- name: attempts_delete_expired
DELETE FROM attempts_default
WHERE ctid IN (
    SELECT ctid FROM attempts_default
    WHERE scheduled_for < :cutoff
      AND scheduled_for / 86400000000 NOT IN (
          SELECT CAST(jsonb_array_elements_text(CAST(:days AS jsonb)) AS bigint))
    LIMIT :limit);

-- name: history_maintenance_lock
-- history_maintain's steps, one process at a time (they are idempotent anyway).
SELECT pg_advisory_xact_lock(7243000002);

-- name: statistics_lock
-- statistics_refresh, one process at a time; another one running it skips the rest of its pass.
SELECT pg_try_advisory_xact_lock(7243000004) AS taken;

-- name: tables_behind_statistics
-- Of :tables (a JSON array of names), those of at least :min_pages pages and more than twice the
-- pages their statistics last counted (pg_class.relpages: 0 before the first ANALYZE or VACUUM).
-- Their size on disk, not the rows the statistics collector counts: that count reaches it up to
-- seconds late. Only tables this role owns (or a role it belongs to): ANALYZE skips the others
-- with a warning, and they would stay behind, to be tried at every pass.
SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind = 'r' AND pg_has_role(c.relowner, 'USAGE')
  AND c.relname = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:tables AS jsonb))))
  AND pg_relation_size(c.oid) >= :min_pages * current_setting('block_size')::bigint
  AND pg_relation_size(c.oid) > 2 * c.relpages * current_setting('block_size')::bigint
ORDER BY c.relname;

-- name: statistics_target_low
-- A sample of 3,000 rows for the ANALYZE that follows, not the default 30,000.
SET LOCAL default_statistics_target = 10;

-- name: partitions_of
-- The day partitions of a partitioned table (its DEFAULT partition aside), by name.
SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = CAST(CAST(:parent AS text) AS regclass)
  AND c.relname LIKE CAST(:parent AS text) || '\_p________';

-- The DDL below is formatted ({parent}, {partition}: identifiers onbeat builds from dates; {lo},
-- {hi}: integers), since DDL takes no parameters.

-- name: partition_lock_default
-- No run may land in the DEFAULT partition between moving a day's rows out and the ATTACH.
LOCK TABLE {parent}_default IN ACCESS EXCLUSIVE MODE;

-- name: partition_create
CREATE TABLE {partition} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);

-- name: partition_fill
-- The rows of that day that landed in the DEFAULT partition while the day had none.
WITH moved AS (
    DELETE FROM {parent}_default WHERE scheduled_for >= {lo} AND scheduled_for < {hi}
    RETURNING *)
INSERT INTO {partition} SELECT * FROM moved;

-- name: partition_attach
ALTER TABLE {parent} ATTACH PARTITION {partition} FOR VALUES FROM ({lo}) TO ({hi});

-- name: partition_detach
-- Waits at most lock_timeout for the readers and writers of the table (then: the next pass).
ALTER TABLE {parent} DETACH PARTITION {partition};

-- name: partition_drop
DROP TABLE {partition};

-- name: table_analyze
-- The table's size (pg_class.relpages, reltuples), which makes every session plan it again, and
-- its id's statistics: 27 ms for 50,000 jobs, against 377 for every column from the default
-- sample. The other columns keep what they had (autovacuum's ANALYZE fills them in).
ANALYZE {table} (id);

-- name: lock_timeout_short
SET LOCAL lock_timeout = '2s';

-- name: lock_timeout_brief
-- Under deadlock_timeout (1 s): a lock waited for that long cancels autovacuum's work on the
-- table, which statistics_refresh must never do.
SET LOCAL lock_timeout = '500ms';

-- name: transaction_id_if_assigned
-- Read just before COMMIT by a transaction that must learn its outcome if COMMIT loses its
-- answer (PostgresStore._tx's settle): its id (NULL if it wrote nothing), and when the server
-- started, so that a restart since can be told (see transaction_status).
SELECT CAST(CAST(pg_current_xact_id_if_assigned() AS text) AS bigint), pg_postmaster_start_time();

-- name: transaction_status
-- 'committed', 'aborted' or 'in progress'; an id past the server's next one raises (22023): a
-- crash took it back. With when the server started: after a crash the server hands out again the
-- ids whose WAL it lost, so across a restart 'committed' may be another transaction's.
SELECT pg_xact_status(CAST(CAST(:xid AS text) AS xid8)), pg_postmaster_start_time();
