"""Pydantic models at the HTTP boundary only: request bodies, response documents, converters.

The engine's dataclasses (``onbeat.model``) stay free of HTTP concerns; these models decide what
a client may send and what it gets back (timestamps ISO-8601 with offset, ids opaque strings,
enums as their values). Every field a client sends is checked by the same function of
``onbeat.validation`` that checks the Python API's argument of that name (:class:`Checked`), so
both refuse the same values with the same message; what only the engine knows (cron syntax, time
zones, registered tasks) is checked by the App behind the route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from onbeat import validation
from onbeat.audit import AuditReport
from onbeat.errors import ValidationError
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
from onbeat.schedule import MAX_CRON_LENGTH, FireTime, ScheduleKind
from onbeat.store.base import PublishedTask
from onbeat.task import Task

NEXT_FIRE_TIMES = 5
"""Fire times shown with each job."""
MAX_TEXT = validation.MAX_AT
"""Longest timestamp or time zone name in a query string."""


@dataclass(frozen=True)
class Checked:
    """Annotation of a request field: validated by ``check`` (a function of ``onbeat.validation``,
    whose ValidationError message becomes the field's error message) and documented in the OpenAPI
    document as ``schema``. ``nullable``: null is accepted and means "not given"."""

    check: Callable[[Any], object]
    schema: dict[str, Any] = field(hash=False)
    nullable: bool = False

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(self._validate)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [self.schema, {"type": "null"}]} if self.nullable else dict(self.schema)

    def _validate(self, value: Any) -> object:
        if value is None and self.nullable:
            return None
        try:
            return self.check(value)
        except ValidationError as exc:
            raise PydanticCustomError("invalid", "{message}", {"message": exc.message}) from None


def _integer(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def _text(max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length, **extra}


_SECONDS = {"type": "number", "minimum": 0, "maximum": validation.MAX_SECONDS}
_AT = _text(
    validation.MAX_AT,
    format="date-time",
    description="ISO-8601 with a UTC offset, e.g. 2026-03-29T02:30:00+02:00.",
)
_TIMEZONE = _text(validation.MAX_TIMEZONE, examples=["Europe/Berlin"])

TaskName = Annotated[str, Checked(validation.task_name, _text(validation.MAX_TASK_NAME))]
Params = Annotated[
    dict[str, Any] | None,
    Checked(validation.params, {"type": "object"}, nullable=True),
    Field(description="JSON object; at most 64 KiB of JSON, nested at most 64 levels."),
]
Expression = Annotated[
    str | None, Checked(validation.cron_text, _text(MAX_CRON_LENGTH), nullable=True)
]
At = Annotated[str | None, Checked(validation.at_text, _AT, nullable=True)]
TimeZone = Annotated[str, Checked(validation.timezone_name, _TIMEZONE)]
TimeZoneChange = Annotated[str | None, Checked(validation.timezone_name, _TIMEZONE, nullable=True)]
MaxAttempts = Annotated[
    int | None,
    Checked(validation.max_attempts, _integer(1, validation.MAX_ATTEMPTS), nullable=True),
]
Priority = Annotated[
    int | None,
    Checked(
        validation.priority,
        _integer(validation.MIN_PRIORITY, validation.MAX_PRIORITY),
        nullable=True,
    ),
]
Timeout = Annotated[
    float | None,
    Checked(
        validation.timeout,
        {"type": "number", "exclusiveMinimum": 0, "maximum": validation.MAX_SECONDS},
        nullable=True,
    ),
]
Backoff = Annotated[float | None, Checked(validation.backoff, _SECONDS, nullable=True)]
BackoffMax = Annotated[float | None, Checked(validation.backoff_max, _SECONDS, nullable=True)]
CatchupWindow = Annotated[float | None, Checked(validation.catchup_window, _SECONDS, nullable=True)]
Jitter = Annotated[float | None, Checked(validation.jitter, _SECONDS, nullable=True)]
Overlap = Annotated[
    OverlapPolicy | None,
    Checked(
        validation.overlap,
        {"type": "string", "enum": [p.value for p in OverlapPolicy]},
        nullable=True,
    ),
]
Misfire = Annotated[
    MisfirePolicy | None,
    Checked(
        validation.misfire,
        {"type": "string", "enum": [p.value for p in MisfirePolicy]},
        nullable=True,
    ),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests ---------------------------------------------------------------------------------
class ScheduleIn(_Request):
    """When a job fires: ``now``; ``once`` at ``at``; ``cron`` by ``expression`` in ``timezone``."""

    type: ScheduleKind
    expression: Expression = None
    at: At = None
    timezone: TimeZone = "UTC"


class JobCreate(_Request):
    task: TaskName
    params: Params = None
    schedule: ScheduleIn = Field(default_factory=lambda: ScheduleIn(type=ScheduleKind.NOW))
    max_attempts: MaxAttempts = Field(None, description="Default: the task's.")
    backoff: Backoff = Field(None, description="Backoff base in seconds; default: the task's.")
    backoff_max: BackoffMax = Field(
        None, description="Backoff cap in seconds; default: the task's."
    )
    timeout: Timeout = Field(None, description="Seconds; default: the task's.")
    overlap: Overlap = Field(None, description="Default: skip.")
    misfire: Misfire = Field(None, description="Default: run_once.")
    catchup_window: CatchupWindow = Field(None, description="Seconds; default 3600.")
    priority: Priority = Field(None, description="Default 0.")
    jitter: Jitter = Field(None, description="Seconds; default 0.")


MAX_BATCH = 1000
"""Most jobs one ``POST /jobs/batch`` submits (one transaction; larger loads: more requests)."""


class JobBatch(_Request):
    jobs: list[JobCreate] = Field(min_length=1, max_length=MAX_BATCH)


class ScheduleChange(_Request):
    """A new schedule: an ``expression`` (cron) or an ``at`` (once); ``timezone`` alone re-zones a
    cron job. ``type`` is optional and, when given, must agree. A job cannot become ``now``: use
    ``POST /jobs/{id}/run``."""

    type: Literal[ScheduleKind.ONCE, ScheduleKind.CRON] | None = None
    expression: Expression = None
    at: At = None
    timezone: TimeZoneChange = None


class JobPatch(_Request):
    """Fields to change; an absent or null field is left as it is."""

    params: Params = None
    schedule: ScheduleChange | None = None
    max_attempts: MaxAttempts = None
    backoff: Backoff = None
    backoff_max: BackoffMax = None
    timeout: Timeout = None
    overlap: Overlap = None
    misfire: Misfire = None
    priority: Priority = None
    jitter: Jitter = None


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


class JobBatchOut(BaseModel):
    items: list[JobOut]
    """The jobs, in the order submitted."""


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
def next_fire_times(job: Job, count: int = NEXT_FIRE_TIMES) -> list[dict[str, Any]]:
    """``FireTimeOut``'s content for each of the job's next fire times."""
    if job.next_fire_at is None or job.status in (JobStatus.CANCELLED, JobStatus.COMPLETED):
        return []
    if job.schedule.kind is not ScheduleKind.CRON:
        return [{"at": job.next_fire_at, "dst": None}]
    # From just before next_fire_at, so it comes first and carries its DST flag.
    start = job.next_fire_at - timedelta(microseconds=1)
    return [{"at": f.at, "dst": f.dst} for f in job.schedule.fire_times(start, count)]


def job_out(job: Job) -> JobOut:
    return JobOut.model_validate(job_document(job))


def job_detail(job: Job, executions: list[Execution]) -> JobDetail:
    return JobDetail(**job_document(job), executions=[execution_out(e) for e in executions])


def job_document(job: Job) -> dict[str, Any]:
    """``JobOut``'s content as plain values (enums, datetimes, dicts), which ``serialized``
    writes as the model would without building it: the creates answer with up to 1,000 jobs,
    and a JobOut with its five FireTimeOut cost 19 us a job to validate and write against 11
    (bench/README.md, W5). tests/api/test_job_document.py holds the bytes equal to JobOut's."""
    schedule = job.schedule
    return {
        "id": job.id,
        "task": job.task,
        "params": job.params,
        "schedule": {
            "type": schedule.kind,
            "expression": schedule.expression,
            "at": schedule.at,
            "timezone": schedule.timezone,
        },
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


def in_utc(document: dict[str, Any]) -> bool:
    """Whether every datetime in a :func:`job_document` is in UTC (or None), which
    ``deps.plain_json`` writes with orjson. A job's are, as stored and as made (``Schedule``
    normalises ``at`` to UTC); checked all the same, for 0.6 us a job."""
    next_fire_at, at = document["next_fire_at"], document["schedule"]["at"]
    if (
        document["created_at"].tzinfo is not UTC
        or document["updated_at"].tzinfo is not UTC
        or (next_fire_at is not None and next_fire_at.tzinfo is not UTC)
        or (at is not None and at.tzinfo is not UTC)
    ):
        return False
    return all(fire["at"].tzinfo is UTC for fire in document["next_fire_times"])


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


def task_out(task: Task | PublishedTask) -> TaskOut:
    return TaskOut(
        name=task.name,
        is_async=task.is_async,
        max_attempts=task.retry.max_attempts,
        backoff=task.retry.backoff_base,
        backoff_max=task.retry.backoff_cap,
        timeout=task.timeout,
    )
