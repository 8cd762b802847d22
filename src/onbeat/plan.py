"""Pure decisions about which executions exist, which start and what becomes of them: first run,
next run, misfires, overlap, jitter, the end of an attempt (finished, released or lost).

Every store backend calls these inside its own transaction, so PostgreSQL and SQLite plan
identically and the rules are tested once, without a database.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from onbeat.model import (
    ExecutionStatus,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.retry import backoff_delay
from onbeat.schedule import Schedule, ScheduleKind

MAX_FIRES_PER_DISPATCH = 10_000
"""Most fire times one dispatch of one execution walks through. After a long outage (an
every-second cron down for days) the walk stops there and the job's next planned execution is the
first fire time not yet recorded, so the next pass goes on from it: every fire time gets its record,
in bounded transactions, and none is jumped over."""


_id_lock = threading.Lock()
_last_id = (0, 0)
_RANDOM_POOL_BYTES = 4096
"""os.urandom is read this many bytes at a time (409 ids): it releases the GIL, and a thread
creating 1,000 jobs that gave it up twice per job waited for it behind the event loop each time
(27 % of a bulk-creating `onbeat api`'s samples, docs/performance.md)."""
_random_pool = b""
_random_used = 0


def new_id() -> str:
    """32 hex chars that sort by creation time: a 48-bit ms timestamp + 80 random bits, where ids
    made in the same millisecond by this process count up from the first (monotonic ULID), so
    keyset pages list jobs in creation order."""
    return new_ids(1)[0]


def new_ids(count: int) -> list[str]:
    """``count`` ids, as ``count`` calls of :func:`new_id` in a row would make them, under one
    hold of the lock: a bulk create took it twice a job, and its threads (each storing its own
    batch) queued for it behind one another's GIL switches (a twelfth of a bulk-creating
    `onbeat api`'s samples, docs/performance.md)."""
    global _last_id
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_tail = _last_id
        if ms <= last_ms:
            ms, tail = last_ms, last_tail + 1
        else:
            tail = _random_80_bits()
        _last_id = (ms, tail + count - 1)
    prefix = f"{ms:012x}"
    return [f"{prefix}{t % 2**80:020x}" for t in range(tail, tail + count)]


def _random_80_bits() -> int:
    """From the pool of random bytes; call under ``_id_lock``."""
    global _random_pool, _random_used
    if _random_used + 10 > len(_random_pool):
        _random_pool, _random_used = os.urandom(_RANDOM_POOL_BYTES), 0
    _random_used += 10
    return int.from_bytes(_random_pool[_random_used - 10 : _random_used])


def _new_ids_after_fork() -> None:
    """A forked child must not count up from its parent's last id nor reuse its random bytes:
    both would make the ids the parent makes next in the same millisecond."""
    global _id_lock, _last_id, _random_pool, _random_used
    _id_lock, _last_id, _random_pool, _random_used = threading.Lock(), (0, 0), b"", 0


os.register_at_fork(after_in_child=_new_ids_after_fork)


def shard_of(job_id: str, shard_count: int) -> int:
    return int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=4).digest()) % shard_count


def jitter_offset(execution_id: str, jitter: float) -> timedelta:
    """A deterministic offset in [0, jitter): the same execution always lands at the same instant."""
    if jitter <= 0:
        return timedelta(0)
    fraction = (
        int.from_bytes(hashlib.blake2b(execution_id.encode(), digest_size=8).digest()) / 2**64
    )
    return timedelta(seconds=fraction * jitter)


@dataclass(frozen=True, slots=True)
class PlannedExecution:
    """An execution a store should insert (idempotently, on job_id + scheduled_for + trigger)."""

    id: str
    scheduled_for: datetime
    due_at: datetime
    status: ExecutionStatus
    trigger: Trigger = Trigger.SCHEDULE
    reason: str | None = None
    catchup: bool = False
    """Runs although its fire time was missed (the misfire policy chose it)."""


def planned(
    scheduled_for: datetime,
    jitter: float,
    status: ExecutionStatus = ExecutionStatus.SCHEDULED,
    trigger: Trigger = Trigger.SCHEDULE,
    reason: str | None = None,
    catchup: bool = False,
    execution_id: str | None = None,
) -> PlannedExecution:
    """``execution_id``: one made by :func:`new_ids` for it (default: a new one)."""
    execution_id = new_id() if execution_id is None else execution_id
    due_at = scheduled_for + jitter_offset(execution_id, jitter)
    return PlannedExecution(execution_id, scheduled_for, due_at, status, trigger, reason, catchup)


