"""Pure decisions about which executions exist: first run, next run, misfires, jitter, retries.

Every store backend calls these inside its own transaction, so PostgreSQL and SQLite plan
identically and the rules are tested once, without a database.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from onbeat.model import ExecutionStatus, MisfirePolicy, Trigger
from onbeat.schedule import Schedule, ScheduleKind

MAX_MISSED_RECORDED = 100_000
"""Bound on the fire times one dispatch walks through after a long outage (every-second cron, days down)."""


_id_lock = threading.Lock()
_last_id = (0, 0)


def new_id() -> str:
    """32 hex chars that sort by creation time: a 48-bit ms timestamp + 80 random bits, where ids
    made in the same millisecond by this process count up from the first (monotonic ULID), so
    keyset pages list jobs in creation order."""
    global _last_id
    with _id_lock:
        ms, tail = time.time_ns() // 1_000_000, int.from_bytes(os.urandom(10))
        last_ms, last_tail = _last_id
        if ms <= last_ms:
            ms, tail = last_ms, last_tail + 1
        _last_id = (ms, tail)
    return f"{ms:012x}{tail % 2**80:020x}"


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


def planned(
    scheduled_for: datetime,
    jitter: float,
    status: ExecutionStatus = ExecutionStatus.SCHEDULED,
    trigger: Trigger = Trigger.SCHEDULE,
    reason: str | None = None,
) -> PlannedExecution:
    execution_id = new_id()
    due_at = scheduled_for + jitter_offset(execution_id, jitter)
    return PlannedExecution(execution_id, scheduled_for, due_at, status, trigger, reason)


def first_execution(schedule: Schedule, jitter: float, now: datetime) -> PlannedExecution | None:
    """The execution created together with a job (None for a cron that never fires again)."""
    fire = schedule.first_fire(now)
    if fire is None:
        return None
    return planned(fire, jitter if schedule.kind is ScheduleKind.CRON else 0.0)


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """What dispatching one due execution of a job means.

    ``run_current`` False means the current execution is skipped with ``skip_reason``.
    ``also`` are further executions (caught-up, skipped or upcoming fire times) to insert;
    ``next_fire`` is the job's next planned execution (status scheduled), or None.
    """

    run_current: bool
    skip_reason: str | None
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
) -> DispatchPlan:
    """Decide the fate of an execution picked for dispatch, and of the fire times after it.

    A run is *missed* when it is first dispatched more than ``misfire_grace`` seconds after its
    ``due_at``: no scheduler was running to dispatch it. Lateness is measured from ``due_at``, which
    a release, a replay, a resume or an overlap wait moves to "now": those runs are late on purpose.
    Only a scheduled run's ``first_dispatch`` (not a retry, not a manual run) can be a misfire. Fire times up to ``now + window`` are dispatched in the same pass, so
    an every-second cron never waits for the next pass.
    """
    grace_line = now - timedelta(seconds=misfire_grace)
    catchup_line = now - timedelta(seconds=catchup_window)
    current_missed = first_dispatch and due_at < grace_line

    def missed_reason(fire: datetime) -> str:
        late = (now - fire).total_seconds()
        return f"misfire ({misfire.value}): fire time missed by {late:.0f}s while no scheduler ran"

    run_current, skip_reason = True, None
    if current_missed and (
        misfire is MisfirePolicy.SKIP
        or (misfire is MisfirePolicy.RUN_ALL and scheduled_for < catchup_line)
    ):
        run_current, skip_reason = False, missed_reason(due_at)

    also: list[PlannedExecution] = []
    next_fire: PlannedExecution | None = None
    if materialize_next and schedule.kind is ScheduleKind.CRON:
        horizon = now + timedelta(seconds=window)
        caught_up = run_current and current_missed
        fire = schedule.next_fire_after(scheduled_for)
        while fire is not None and fire <= horizon and len(also) < MAX_MISSED_RECORDED:
            missed = fire < grace_line
            if (
                not missed
                or (misfire is MisfirePolicy.RUN_ALL and fire >= catchup_line)
                or (misfire is MisfirePolicy.RUN_ONCE and not caught_up)
            ):
                caught_up = caught_up or missed
                also.append(planned(fire, jitter, ExecutionStatus.QUEUED))
            else:
                reason = missed_reason(fire)
                if misfire is MisfirePolicy.RUN_ONCE:
                    reason += "; covered by one catch-up run"
                also.append(planned(fire, jitter, ExecutionStatus.SKIPPED, reason=reason))
            fire = schedule.next_fire_after(fire)
        if fire is not None and fire <= horizon:  # hit MAX_MISSED_RECORDED: jump to the present
            fire = schedule.next_fire_after(grace_line)
        if fire is not None:
            next_fire = planned(fire, jitter)
    return DispatchPlan(run_current, skip_reason, also, next_fire)


def plan_missed_while_paused(
    schedule: Schedule, after: datetime, now: datetime, jitter: float
) -> tuple[list[PlannedExecution], PlannedExecution | None]:
    """On resume: every fire time after ``after`` that passed while the job was paused, recorded
    as skipped (a skip is never silent), and the first fire time still ahead."""
    skipped: list[PlannedExecution] = []
    fire = schedule.next_fire_after(after)
    while fire is not None and fire <= now and len(skipped) < MAX_MISSED_RECORDED:
        skipped.append(planned(fire, jitter, ExecutionStatus.SKIPPED, reason=PAUSED_AT_FIRE_TIME))
        fire = schedule.next_fire_after(fire)
    if fire is not None and fire <= now:
        fire = schedule.next_fire_after(now)
    return skipped, (planned(fire, jitter) if fire is not None else None)


PAUSED_AT_FIRE_TIME = "job was paused at its fire time"
