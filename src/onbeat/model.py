"""The records onbeat keeps: jobs (definitions), executions (planned runs), attempts and dead letters.

A **job** is what the user submitted; an **execution** is one planned run of it, identified by
(job_id, scheduled_for, trigger). Retries are further attempts of the same execution, each kept in
its history. These dataclasses are what the Store returns and what the Python API hands to users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from onbeat.schedule import Schedule


class JobStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    """A one-shot job whose single execution has reached a final state."""


class ExecutionStatus(StrEnum):
    SCHEDULED = "scheduled"
    """Planned; not yet handed to the delay queue (or waiting to retry / for a busy predecessor)."""
    QUEUED = "queued"
    """In the delay queue; released to a worker at ``due_at``."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Exhausted its attempts; a dead letter records it."""
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    """Deliberately not run (overlap or misfire policy, paused job); ``reason`` says why."""

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset(
    {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.SKIPPED,
    }
)
PENDING_STATUSES = (ExecutionStatus.SCHEDULED, ExecutionStatus.QUEUED)


class Trigger(StrEnum):
    SCHEDULE = "schedule"
    MANUAL = "manual"
    BACKFILL = "backfill"


class OverlapPolicy(StrEnum):
    """What to do when a run is due while an earlier run of the same job is still running."""

    SKIP = "skip"
    QUEUE = "queue"
    ALLOW = "allow"
    REPLACE = "replace"


class MisfirePolicy(StrEnum):
    """What to do with fire times missed while no scheduler was running."""

    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"
    SKIP = "skip"


class AttemptOutcome(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    """The worker stopped heartbeating (died or stalled) and its lease expired."""
    RELEASED = "released"
    """The worker shut down gracefully before the run finished; it does not count as an attempt."""
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_base: float = 1.0
    """Seconds; attempt n waits a random time in [0, min(cap, base * 2**(n-1))] (full jitter)."""
    backoff_cap: float = 300.0


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    task: str
    params: dict[str, Any]
    schedule: Schedule
    retry: RetryPolicy
    timeout: float | None
    overlap: OverlapPolicy
    misfire: MisfirePolicy
    catchup_window: float
    """Seconds: how far back ``run_all`` replays missed fire times; older ones are skipped."""
    priority: int
    jitter: float
    """Seconds: each run is dispatched at scheduled_for + a deterministic offset in [0, jitter)."""
    tenant: str
    status: JobStatus
    next_fire_at: datetime | None
    shard: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    worker: str
    fencing_token: int
    started_at: datetime
    finished_at: datetime | None
    outcome: AttemptOutcome
    error: str | None


@dataclass(frozen=True, slots=True)
class Execution:
    id: str
    job_id: str
    shard: int
    trigger: Trigger
    scheduled_for: datetime
    """The fire time; immutable."""
    due_at: datetime
    """When to dispatch: the fire time plus jitter, or the retry time."""
    status: ExecutionStatus
    attempt: int
    """Attempts started so far (1-based once started)."""
    priority: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    fencing_token: int
    result: Any
    last_error: str | None
    reason: str | None
    """Why the execution was skipped or cancelled, or why it is waiting."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: tuple[Attempt, ...] = field(default=())
    catchup: bool = False
    """Runs although its fire time was missed: the misfire policy chose it as a catch-up."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    execution_id: str
    job_id: str
    task: str
    params: dict[str, Any]
    attempts: int
    last_error: str | None
    created_at: datetime


class JobEventKind(StrEnum):
    CREATED = "created"
    PAUSED = "paused"
    RESUMED = "resumed"
    RESCHEDULED = "rescheduled"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A change in whether and how a job fires; the audit replays them."""

    at: datetime
    kind: JobEventKind
    schedule: Schedule
    """The schedule in force from this event on."""
