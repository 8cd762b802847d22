"""What the API answers, as frozen dataclasses: one per JSON document (:class:`JobInfo`,
:class:`ExecutionInfo`, :class:`Page`...), each read by its ``of`` from the decoded JSON and keeping
that JSON in ``raw``, so a field this client does not know yet is still reachable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Literal, Self, TypeVar

from onbeat.model import (
    AttemptOutcome,
    ExecutionStatus,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Trigger,
)
from onbeat.schedule import ScheduleKind

T = TypeVar("T")
Json = Any
"""A decoded JSON value."""


def _dt(value: Json) -> datetime:
    if not isinstance(value, str):
        raise TypeError(f"expected an ISO-8601 timestamp, got {value!r}")
    return datetime.fromisoformat(value)


def _opt_dt(value: Json) -> datetime | None:
    return None if value is None else _dt(value)


def _opt_float(value: Json) -> float | None:
    return None if value is None else float(value)


_E = TypeVar("_E", bound=StrEnum)


def _enum(kind: type[_E], value: Json) -> _E:
    return kind(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class FireTime:
    at: datetime
    dst: Literal["gap", "overlap"] | None
    """``gap``: the named local time did not exist and this fire stands for it; ``overlap``: the
    local time occurred twice; ``None`` otherwise."""

    @classmethod
    def of(cls, doc: Json) -> FireTime:
        dst = doc["dst"]
        if dst not in (None, "gap", "overlap"):
            raise ValueError(f"unknown dst flag {dst!r}")
        return cls(at=_dt(doc["at"]), dst=dst)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    type: ScheduleKind
    expression: str | None
    at: datetime | None
    timezone: str

    @classmethod
    def of(cls, doc: Json) -> ScheduleInfo:
        return cls(
            type=_enum(ScheduleKind, doc["type"]),
            expression=doc["expression"],
            at=_opt_dt(doc["at"]),
            timezone=doc["timezone"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """A job as the API shows it in lists and after a change."""

    id: str
    task: str
    params: dict[str, Any]
    schedule: ScheduleInfo
    max_attempts: int
    backoff: float
    backoff_max: float
    timeout: float | None
    overlap: OverlapPolicy
    misfire: MisfirePolicy
    catchup_window: float
    priority: int
    jitter: float
    status: JobStatus
    next_fire_at: datetime | None
    next_fire_times: list[FireTime]
    created_at: datetime
    updated_at: datetime
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> Self:
        return cls(**cls._fields(doc))

    @staticmethod
    def _fields(doc: Json) -> dict[str, Any]:
        return {
            "id": doc["id"],
            "task": doc["task"],
            "params": doc["params"],
            "schedule": ScheduleInfo.of(doc["schedule"]),
            "max_attempts": doc["max_attempts"],
            "backoff": float(doc["backoff"]),
            "backoff_max": float(doc["backoff_max"]),
            "timeout": _opt_float(doc["timeout"]),
            "overlap": _enum(OverlapPolicy, doc["overlap"]),
            "misfire": _enum(MisfirePolicy, doc["misfire"]),
            "catchup_window": float(doc["catchup_window"]),
            "priority": doc["priority"],
            "jitter": float(doc["jitter"]),
            "status": _enum(JobStatus, doc["status"]),
            "next_fire_at": _opt_dt(doc["next_fire_at"]),
            "next_fire_times": [FireTime.of(f) for f in doc["next_fire_times"]],
            "created_at": _dt(doc["created_at"]),
            "updated_at": _dt(doc["updated_at"]),
            "raw": doc,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptInfo:
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: AttemptOutcome
    error: str | None

    @classmethod
    def of(cls, doc: Json) -> AttemptInfo:
        return cls(
            attempt=doc["attempt"],
            worker=doc["worker"],
            started_at=_dt(doc["started_at"]),
            finished_at=_opt_dt(doc["finished_at"]),
            outcome=_enum(AttemptOutcome, doc["outcome"]),
            error=doc["error"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionInfo:
    """One planned run of a job, with its attempts (oldest first)."""

    id: str
    job_id: str
    trigger: Trigger
    scheduled_for: datetime
    due_at: datetime
    status: ExecutionStatus
    attempt: int
    """Attempts started so far."""
    priority: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    result: Any
    last_error: str | None
    reason: str | None
    """Why it was skipped or cancelled, or why it waits."""
    catchup: bool
    """Ran although its fire time was missed: the misfire policy's catch-up run."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: list[AttemptInfo]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> ExecutionInfo:
        return cls(
            id=doc["id"],
            job_id=doc["job_id"],
            trigger=_enum(Trigger, doc["trigger"]),
            scheduled_for=_dt(doc["scheduled_for"]),
            due_at=_dt(doc["due_at"]),
            status=_enum(ExecutionStatus, doc["status"]),
            attempt=doc["attempt"],
            priority=doc["priority"],
            lease_owner=doc["lease_owner"],
            lease_expires_at=_opt_dt(doc["lease_expires_at"]),
            result=doc["result"],
            last_error=doc["last_error"],
            reason=doc["reason"],
            catchup=doc.get("catchup", False),
            created_at=_dt(doc["created_at"]),
            started_at=_opt_dt(doc["started_at"]),
            finished_at=_opt_dt(doc["finished_at"]),
            attempts=[AttemptInfo.of(a) for a in doc["attempts"]],
            raw=doc,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDetail(JobInfo):
    """A job with its most recent executions, newest first (``get_job``)."""

    executions: list[ExecutionInfo]

    @classmethod
    def of(cls, doc: Json) -> Self:
        return cls(**cls._fields(doc), executions=[ExecutionInfo.of(e) for e in doc["executions"]])


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterInfo:
    """An execution that exhausted its attempts; ``id`` is the execution's id."""

    id: str
    execution_id: str
    job_id: str
    task: str
    params: dict[str, Any]
    attempts: int
    last_error: str | None
    created_at: datetime
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> DeadLetterInfo:
        return cls(
            id=doc["id"],
            execution_id=doc["execution_id"],
            job_id=doc["job_id"],
            task=doc["task"],
            params=doc["params"],
            attempts=doc["attempts"],
            last_error=doc["last_error"],
            created_at=_dt(doc["created_at"]),
            raw=doc,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskInfo:
    """A task registered on the server, with its default policies."""

    name: str
    is_async: bool
    max_attempts: int
    backoff: float
    backoff_max: float
    timeout: float | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> TaskInfo:
        return cls(
            name=doc["name"],
            is_async=doc["is_async"],
            max_attempts=doc["max_attempts"],
            backoff=float(doc["backoff"]),
            backoff_max=float(doc["backoff_max"]),
            timeout=_opt_float(doc["timeout"]),
            raw=doc,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Page(Generic[T]):
    """One page of a list; pass ``next_cursor`` as ``cursor`` for the next (``None``: last page).
    The ``iter_*`` methods follow the cursors for you."""

    items: list[T]
    next_cursor: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)


def _page_of(item: Callable[[Json], T]) -> Callable[[Json], Page[T]]:
    def parse(doc: Json) -> Page[T]:
        return Page(items=[item(i) for i in doc["items"]], next_cursor=doc["next_cursor"], raw=doc)

    return parse


def _items_of(item: Callable[[Json], T]) -> Callable[[Json], list[T]]:
    """Reads ``{"items": [...]}`` (a batch's answer: every item, no cursor)."""

    def parse(doc: Json) -> list[T]:
        return [item(i) for i in doc["items"]]

    return parse


@dataclass(frozen=True, slots=True, kw_only=True)
class Preview:
    """What a cron expression will do: its next fire times, DST-flagged."""

    fire_times: list[FireTime]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> Preview:
        return cls(fire_times=[FireTime.of(f) for f in doc["fire_times"]], raw=doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditResult:
    """Every fire time the job's schedule produced in [since, until] (``expected`` of them), those
    without an execution record (``missing``: empty is the promise), and the records in the range
    counted by status."""

    job_id: str
    since: datetime
    until: datetime
    expected: int
    missing: list[datetime]
    records: dict[str, int]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> AuditResult:
        return cls(
            job_id=doc["job_id"],
            since=_dt(doc["since"]),
            until=_dt(doc["until"]),
            expected=doc["expected"],
            missing=[_dt(m) for m in doc["missing"]],
            records=dict(doc["records"]),
            raw=doc,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    status: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> Health:
        return cls(status=doc["status"], raw=doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    status: str
    checks: dict[str, str]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> Readiness:
        return cls(status=doc["status"], checks=dict(doc["checks"]), raw=doc)


def _nothing(doc: Json) -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantLimitsInfo:
    """A tenant's own fleet limits (None: the fleet's default applies) and its runs in flight."""

    tenant: str
    max_in_flight: int | None
    max_starts_per_second: float | None
    running: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def of(cls, doc: Json) -> TenantLimitsInfo:
        return cls(
            tenant=doc["tenant"],
            max_in_flight=doc["max_in_flight"],
            max_starts_per_second=doc["max_starts_per_second"],
            running=doc["running"],
            raw=doc,
        )