def first_execution(
    schedule: Schedule,
    jitter: float,
    now: datetime,
    queue_within: float | None = None,
    execution_id: str | None = None,
) -> PlannedExecution | None:
    """The execution created together with a job (None for a cron that never fires again).

    With ``queue_within`` (seconds), a one-shot run due from ``now`` to that far ahead is created
    ``queued``, for its submitter to hand to the delay queue: its dispatch would have nothing to
    decide (it is on time, and no fire time follows it), only a write to make and a queue to feed.
    A cron run (whose dispatch plans the next fire) and a run already late (the misfire policy's
    to judge) are left ``scheduled`` for the dispatch. ``execution_id``: as :func:`planned`'s."""
    fire = schedule.first_fire(now)
    if fire is None:
        return None
    if schedule.kind is ScheduleKind.CRON:
        return planned(fire, jitter, execution_id=execution_id)
    on_time = queue_within is not None and now <= fire <= now + timedelta(seconds=queue_within)
    status = ExecutionStatus.QUEUED if on_time else ExecutionStatus.SCHEDULED
    return planned(fire, 0.0, status, execution_id=execution_id)


@dataclass(frozen=True, slots=True)
class Misfire:
    """The misfire policy's verdict on one fire time: run it (``catchup`` when it was missed) or
    skip it with ``reason``."""

    run: bool
    catchup: bool = False
    reason: str | None = None


ON_TIME = Misfire(run=True)


def misfire_verdict(
    policy: MisfirePolicy,
    catchup_window: float,
    fire: datetime,
    late_since: datetime,
    next_fire: datetime | None,
    now: datetime,
    misfire_grace: float,
) -> Misfire:
    """Whether a fire time runs. It is *missed* when ``late_since`` (its due time, or when it was
    queued if later) is more than ``misfire_grace`` seconds ago. Then ``skip`` skips it; ``run_all``
    runs it if the fire time is within ``catchup_window``; ``run_once`` runs only the most recent
    missed fire time (``next_fire`` is not missed too), as Kubernetes CronJob and APScheduler's
    coalesce do: the state a catch-up produces is the freshest, and the older ones are recorded as
    covered by it."""
    grace_line = now - timedelta(seconds=misfire_grace)
    if late_since >= grace_line:
        return ON_TIME
    late = f"fire time missed by {(now - fire).total_seconds():.0f}s"
    if policy is MisfirePolicy.RUN_ALL:
        if fire >= now - timedelta(seconds=catchup_window):
            return Misfire(run=True, catchup=True)
        return Misfire(False, reason=f"misfire (run_all): {late}, outside the catch-up window")
    if policy is MisfirePolicy.RUN_ONCE:
        if next_fire is None or next_fire >= grace_line:
            return Misfire(run=True, catchup=True)
        return Misfire(False, reason=f"misfire (run_once): {late}; a later catch-up run covers it")
    return Misfire(False, reason=f"misfire (skip): {late}")


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """What dispatching one due execution of a job means.

    ``current`` is the verdict on the execution itself; ``also`` are further executions (caught-up,
    skipped or upcoming fire times) to insert; ``next_fire`` is the job's next planned execution
    (status scheduled), or None.
    """

    current: Misfire
    also: list[PlannedExecution]
    next_fire: PlannedExecution | None


