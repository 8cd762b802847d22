"""Pydantic models at the HTTP boundary only: request bodies, response documents, converters.

The engine's dataclasses (``onbeat.model``) stay free of HTTP concerns; these models decide what
a client may send (strict JSON types: ``"5"`` is not a number, ``true`` is not an integer) and what
it gets back (timestamps ISO-8601 with offset, ids opaque strings, enums as their values).
Semantic checks (cron syntax, time zones, registered tasks, the 64 KiB params cap) stay in the App.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict

from onbeat.audit import AuditReport
from onbeat.model import (
    AttemptOutcome,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Trigger,
)
from onbeat.schedule import MAX_CRON_LENGTH, FireTime, Schedule, ScheduleKind
from onbeat.task import Task

NEXT_FIRE_TIMES = 5
"""Fire times shown with each job."""
MAX_SECONDS = 366 * 24 * 3600.0
"""Upper bound of every duration a client sets (backoff, timeout, jitter, catch-up window)."""
MAX_TEXT = 64
"""Longest ``at`` timestamp and time zone name (the App's limits)."""
MAX_PARAMS_DEPTH = 64
"""Deepest nesting of params accepted (the params object itself is level 1)."""


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (\\ud800-\\udfff), which is not text") from None
    return value


def _json_text(value: dict[str, Any]) -> dict[str, Any]:
    """Params must survive a JSON round trip as UTF-8 (no NaN/Infinity, no lone surrogates) and be
    shallow enough to be served back (the response serializer stops at ~250 levels)."""
    if _depth(value) > MAX_PARAMS_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_PARAMS_DEPTH} levels")
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (\\ud800-\\udfff), which is not text") from None
    except RecursionError:
        raise ValueError("is nested too deeply") from None
    except ValueError:
        raise ValueError("contains NaN or Infinity, which JSON does not allow") from None
    return value


