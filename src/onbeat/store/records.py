"""The values the Store seam takes and returns: what a caller passes in (``NewJob``,
``Completion``...) and what a method answers (``ClaimResult``, ``PendingAlert``...), apart from the
model's own ``Job`` and ``Execution``. ``store/base.py`` is the interface that uses them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from onbeat.auth import DEFAULT_TENANT
from onbeat.model import (
    Execution,
    ExecutionStatus,
    Job,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule


@dataclass(frozen=True, slots=True)
class NewJob:
    task: str
    params: dict[str, Any]
    schedule: Schedule
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    misfire: MisfirePolicy = MisfirePolicy.RUN_ONCE
    catchup_window: float = 3600.0
    priority: int = 0
    jitter: float = 0.0
    tenant: str = DEFAULT_TENANT
    idempotency_key: str | None = None
    """With a key, a second submission under it (same tenant, within a day) returns the first job."""


@dataclass(frozen=True, slots=True)
class CreatedJob:
    """What ``Store.job_create`` did: the job, and whether it is an earlier one returned again for
    the same idempotency key (``replayed``) rather than created by this call. ``queued``: its
    first run, created ``queued`` (``queue_within``) for the caller to hand to the delay queue."""

    job: Job
    replayed: bool
    queued: QueueItem | None = None


@dataclass(frozen=True, slots=True)
class JobChanges:
    """Fields of a job to edit; None leaves a field as it is."""

    params: dict[str, Any] | None = None
    schedule: Schedule | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    overlap: OverlapPolicy | None = None
    misfire: MisfirePolicy | None = None
    priority: int | None = None
    jitter: float | None = None


@dataclass(frozen=True, slots=True)
class ShardLeases:
    """The shards one scheduler holds, each with the epoch its writes are fenced by."""

    owner: str
    epochs: Mapping[int, int]
    """shard -> epoch of this owner's lease on it."""
    acquired: frozenset[int]
    """Shards newly taken in this call (their queued executions may be missing from the queue)."""


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """An execution a worker now holds, with what it needs to run it."""

    execution: Execution
    task: str
    params: dict[str, Any]
    timeout: float | None
    retry: RetryPolicy
    replaced: tuple[str, ...] = ()
    """Running executions of the same job cancelled by the ``replace`` overlap policy."""


@dataclass(frozen=True, slots=True)
class ClaimResult:
    started: list[ClaimedRun]
    not_due: list[QueueItem]
    """Released by the queue before the store's clock says they are due: enqueue them again."""
    waiting_jobs: frozenset[str] = frozenset()
    """Jobs with runs sent back to wait for a running predecessor (overlap=queue, a backlog): the
    end of a run of the job makes them due, and a dispatch pass then queues them."""
    held_back: int = 0
    """Runs the fleet limits handed back (in ``not_due``): they took none of the caller's places,
    so its next claim may ask for that many more."""


@dataclass(frozen=True, slots=True)
class Completion:
    execution_id: str
    fencing_token: int
    succeeded: bool
    result: Any = None
    error: str | None = None
    timed_out: bool = False
    retry_in: float | None = None
    """Seconds until the next attempt after a failure; None dead-letters the execution."""


@dataclass(frozen=True, slots=True)
class SweepCursor:
    """Where a page of a sweep ended: the next page starts after this run, in (shard, due_at,
    execution id) order."""

    shard: int
    due_at: datetime
    execution_id: str


@dataclass(frozen=True, slots=True)
class JobCursor:
    """Where a page of the reconciler ended: the next page starts after this job, in (shard, job
    id) order (the order of the index of active cron jobs)."""

    shard: int
    job_id: str


@dataclass(frozen=True, slots=True)
class SweepPage:
    items: list[QueueItem]
    resume: SweepCursor | None
    """Pass it as ``after`` to read the next page; None once the scan reached the end."""


@dataclass(frozen=True, slots=True)
class DispatchParams:
    leases: ShardLeases
    window: float
    """Seconds ahead of now to hand executions to the delay queue."""
    misfire_grace: float
    limit: int


AHEAD_LEASE_GRACE = 2.0
"""Seconds past its due time that a run claimed ahead stays leased, unconfirmed, to its holder
(or the claim's lease TTL if shorter). Its holder does not heartbeat it, so a worker that died
holding runs due in the next seconds, or whose loop is blocked at their instant, frees them to
the reaper this long after their time, not a whole lease TTL later."""
MAX_SEARCH_TASKS = 20
"""Most task names one ``Store.job_search`` text matches (each is one more index read per status)."""


@dataclass(frozen=True, slots=True)
class HistoryUpkeep:
    """What one ``Store.history_maintain`` pass did."""

    created: list[str] = field(default_factory=list)
    """Partitions created (PostgreSQL)."""
    dropped: list[str] = field(default_factory=list)
    """Partitions detached and dropped (PostgreSQL)."""
    kept: list[str] = field(default_factory=list)
    """Days (YYYYMMDD) past the retention kept for a dead letter or a run not final yet."""
    deleted: int = 0
    """Runs deleted one by one (SQLite; PostgreSQL: from the DEFAULT partition)."""


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    start: datetime
    finished: Mapping[ExecutionStatus, int]
    """Runs that reached a final state in the bucket, by that state."""
    start_delays: Mapping[int, int]
    """Of those that started: :func:`delay_class` of (start - due) -> how many."""
    queue_depth: int
    """Runs due by the end of the bucket that had not started by then."""


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    owner: str
    running: int
    """Runs it holds a live lease on."""
    expired: int
    """Runs whose lease it let expire: lost unless it comes back, until the reaper retries them."""


@dataclass(frozen=True, slots=True)
class SchedulerShards:
    owner: str
    shards: int
    last_seen: datetime


def delay_class(microseconds: int) -> int:
    """The class of a delay by its decade and leading digit: class ``9k + d - 1`` holds
    [d, d + 1) x 10^k us (a delay under 1 us is class 0). Counting delays per class keeps the
    last hour's histogram a few hundred rows, from which percentiles are estimated within a
    class (at most 11 % wide from 9 x 10^k on, 100 % below 2 x 10^k)."""
    digits = str(max(microseconds, 1))
    return 9 * (len(digits) - 1) + int(digits[0]) - 1


def delay_class_floor(cls: int) -> int:
    """The smallest delay (us) of class ``cls``; the class ends where ``cls + 1`` begins."""
    floor: int = (cls % 9 + 1) * 10 ** (cls // 9)
    return floor


@dataclass(frozen=True, slots=True)
class TaskDefaults:
    """A registered task as a worker publishes it: its name and default policies, no code."""

    name: str
    retry: RetryPolicy
    timeout: float | None
    is_async: bool


@dataclass(frozen=True, slots=True)
class PublishedTask:
    """A task in the store's catalog, with who published it last and when."""

    name: str
    retry: RetryPolicy
    timeout: float | None
    is_async: bool
    worker: str
    """The worker that published it last."""
    seen_at: datetime
    """When it was last published, by the store's clock."""


AlertKind = Literal["dead_letter", "skipped"]


@dataclass(frozen=True, slots=True)
class PendingAlert:
    """An alert of the outbox, with the job it is about."""

    id: int
    kind: AlertKind
    job_id: str
    tenant: str
    task: str
    payload: Mapping[str, Any]
    """What happened: for a dead letter its execution, attempts and last error; for skips the
    skipped runs (id, fire time, reason)."""
    created_at: datetime
    attempts: int
    """Delivery attempts so far, this one included."""