def plan_dispatch(
    schedule: Schedule,
    misfire: MisfirePolicy,
    catchup_window: float,
    jitter: float,
    scheduled_for: datetime,
    due_at: datetime,
    first_dispatch: bool,
    materialize_next: bool,
    now: datetime,
    window: float,
    misfire_grace: float,
    next_recorded: datetime | None = None,
) -> DispatchPlan:
    """Decide the fate of an execution picked for dispatch, and of the fire times after it.

    Only a scheduled run's ``first_dispatch`` (not a retry, not a manual run) can be a misfire, and
    lateness counts from ``due_at``, which a release, a replay, a resume or an overlap wait moves to
    "now": those runs are late on purpose. Fire times up to ``now + window`` are planned in the same
    pass, so an every-second cron never waits for the next pass; at most
    ``MAX_FIRES_PER_DISPATCH`` of them, after which ``next_fire`` is the first one not walked.
    ``next_recorded`` is the job's next fire time that already has a record, if any: for a run
    planned under an earlier schedule it, not the schedule in force, says what came next.
    """
    cron = schedule.kind is ScheduleKind.CRON
    after_current = schedule.next_fire_after(scheduled_for) if cron else None
    current = ON_TIME
    if first_dispatch:
        following = next_recorded or after_current
        current = misfire_verdict(
            misfire, catchup_window, scheduled_for, due_at, following, now, misfire_grace
        )
    also: list[PlannedExecution] = []
    next_fire: PlannedExecution | None = None
    if materialize_next and cron:
        horizon = now + timedelta(seconds=window)
        fire = after_current
        while fire is not None and fire <= horizon and len(also) < MAX_FIRES_PER_DISPATCH:
            following = schedule.next_fire_after(fire)
            verdict = misfire_verdict(
                misfire, catchup_window, fire, fire, following, now, misfire_grace
            )
            if verdict.run:
                also.append(planned(fire, jitter, ExecutionStatus.QUEUED, catchup=verdict.catchup))
            else:
                also.append(planned(fire, jitter, ExecutionStatus.SKIPPED, reason=verdict.reason))
            fire = following
        if fire is not None:
            next_fire = planned(fire, jitter)
    return DispatchPlan(current, also, next_fire)


def plan_missed_while_paused(
    schedule: Schedule, after: datetime, grace_line: datetime, jitter: float
) -> tuple[list[PlannedExecution], datetime | None]:
    """On resume: every fire time after ``after`` and before ``grace_line`` passed while the job was
    paused and is recorded as skipped (a skip is never silent); returns them and the first fire
    time from ``grace_line`` on, which still runs."""
    skipped: list[PlannedExecution] = []
    fire = schedule.next_fire_after(after)
    while fire is not None and fire < grace_line:
        skipped.append(planned(fire, jitter, ExecutionStatus.SKIPPED, reason=PAUSED_AT_FIRE_TIME))
        fire = schedule.next_fire_after(fire)
    return skipped, fire


PAUSED_AT_FIRE_TIME = "job was paused at its fire time"


def skip_cause(reason: str) -> str:
    """The cause of a skip, from its reason, as a metric label: misfire, overlap, paused, other."""
    if reason.startswith("misfire"):
        return "misfire"
    if reason.startswith("overlap"):
        return "overlap"
    return "paused" if reason == PAUSED_AT_FIRE_TIME else "other"


OVERLAP_QUEUE_RECHECK = 0.5
"""Seconds until a run waiting for a running predecessor is checked again, in case nothing wakes
it: a store makes a job's waiting runs due at once when one of its runs finishes."""
BACKLOG_LATENESS = 1.0
"""Seconds late from which a run checks that no earlier fire time of its job is still pending."""
WAITING = "waiting for "
"""How the reason of every run waiting for a predecessor starts (stores find them by it)."""


@dataclass(slots=True)  # not frozen: built for every run claimed, and frozen costs 30 % more
class ClaimCandidate:
    """A queued execution a worker asks to start, with what the decision needs of its job."""

    id: str
    job_id: str
    trigger: Trigger
    attempt: int
    catchup: bool
    scheduled_for: datetime
    due_at: datetime
    queued_at: datetime | None
    priority: int
    job_status: JobStatus
    overlap: OverlapPolicy
    misfire: MisfirePolicy
    catchup_window: float
    shard: int = 0

    @property
    def late_since(self) -> datetime:
        """Lateness counts from the later of its due time and its hand-over to the queue: a run
        dispatched late on purpose (released, resumed, caught up) is not a misfire again."""
        return max(self.due_at, self.queued_at) if self.queued_at else self.due_at


@dataclass(slots=True)
class RunningRun:
    id: str
    started_at: datetime


