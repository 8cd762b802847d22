"""The Store seam: the source of truth, one interface for every backend.

Methods are grouped by the role that calls them (API, scheduler, worker) and named noun first
(``execution_claim``). Every method is one transaction. Time-dependent conditions (due, lease
expiry) use the *store's* clock, never the caller's, so node clock skew cannot fire a run early
or expire a healthy lease. Hot-path methods take and return batches.

Methods are synchronous: database drivers release the GIL, and the async services call them through
``asyncio.to_thread``, a handful of times per batch rather than per execution.

Concurrency is part of the contract: any number of processes call any method on one database at
once, and no backend may count on a single writer. Each method says on its ``Concurrency:`` line
what holds then (``onbeat.testing.store_contract_concurrency`` races them). The rule behind them:
a method that reads, decides and writes re-checks at write time what it decided on (a conditional
UPDATE and its RETURNING, a row lock, a unique key), so a change that commits in between wins and
is never undone or applied twice. Reads see committed writes only, statement by statement: a read
made of several statements (a run, then its attempts) is not one snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from onbeat.auth import ApiKey
from onbeat.limits import NO_LIMITS, LimitDefaults, TenantLimits, Usage
from onbeat.model import (
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobEvent,
    JobStatus,
)
from onbeat.queue.base import QueueItem
from onbeat.store.records import (
    AHEAD_LEASE_GRACE,
    MAX_SEARCH_TASKS,
    ActivityBucket,
    AlertKind,
    ClaimedRun,
    ClaimResult,
    Completion,
    CreatedJob,
    DispatchParams,
    HistoryUpkeep,
    JobChanges,
    JobCursor,
    NewJob,
    PendingAlert,
    PublishedTask,
    SchedulerShards,
    ShardLeases,
    SweepCursor,
    SweepPage,
    TaskDefaults,
    WorkerLoad,
    delay_class,
    delay_class_floor,
)

__all__ = [
    "AHEAD_LEASE_GRACE",
    "MAX_SEARCH_TASKS",
    "ActivityBucket",
    "AlertKind",
    "ClaimResult",
    "ClaimedRun",
    "Completion",
    "CreatedJob",
    "DispatchParams",
    "HistoryUpkeep",
    "JobChanges",
    "JobCursor",
    "NewJob",
    "PendingAlert",
    "PublishedTask",
    "SchedulerShards",
    "ShardLeases",
    "Store",
    "SweepCursor",
    "SweepPage",
    "TaskDefaults",
    "WorkerLoad",
    "delay_class",
    "delay_class_floor",
]


class Store(Protocol):
    shard_count: int
    on_skipped: Callable[[Mapping[str, int]], None] | None
    """Told, after each commit that skipped fire times, how many by cause (misfire, overlap,
    paused, other): the process counts them in its metrics."""

    def close(self) -> None:
        """Concurrency: closes this object's own connections; other stores on the database go on."""
        ...

    def ping(self) -> None:
        """One round trip to the store; StoreUnavailableError if it cannot be reached. (``now``
        is no such test: PostgreSQL's carries the server's time forward without asking it.)

        Concurrency: reads nothing."""
        ...

    def now(self) -> datetime:
        """The store's clock (the database server's time where it has one).

        Concurrency: every store on one database decides due times and lease expiry by this one
        clock, so two processes never disagree on whether a lease has expired."""
        ...

    wakes_other_processes: bool
    """Whether ``notify_dispatch`` reaches schedulers in other processes (PostgreSQL)."""

    def notify_dispatch(self) -> None:
        """Tell the schedulers of other processes that work is due within their window, right
        after a submission committed (PostgreSQL: a NOTIFY they LISTEN for, see
        ``onbeat.dispatch_wake``). Where no other process can listen (SQLite) it does nothing.

        Concurrency: a signal, not a write; a lost one costs one poll interval."""
        ...

    def session_end_stalled(self) -> int:
        """End onbeat's database sessions (of this store's database and user, holding onbeat's
        session marker) that have waited for their client inside a transaction for longer than
        the store's idle-in-transaction timeout, and return how many. Such a session belongs to
        a process frozen inside a pipeline or right after one (``kill -STOP``, a VM pause),
        which the server's own idle-in-transaction timeout does not end, and the row locks it
        holds (a scheduler's lease rows, the fleet's in-flight counter) would stall others until
        it thawed. Where sessions cannot stall so (SQLite: one process) it does nothing and
        returns 0.

        Concurrency: two callers may pick the same session; it is ended once, and both count it."""
        ...

    def write_refusal(self) -> str | None:
        """Why the store refuses writes, or None if it accepts them. Every method that writes
        raises StoreWriteRefusedError (nothing changed) when the database refuses the write
        (disk full, read-only, I/O error); from then on this probes with a write of its own,
        until one succeeds. While nothing was refused it answers without touching the disk.

        Concurrency: per store object; a probe is a transaction of its own and leaves nothing."""
        ...

    # --- API role -------------------------------------------------------------------------
    def job_create(self, new: NewJob) -> CreatedJob:
        """Insert the job and its first execution in one transaction (``replayed`` False). With an
        idempotency key already used by the tenant for the same submission, return that job with
        ``replayed`` True instead; if the key was used for a different submission, raise
        ValidationError naming ``Idempotency-Key``.

        Concurrency: the key is looked up where the job is inserted (unique key, one transaction):
        of concurrent creates under one key exactly one inserts; the others replay its job."""
        ...

    def job_create_many(
        self, news: Sequence[NewJob], queue_within: float | None = None
    ) -> list[CreatedJob]:
        """``job_create`` for many jobs in one transaction (one statement per kind of row, not per
        job), answering in the order given. A key used twice in the batch returns the job of its
        first use (``replayed``), as two separate submissions would.

        ``queue_within`` (seconds): a new one-shot job's first run due from now to that far ahead
        is created ``queued`` (``plan.first_execution``) and returned as ``CreatedJob.queued``:
        the caller hands it to the delay queue, in place of a dispatch. Should the caller never
        do so (a crash, the queue down), the sweep finds it queued and missing from the queue.

        Concurrency: as ``job_create``, per key."""
        ...

    def job_get(self, job_id: str) -> Job | None:
        """The job; UnreadableRecordError if its stored values cannot be decoded or fail
        ``onbeat.validation.check_job`` (a row written behind the store's back).

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def job_list(
        self,
        *,
        tenant: str | None = None,
        status: JobStatus | None = None,
        task: str | None = None,
        after_id: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Up to ``limit`` jobs in id order (which is creation order), starting after
        ``after_id``. A job ``job_get`` would find unreadable is logged and left out (the rows
        after it still fill the page), so one bad row never breaks a listing.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def job_update(self, job_id: str, changes: JobChanges) -> Job:
        """Edit a job. With a new schedule, the old one's fire times up to now keep their runs
        (those a stalled scheduler never planned get one), its later ones, never due, are deleted,
        and the new schedule's first fire time without a run becomes the job's next planned run;
        other fields apply to every run that starts afterwards.

        Concurrency: serialised with the job's other writes (edit, pause, dispatch, claim) by a
        lock on the job: it keeps one planned run, at a fire time of the schedule in force. A run
        a claim or confirm that committed first started, started before the edit's instant."""
        ...

    def job_pause(self, job_id: str) -> Job:
        """Stop dispatching the job's runs; pending executions wait, running ones finish.

        Concurrency: serialised with the job's other writes: a claim or confirm that commits
        after it holds the run back; one that committed before it started the run before the
        pause's instant."""
        ...

    def job_resume(self, job_id: str, misfire_grace: float) -> Job:
        """Dispatch again. A cron run whose time passed while paused is skipped (recorded) and the
        next future fire is planned; a one-shot run still pending runs now.

        Concurrency: serialised with the job's other writes; resuming a job that is no longer
        paused changes nothing, so of concurrent resumes one records the missed fire times."""
        ...

    def job_cancel(self, job_id: str) -> Job:
        """Make the job inactive for good; its pending executions are cancelled.

        Concurrency: serialised with the job's other writes: a run a claim or confirm started
        first started before the cancel's instant and runs on (it is not retried); no claim or
        confirm that commits after it starts one."""
        ...

    def job_run_now(self, job_id: str) -> Execution:
        """A ``manual`` execution due now, subject to the job's overlap policy when it starts.

        Concurrency: every call inserts a run of its own, however many arrive in one instant."""
        ...

    def execution_get(self, execution_id: str) -> Execution | None:
        """The execution with its per-attempt history.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_list(
        self,
        job_id: str,
        *,
        status: ExecutionStatus | None = None,
        before_id: str | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """A job's executions, newest fire time first, with their attempts.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def dead_letter_list(
        self, *, tenant: str | None = None, after_id: str | None = None, limit: int = 100
    ) -> list[DeadLetter]:
        """Concurrency: a read of committed state (see the module docstring)."""
        ...

    def dead_letter_replay(self, execution_id: str) -> Execution:
        """Put a dead-lettered execution back to run now with a fresh set of attempts.

        Concurrency: conditional on the dead letter still being there: of concurrent replays (or
        a replay and a drop) one succeeds, the others raise NotFoundError."""
        ...

    def dead_letter_drop(self, execution_id: str) -> None:
        """Concurrency: conditional on the dead letter being there, as ``dead_letter_replay``."""
        ...

    def job_events(self, job_id: str) -> list[JobEvent]:
        """The job's creation, pauses, resumes, schedule changes and cancellation, oldest first.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_fire_records(
        self, job_id: str, since: datetime, until: datetime
    ) -> list[tuple[datetime, ExecutionStatus]]:
        """(scheduled_for, status) of the job's schedule-triggered runs fired in [since, until].

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    # --- API keys ---------------------------------------------------------------------------
    def api_key_insert(self, key: ApiKey, key_hash: str) -> None:
        """Concurrency: a plain insert; a key id used already fails, never overwrites."""
        ...

    def api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        """The active (not revoked) key with that hash.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def api_key_list(self) -> list[ApiKey]:
        """Concurrency: a read of committed state (see the module docstring)."""
        ...

    def api_key_revoke(self, key_id: str) -> bool:
        """Revoke an active key; False if there is no active key with that id.

        Concurrency: conditional on the key being active: of concurrent revokes one answers True."""
        ...

    def api_key_count_active(self) -> int:
        """Concurrency: a read of committed state (see the module docstring)."""
        ...

    # --- scheduler role -------------------------------------------------------------------
    def shard_acquire(self, owner: str, lease_ttl: float) -> ShardLeases:
        """Register ``owner`` as alive, renew its leases, take free or expired shards up to its fair
        share (shards / live schedulers) and release any above it. A taken shard's epoch grows.

        Concurrency: a shard is taken only if free or expired at write time, and its epoch grows
        then, so two schedulers never hold one shard at one epoch."""
        ...

    def shard_release(self, owner: str) -> None:
        """Give up every shard ``owner`` holds, and its registration (a scheduler stopping).

        Concurrency: frees only what ``owner`` still holds at write time; a dispatch of its in
        flight then writes nothing (fenced, see ``execution_dispatch``)."""
        ...

    def execution_dispatch(self, params: DispatchParams) -> list[QueueItem]:
        """Move executions due within the window in the held shards from scheduled to queued,
        applying misfire policies and materialising each cron job's next execution in the same
        transaction. Returns what to put in the delay queue.

        Concurrency: fenced by the shard lease and epoch re-read at commit, so a shard released or
        taken gets no write; concurrent dispatches queue each run once and plan each fire once."""
        ...

    def job_repair_next_runs(
        self, leases: ShardLeases, after: JobCursor | None, limit: int
    ) -> tuple[list[str], JobCursor | None]:
        """The reconciler, one page of ``limit`` active cron jobs of the held shards after
        ``after`` (None: from the first) in (shard, id) order: each must have a planned
        (scheduled) run at its next fire time, or nothing would ever plan its next run. Plans one
        for each job without it (the first fire time from its recorded next fire on that has no
        run yet). Returns the repaired job ids and the cursor of the next page (None after the
        last). A page costs the same whatever the number of jobs (100,000 cron jobs: one range
        read of the index per page).

        Concurrency: the page is read at one snapshot without locks (a job a dispatch is moving
        on is seen before or after it, never half way), so a healthy job costs no write. A job
        found without its next run is then locked and judged again by what is committed, fenced
        by shard epoch at commit as ``execution_dispatch``: one whose next run a dispatch, an
        edit or another reconciler planned meanwhile is not given a second one; one locked by
        another transaction is left to the next pass."""
        ...

    def execution_sweep(
        self,
        leases: ShardLeases,
        shards: Sequence[int],
        overdue_by: float | None,
        limit: int,
        after: SweepCursor | None = None,
    ) -> SweepPage:
        """Up to ``limit`` queued executions of those ``shards`` the leases hold, due more than
        ``overdue_by`` seconds ago (None: every queued one), that no worker started: the queue may
        have lost them, so the caller re-enqueues those its queue lacks. In (shard, due_at, id)
        order from just after ``after``, so a backlog of any size is read a bounded page at a time.
        Used periodically, and on shards just taken over from another scheduler. Reads only.

        Concurrency: a read; a run it returns may start meanwhile, so enqueueing it again is
        harmless (``execution_claim`` starts a run once)."""
        ...

    def execution_reap(self, limit: int, restart_grace: float = 0.0) -> list[Execution]:
        """Up to ``limit`` running executions whose lease expired, in any shard: their worker died
        or stalled. Each becomes queued again, due after its retry backoff (the caller enqueues
        it, so no shard takeover is needed to run it again), or, past its last attempt, failed
        with a dead letter; the lost attempt counts. Safe for any scheduler at any time.

        ``restart_grace``: reap nothing until the database server has been up this long (a
        server that restarts, PostgreSQL's ``pg_postmaster_start_time()``): while it was down no
        holder could renew, so each gets that long (the run lease TTL) to reconnect and
        heartbeat before its lease counts as lost. Leases are measured in the database's time.

        Concurrency: conditional at write time on running, lease still expired, token unchanged: a
        heartbeat or outcome committed first wins (no false rescue); concurrent reaps reap once."""
        ...

    # --- worker role ----------------------------------------------------------------------
    def execution_claim(
        self,
        execution_ids: Sequence[str],
        owner: str,
        lease_ttl: float,
        misfire_grace: float,
        limits: LimitDefaults = NO_LIMITS,
        max_starts: int | None = None,
        ahead: float = 0.0,
        max_ahead: int = 0,
    ) -> ClaimResult:
        """Flip queued executions to running with a lease and a new fencing token, as
        ``plan.plan_claim`` decides: the misfire policy for first starts later than
        ``misfire_grace``, the overlap policy against runs already running at the fire time, a
        backlog in fire-time order. Executions that are cancelled, paused, already running or
        stale are not started; executions not yet due by the store's clock are handed back.
        Then the fleet limits (``limits``: the global cap and the per-tenant defaults; each
        tenant's overrides are the store's) as ``limits.plan_limits`` decides: a run over a cap
        on runs in flight, or whose slot under its tenant's starts/s limit is later, is handed
        back (``not_due``) due when it should be tried again; a slot is written on the run, which
        then starts at it without taking another. The counters of runs in flight are kept right
        whether or not a limit applies. At most ``max_starts`` runs start (the caller's free
        places); others that could are handed back as they were.

        ``ahead`` > 0: up to ``max_ahead`` runs due within ``ahead`` seconds are *claimed ahead*
        when nothing can decide their start differently by their due time (``plan_claim``: its
        job's earliest pending run, nothing of its job running, not under any limit): running
        (counted in flight) but not started (``started_at`` None, no attempt, the token
        unchanged), leased until :data:`AHEAD_LEASE_GRACE` after its due time. The caller starts them at their due time only after
        ``execution_confirm``. An edit of the job (any field) or its cancel makes them pending
        again first; a pause fails their confirm; the reaper queues them again without counting
        an attempt; ``execution_release`` gives them back the same way.

        Concurrency: each run is started by one caller only (queued at write time); the overlap
        check sees every run a claim committed first (a per-job lock), so overlap=skip holds; a
        claim under a limit locks the counters it decides on (the fleet's, then its tenants' by
        name) until it commits, so two claims never both take the last place under a cap or the
        same slot."""
        ...

    def execution_confirm(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        """Start runs ``owner`` claimed ahead (``held``: id -> the token of the claim) now that
        they are due: each still claimed ahead by it under that token, its job active. Its
        attempt begins (``started_at``, attempt, a new fencing token, a lease of ``lease_ttl``
        from now, which the holder's heartbeat renews); returns id -> new token.
        A run missing from the answer must not start (cancelled, edited away, job paused, lost):
        the caller releases what it still holds.

        Concurrency: conditional per run at write time, in one statement: of a confirm and a
        cancel or edit of the job, the first to commit wins; a heartbeat or release with the old
        token after it finds nothing."""
        ...

    def tenant_limits_set(self, tenant: str, limits: TenantLimits) -> None:
        """Set ``tenant``'s own limits (a None field: the fleet's default applies); the next claim
        of its runs obeys them.

        Concurrency: last write wins; a claim that read the old limits finishes under them."""
        ...

    def tenant_limits_get(self, tenant: str) -> TenantLimits:
        """``tenant``'s own limits (all None if it has none).

        Concurrency: a read of committed rows."""
        ...

    def tenant_usage(self, tenant: str) -> Usage:
        """The counters the limits are decided on: ``tenant``'s runs in flight and its arrival
        time under a starts/s limit; ``limits.GLOBAL`` is the whole fleet's row.

        Concurrency: a read of committed rows; every transaction that starts or ends runs
        changes them in the same transaction, so they equal the runs running at any commit."""
        ...

    def execution_heartbeat(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        """Extend the leases of the runs ``owner`` is running (``held``: id -> fencing token), in
        one statement; returns the pairs still held. A run missing from the answer was taken away
        (fenced). Only the named pairs are extended: a run the worker claimed but is not running
        (it lost track of it) keeps its lease deadline, so the reaper frees it.

        Concurrency: conditional per pair on running, ``owner`` and token at write time: committed
        first it keeps the run from the reaper; a run reaped or finished first is left out."""
        ...

    def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
        """Record outcomes, each only if its fencing token is still current; returns the ids
        accepted. A rejected completion is a stale result and must not be retried.

        Concurrency: the accepted ids are those the conditional write changed (running, that
        token), so of a finish and a reap, or two finishes, of one attempt exactly one wins. It
        takes the job's lock first, as a claim does: a claim that found the run still running,
        and defers an overlap=queue run behind it, commits first, and the outcome wakes that run
        (or the claim waits for the outcome and finds the run ended)."""
        ...

    def execution_release(self, owner: str, held: Mapping[str, int]) -> int:
        """Give back runs a worker will not finish (id -> fencing token): it is stopping, or a
        task blocks its event loop and they have not begun. They are due again at once and the
        interrupted attempt does not count.

        Concurrency: as ``execution_finish_many``, conditional on owner, running and token."""
        ...

    def execution_requeue(self, execution_ids: Sequence[str]) -> int:
        """Runs the delay queue handed out to a worker that will not claim them (a task blocks
        its event loop before the claim reached the store): each still queued becomes scheduled
        again at its due time, so the next dispatch hands it to the queue at once instead of the
        sweep after ``sweep_overdue``. Returns how many.

        Concurrency: conditional per run on queued at write time: of a requeue and a claim of
        the run, the first to commit wins (a claim after it finds the run not queued and skips
        it; a claim before it leaves the requeue nothing to do)."""
        ...

    # --- dashboard reads --------------------------------------------------------------------
    # Each is a few index range reads, however many jobs and executions the store holds.
    def job_search(
        self,
        *,
        tenant: str | None,
        status: JobStatus | None = None,
        text: str | None = None,
        after_id: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Up to ``limit`` jobs in id (creation) order after ``after_id``: of ``tenant`` (None:
        every tenant), in ``status`` (None: any), and with ``text``, only those whose id starts
        with it (case-insensitive) or whose task name does. Task names matched are the first
        :data:`MAX_SEARCH_TASKS` that start with ``text``.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_activity(
        self, *, tenant: str | None, since: datetime, until: datetime, bucket: timedelta
    ) -> list[ActivityBucket]:
        """Per ``bucket`` of [since, until), oldest first: the runs that ended in it by status,
        their start delays by :func:`delay_class`, and the queue depth at its end (runs due by
        then that had not started; a retried run's earlier waits are not counted).

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_running_by_owner(self, *, tenant: str | None) -> list[WorkerLoad]:
        """Running executions per lease owner (the workers running them), by owner name.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_backlog(self) -> dict[int, int]:
        """Runs due now or earlier that have not started (scheduled or queued), by priority: the
        queue depth operators watch. The whole store, whoever serves its shards.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def scheduler_shards(self) -> list[SchedulerShards]:
        """Every registered scheduler with the shards it holds now, by owner name.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def dead_letter_count(self, *, tenant: str | None, limit: int) -> int:
        """How many dead letters ``tenant`` (None: every tenant) has, counting up to ``limit``.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def execution_last_of_jobs(self, job_ids: Sequence[str]) -> dict[str, Execution]:
        """Per job, its run with the latest fire time that is running or ended (not planned or
        queued), without attempts; a job with none is left out.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def api_key_get(self, key_id: str) -> ApiKey | None:
        """The active (not revoked) key with that id.

        Concurrency: a read of committed state (see the module docstring)."""
        ...

    def secret_get_or_create(self, name: str, value: str) -> str:
        """The secret stored under ``name``; ``value`` is stored first if there is none, so every
        process on the store uses the one the first of them made.

        Concurrency: insert-if-absent, then read, in one transaction: concurrent first calls all
        answer the value of the one whose insert won."""
        ...

    # --- task catalog: what workers can run, for processes without the user's code ----------
    def task_publish(self, worker: str, tasks: Sequence[TaskDefaults]) -> None:
        """Record that ``worker`` runs ``tasks`` now, with these defaults: each task's entry is
        created or replaced (the last publisher's defaults win) and stamped with the store's
        clock. Workers call it on start and periodically, so the stamp says when a worker that
        has the task was last seen. Entries are never deleted: there is one per task name."""
        ...

    def task_catalog(
        self, seen_within: float, names: Sequence[str] | None = None
    ) -> list[PublishedTask]:
        """The tasks some worker published within the last ``seen_within`` seconds of the store's
        clock, by name; with ``names``, only those of them (unknown names are left out)."""
        ...

    # --- alert outbox: dead letters and skipped fire times, for the webhook ------------------
    def alert_claim(self, limit: int, hold: float) -> list[PendingAlert]:
        """The oldest alerts due for delivery (at most ``limit``), held for ``hold`` seconds: they
        are not due again until then, so a sender that dies mid-delivery leaves them to be sent
        again after the hold, never lost. Each call counts one attempt of each alert it returns.

        Alerts are written by the transactions that record what they report (a dead letter in
        ``execution_finish_many`` and ``execution_reap``; skipped fire times, one alert per job
        and batch of skips, wherever runs are skipped), so an alert exists iff its event committed.

        Concurrency: two senders never hold one alert at once (PostgreSQL: SKIP LOCKED; SQLite:
        one writer)."""
        ...

    def alert_done(self, alert_ids: Sequence[int]) -> None:
        """Forget these alerts: delivered, or given up after their last attempt.

        Concurrency: idempotent; an alert already forgotten is ignored."""
        ...

    def alert_retry(self, retries: Mapping[int, tuple[datetime, str]]) -> None:
        """Alert id -> (when to try it again, why this attempt failed).

        Concurrency: last writer wins; only the sender holding an alert calls it."""
        ...

    # --- planner statistics: the scheduler's timer ---------------------------------------------
    def statistics_refresh(self) -> list[str]:
        """Analyze the hot tables (PostgreSQL: ``jobs``, ``runs``) that take more than twice
        the pages their planner statistics last counted (and at least 32); their names.

        Why: a statement prepared while a table was small keeps its plan (a sequential scan,
        say) until the table is next analyzed, and autovacuum analyzes up to
        ``autovacuum_naptime`` (a minute) late, so a fleet started on a new store read its
        growing tables whole for that minute. SQLite plans from fixed heuristics, whatever a
        table's size: nothing to do.

        Concurrency: one process at a time (PostgreSQL: a try-lock per table); another calling
        it meanwhile skips the rest of its pass. Runs and API calls are not held up (ANALYZE
        takes no lock they wait for)."""
        ...

    # --- history upkeep: the scheduler's timer, and ``onbeat migrate`` ----------------------
    def history_maintain(self, retention_days: int, ahead_days: int) -> HistoryUpkeep:
        """Keep the execution history to size. PostgreSQL: create the day partitions from
        yesterday to today + ``ahead_days`` (the rows of such a day that landed in the DEFAULT
        partition move into it), and detach and drop those of days older than
        ``retention_days``. Every backend: delete, in batches, older runs and attempts that sit
        outside a day partition. A day holding an unresolved dead letter, a run not final yet or
        a run that ended within the retention is kept whole (logged). ``retention_days`` 0 keeps everything. Days are UTC days of
        the fire time, on the store's clock.

        Concurrency: each step is idempotent and runs under a lock of its own (PostgreSQL: an
        advisory lock; a partition is created or dropped only after checking, under it, that
        it is missing or there), so schedulers running it at once create and drop each partition
        once; runs ending meanwhile are never lost (a DETACH waits for their transactions, at
        most ``lock_timeout``, and otherwise leaves the day to the next pass)."""
        ...