def _depth(value: object) -> int:
    """Nesting depth of a JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_PARAMS_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


Text = Annotated[str, Strict(), AfterValidator(_valid_unicode)]
Params = Annotated[dict[str, Any], AfterValidator(_json_text)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS)]
PositiveSeconds = Annotated[float, Strict(), Field(gt=0, le=MAX_SECONDS)]
MaxAttempts = Annotated[int, Strict(), Field(ge=1, le=1000)]
Priority = Annotated[int, Strict(), Field(ge=-100, le=100)]
Expression = Annotated[Text, Field(min_length=1, max_length=MAX_CRON_LENGTH)]
At = Annotated[
    Text,
    Field(
        max_length=MAX_TEXT,
        description="ISO-8601 with a UTC offset, e.g. 2026-03-29T02:30:00+02:00.",
        json_schema_extra={"format": "date-time"},
    ),
]
TimeZone = Annotated[Text, Field(min_length=1, max_length=MAX_TEXT, examples=["Europe/Berlin"])]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- requests ---------------------------------------------------------------------------------
class ScheduleIn(_Request):
    """When a job fires: ``now``; ``once`` at ``at``; ``cron`` by ``expression`` in ``timezone``."""

    type: ScheduleKind
    expression: Expression | None = None
    at: At | None = None
    timezone: TimeZone = "UTC"


class JobCreate(_Request):
    task: Annotated[Text, Field(min_length=1, max_length=200)]
    params: Params = Field(default_factory=dict, description="JSON object; at most 64 KiB.")
    schedule: ScheduleIn = Field(default_factory=lambda: ScheduleIn(type=ScheduleKind.NOW))
    max_attempts: MaxAttempts | None = Field(None, description="Default: the task's.")
    backoff: Seconds | None = Field(
        None, description="Backoff base in seconds; default: the task's."
    )
    backoff_max: Seconds | None = Field(
        None, description="Backoff cap in seconds; default: the task's."
    )
    timeout: PositiveSeconds | None = Field(None, description="Seconds; default: the task's.")
    overlap: OverlapPolicy | None = Field(None, description="Default: skip.")
    misfire: MisfirePolicy | None = Field(None, description="Default: run_once.")
    catchup_window: Seconds | None = Field(None, description="Seconds; default 3600.")
    priority: Priority | None = Field(None, description="Default 0.")
    jitter: Seconds | None = Field(None, description="Seconds; default 0.")


class ScheduleChange(_Request):
    """A new schedule: an ``expression`` (cron) or an ``at`` (once); ``timezone`` alone re-zones a
    cron job. ``type`` is optional and, when given, must agree. A job cannot become ``now``: use
    ``POST /jobs/{id}/run``."""

    type: Literal[ScheduleKind.ONCE, ScheduleKind.CRON] | None = None
    expression: Expression | None = None
    at: At | None = None
    timezone: TimeZone | None = None


class JobPatch(_Request):
    """Fields to change; an absent or null field is left as it is."""

    params: Params | None = None
    schedule: ScheduleChange | None = None
    max_attempts: MaxAttempts | None = None
    backoff: Seconds | None = None
    backoff_max: Seconds | None = None
    timeout: PositiveSeconds | None = None
    overlap: OverlapPolicy | None = None
    misfire: MisfirePolicy | None = None
    priority: Priority | None = None
    jitter: Seconds | None = None


# --- responses --------------------------------------------------------------------------------
class FireTimeOut(BaseModel):
    at: datetime
    dst: Literal["gap", "overlap"] | None = Field(
        description="gap: the named local time did not exist and this fire, at the first instant "
        "after the gap, stands for it; overlap: the local time occurred twice; null otherwise."
    )

    @classmethod
    def of(cls, fire: FireTime) -> FireTimeOut:
        return cls(at=fire.at, dst=fire.dst)


class ScheduleOut(BaseModel):
    type: ScheduleKind
    expression: str | None
    at: datetime | None
    timezone: str


class JobOut(BaseModel):
    id: str
    task: str
    params: dict[str, Any]
    schedule: ScheduleOut
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
    next_fire_times: list[FireTimeOut] = Field(
        description=f"The next {NEXT_FIRE_TIMES} fire times, starting with next_fire_at."
    )
    created_at: datetime
    updated_at: datetime


class AttemptOut(BaseModel):
    attempt: int
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: AttemptOutcome
    error: str | None


class ExecutionOut(BaseModel):
    id: str
    job_id: str
    trigger: Trigger
    scheduled_for: datetime
    due_at: datetime
    status: ExecutionStatus
    attempt: int = Field(description="Attempts started so far.")
    priority: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    result: Any
    last_error: str | None
    reason: str | None = Field(description="Why it was skipped or cancelled, or why it waits.")
    catchup: bool = Field(
        description="Ran although its fire time was missed: the misfire policy's catch-up run."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: list[AttemptOut] = Field(description="One entry per attempt, oldest first.")


class JobDetail(JobOut):
    executions: list[ExecutionOut] = Field(description="The most recent executions, newest first.")


class DeadLetterOut(BaseModel):
    id: str = Field(description="The dead letter's id: the id of the execution that failed.")
    execution_id: str
    job_id: str
    task: str
    params: dict[str, Any]
    attempts: int
    last_error: str | None
    created_at: datetime


class TaskOut(BaseModel):
    name: str
    is_async: bool
    max_attempts: int
    backoff: float
    backoff_max: float
    timeout: float | None


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last."
    )


class JobPage(Page[JobOut]):
    pass


class ExecutionPage(Page[ExecutionOut]):
    pass


class DeadLetterPage(Page[DeadLetterOut]):
    pass


class TaskPage(Page[TaskOut]):
    pass


class AuditOut(BaseModel):
    job_id: str
    since: datetime
    until: datetime
    expected: int = Field(
        ge=0,
        description="Fire times the schedule produced in [since, until], while the job was active, "
        "under the schedule then in force.",
    )
    missing: list[datetime] = Field(
        description="Expected fire times with no execution record, oldest first; empty is the "
        "promise kept."
    )
    records: dict[str, int] = Field(
        description="Execution records of schedule fires in the range, counted by status."
    )


class Preview(BaseModel):
    fire_times: list[FireTimeOut]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, Literal["ok"]]


# --- converters -------------------------------------------------------------------------------
def next_fire_times(job: Job, count: int = NEXT_FIRE_TIMES) -> list[FireTimeOut]:
    if job.next_fire_at is None or job.status in (JobStatus.CANCELLED, JobStatus.COMPLETED):
        return []
    if job.schedule.kind is not ScheduleKind.CRON:
        return [FireTimeOut(at=job.next_fire_at, dst=None)]
    # From just before next_fire_at, so it comes first and carries its DST flag.
    start = job.next_fire_at - timedelta(microseconds=1)
    return [FireTimeOut.of(f) for f in job.schedule.fire_times(start, count)]


def schedule_out(schedule: Schedule) -> ScheduleOut:
    return ScheduleOut(
        type=schedule.kind,
        expression=schedule.expression,
        at=schedule.at,
        timezone=schedule.timezone,
    )


def job_out(job: Job) -> JobOut:
    return JobOut(**_job_fields(job))


def job_detail(job: Job, executions: list[Execution]) -> JobDetail:
    return JobDetail(**_job_fields(job), executions=[execution_out(e) for e in executions])


def _job_fields(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "task": job.task,
        "params": job.params,
        "schedule": schedule_out(job.schedule),
        "max_attempts": job.retry.max_attempts,
        "backoff": job.retry.backoff_base,
        "backoff_max": job.retry.backoff_cap,
        "timeout": job.timeout,
        "overlap": job.overlap,
        "misfire": job.misfire,
        "catchup_window": job.catchup_window,
        "priority": job.priority,
        "jitter": job.jitter,
        "status": job.status,
        "next_fire_at": job.next_fire_at,
        "next_fire_times": next_fire_times(job),
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


def execution_out(execution: Execution) -> ExecutionOut:
    """The execution's fields of the same names, its attempts included."""
    return ExecutionOut.model_validate(execution, from_attributes=True)


def dead_letter_out(dead: DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(
        id=dead.execution_id,
        execution_id=dead.execution_id,
        job_id=dead.job_id,
        task=dead.task,
        params=dead.params,
        attempts=dead.attempts,
        last_error=dead.last_error,
        created_at=dead.created_at,
    )


def audit_out(job_id: str, report: AuditReport) -> AuditOut:
    return AuditOut(
        job_id=job_id,
        since=report.since,
        until=report.until,
        expected=report.expected,
        missing=report.missing,
        records=report.records,
    )


def task_out(task: Task) -> TaskOut:
    return TaskOut(
        name=task.name,
        is_async=task.is_async,
        max_attempts=task.retry.max_attempts,
        backoff=task.retry.backoff_base,
        backoff_max=task.retry.backoff_cap,
        timeout=task.timeout,
    )