@dataclass
class ClaimPlan:
    start: list[ClaimCandidate] = field(default_factory=list)
    start_ahead: list[ClaimCandidate] = field(default_factory=list)
    """Not due yet, but nothing can decide them differently by their due time: claimed now,
    started by the worker at that time once it confirms them (``execution_confirm``)."""
    catchup: list[str] = field(default_factory=list)
    """Started although their fire time was missed (the misfire policy chose them)."""
    end: list[tuple[ClaimCandidate, ExecutionStatus, str]] = field(default_factory=list)
    defer: list[tuple[ClaimCandidate, datetime, str]] = field(default_factory=list)
    """Back to scheduled, due again at the given time, with the reason it waits."""
    not_due: list[ClaimCandidate] = field(default_factory=list)
    replaced: dict[str, list[str]] = field(default_factory=dict)
    """Newer execution id -> running executions it cancels (overlap=replace)."""


def plan_claim(
    candidates: Sequence[ClaimCandidate],
    running: Mapping[str, Sequence[RunningRun]],
    newest_missed: Mapping[str, datetime],
    now: datetime,
    misfire_grace: float,
    earlier_pending: Mapping[str, tuple[datetime, str]] | None = None,
    ahead_until: datetime | None = None,
    first_pending: Mapping[str, str] | None = None,
) -> ClaimPlan:
    """Decide, for executions a worker asks to start, which start now; the one place where a run
    starts, so the misfire and overlap policies are applied here whatever path led to it.

    - **Misfire** (a schedule run's first start, late by more than ``misfire_grace``, e.g. it sat
      in a queue lost in an outage): the job's misfire policy rules, as at dispatch; for
      ``run_once`` only the job's most recent missed fire time runs (``newest_missed``: job id ->
      its newest recorded fire time older than the grace line).
    - **Overlap** is judged against the job's runs that were already running at this run's fire
      time. A run that started *after* this one's fire time is a backlog ahead of it (a stall, a
      catch-up, an earlier run of the same batch): this run waits for it, whatever the policy
      (except ``allow``), so a backlog runs in fire-time order and the first catch-up does not get
      every later fire time skipped as "overlapping". A run started in this same batch counts
      as started now. A late run (due ``BACKLOG_LATENESS`` ago) also waits while ``earlier_pending``
      (job id -> its earliest due pending fire time and run) names an earlier fire time of its job
      that is not in this batch, whatever order the queue hands a backlog out in.
    - **Ahead** (``ahead_until``): a run due by then is claimed ahead only if its start at its due
      time depends on nothing that could change until then: it is its job's earliest pending
      run (``first_pending``: job id -> that run's id), no run of its job is running or claimed
      before it in this batch (overlap, backlog), and it is not late (no misfire). Any other is
      handed back as not due, as without a horizon.
    """
    plan = ClaimPlan()
    pending = earlier_pending or {}
    in_batch = {run.id for run in candidates} if pending else set()
    busy = {job_id: list(runs) for job_id, runs in running.items()}
    backlog: dict[str, str] = {}
    """job id -> a run of it waiting in this batch: its later fire times wait behind it."""
    grace_line = now - timedelta(seconds=misfire_grace)
    recheck = now + timedelta(seconds=OVERLAP_QUEUE_RECHECK)
    for run in sorted(candidates, key=lambda r: (r.scheduled_for, r.due_at, r.id)):
        if run.job_status is JobStatus.CANCELLED:
            plan.end.append((run, ExecutionStatus.CANCELLED, "job cancelled"))
            continue
        if run.job_status is JobStatus.PAUSED:
            plan.defer.append((run, run.due_at, "held: job paused"))
            continue
        if run.due_at > now:
            free = not busy.get(run.job_id) and run.job_id not in backlog
            first = (first_pending or {}).get(run.job_id)
            if free and first == run.id and ahead_until is not None and run.due_at <= ahead_until:
                busy.setdefault(run.job_id, []).append(RunningRun(run.id, run.due_at))
                plan.start_ahead.append(run)
                continue
            plan.not_due.append(run)
            continue
        catchup = run.catchup
        if (
            run.trigger is Trigger.SCHEDULE
            and run.attempt == 0
            and not run.catchup
            and run.late_since < grace_line
        ):
            newer = newest_missed.get(run.job_id)
            verdict = misfire_verdict(
                run.misfire,
                run.catchup_window,
                run.scheduled_for,
                run.late_since,
                newer if newer is not None and newer > run.scheduled_for else None,
                now,
                misfire_grace,
            )
            if not verdict.run:
                plan.end.append((run, ExecutionStatus.SKIPPED, verdict.reason or "misfire"))
                continue
            catchup = verdict.catchup
        others = busy.setdefault(run.job_id, [])
        earlier = pending.get(run.job_id)
        waiting = backlog.get(run.job_id)
        if earlier and earlier[0] < run.scheduled_for and earlier[1] not in in_batch:
            waiting = waiting or earlier[1]
        wait_reason = skip_reason = None
        if others or waiting:
            wait_reason, skip_reason = _overlap(run, others, waiting)
        if skip_reason is not None:
            plan.end.append((run, ExecutionStatus.SKIPPED, skip_reason))
            continue
        if catchup and not run.catchup:
            plan.catchup.append(run.id)  # a run waiting its turn stays the chosen catch-up
        if wait_reason is not None:
            plan.defer.append((run, recheck, wait_reason))
            backlog.setdefault(run.job_id, run.id)
            continue
        if run.overlap is OverlapPolicy.REPLACE and others:
            plan.replaced[run.id] = [b.id for b in others]
            others.clear()
        others.append(RunningRun(run.id, now))
        plan.start.append(run)
    return plan


def _overlap(
    run: ClaimCandidate, others: Sequence[RunningRun], waiting: str | None
) -> tuple[str | None, str | None]:
    """(why ``run`` waits, why it is skipped), both None when it may start. ``others`` are the
    job's running runs, ``waiting`` an earlier run of the job waiting in this batch."""
    if run.overlap is OverlapPolicy.ALLOW:
        return None, None
    if waiting is not None:
        return f"{WAITING}execution {waiting}, an earlier fire time of this job", None
    overlapping = [b for b in others if b.started_at < run.scheduled_for]
    if overlapping and run.overlap is OverlapPolicy.SKIP:
        return None, f"overlap=skip: execution {overlapping[0].id} of this job was still running"
    if overlapping and run.overlap is OverlapPolicy.QUEUE:
        return f"{WAITING}execution {overlapping[0].id} (overlap=queue)", None
    ahead = [b for b in others if b.started_at >= run.scheduled_for]
    if ahead:
        return f"{WAITING}execution {ahead[0].id}, which started after this fire time", None
    return None, None


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What becomes of a run when its attempt ends."""

    status: ExecutionStatus
    due_in: float | None = None
    """Seconds from now until it is due again (a retry or a release); None keeps its due time."""
    reason: str | None = None
    uncount: bool = False
    """The attempt does not count against ``max_attempts`` (a stopping worker released it)."""


def plan_finish(
    *,
    succeeded: bool,
    released: bool,
    job_cancelled: bool,
    attempt: int,
    retry_in: float | None,
) -> AttemptEnd:
    """An attempt its worker ended: succeeded; released by its worker, stopping or with a task
    blocking its event loop (due again at once, not counted); cancelled with its job; retried
    after ``retry_in`` seconds (the worker chose the backoff); or, with no retry left, failed and
    dead-lettered."""
    if succeeded:
        return AttemptEnd(ExecutionStatus.SUCCEEDED)
    if released:
        return AttemptEnd(
            ExecutionStatus.SCHEDULED, 0.0, "released by its worker, not finished", uncount=True
        )
    if job_cancelled:
        return AttemptEnd(ExecutionStatus.CANCELLED, reason="job cancelled")
    if retry_in is not None:
        return AttemptEnd(
            ExecutionStatus.SCHEDULED, retry_in, f"retry after attempt {attempt} failed"
        )
    return AttemptEnd(ExecutionStatus.FAILED)


def plan_reap(*, job_cancelled: bool, attempt: int, retry: RetryPolicy) -> AttemptEnd:
    """An attempt whose lease expired (its worker died or stalled): the attempt counts; the run is
    queued again after its backoff (the reaper enqueues it, so no shard takeover is needed to run
    it), cancelled with its job, or failed after its last attempt."""
    if job_cancelled:
        return AttemptEnd(ExecutionStatus.CANCELLED, reason="job cancelled")
    if attempt >= retry.max_attempts:
        return AttemptEnd(ExecutionStatus.FAILED)
    return AttemptEnd(
        ExecutionStatus.QUEUED,
        backoff_delay(retry, attempt),
        f"retry after attempt {attempt} was lost",
    )
