"""``/jobs``: submit, read, list, edit, pause, resume, run now and cancel jobs."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from onbeat import validation
from onbeat.api.auth import CallerDep
from onbeat.api.cursors import decode_cursor, invalid_cursor, page_of
from onbeat.api.deps import (
    DEFAULT_LIMIT,
    Cursor,
    Limit,
    OnbeatApp,
    Timestamp,
    parse_instant,
    resource_url,
    serialized,
)
from onbeat.api.problems import fields_renamed, problem_responses
from onbeat.api.schemas import (
    AuditOut,
    ExecutionOut,
    ExecutionPage,
    JobBatch,
    JobBatchOut,
    JobCreate,
    JobDetail,
    JobOut,
    JobPage,
    JobPatch,
    ScheduleChange,
    ScheduleIn,
    audit_out,
    execution_out,
    in_utc,
    job_detail,
    job_document,
    job_out,
)
from onbeat.app import App
from onbeat.errors import NotFoundError, ValidationError
from onbeat.model import ExecutionStatus, Job, JobStatus
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.base import NewJob, PublishedTask
from onbeat.task import Task

router = APIRouter(prefix="/jobs", tags=["jobs"])

RECENT_EXECUTIONS = 20
"""Executions shown with ``GET /jobs/{id}``; the rest via ``GET /jobs/{id}/executions``."""
SCHEDULE_FIELDS = {
    "cron": "schedule.expression",
    "at": "schedule.at",
    "timezone": "schedule.timezone",
}
_READ = problem_responses(400, 404, 413, 422, 500)
_WRITE = problem_responses(400, 404, 409, 413, 422, 500, 503, 504)


# --- create -----------------------------------------------------------------------------------
MAX_BATCH_IDEMPOTENCY_KEY = validation.MAX_IDEMPOTENCY_KEY - 5
"""A batch's key, with ``#<index>`` appended for each of its (at most 1,000) jobs, stays a key."""
_CREATED: dict[int | str, dict[str, Any]] = {
    201: {
        "description": "The job (created now, or by an earlier request with the same key).",
        "headers": {
            "Location": {
                "description": "The job's URL.",
                "required": True,
                "schema": {"type": "string"},
            },
            "Idempotent-Replayed": {
                "description": "Sent with an Idempotency-Key: `false` if this request created "
                "the job, `true` if an earlier request with the key did.",
                "schema": {"type": "string", "enum": ["true", "false"]},
            },
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses={**_CREATED, **problem_responses(400, 413, 422, 503, 504)},
    summary="Submit a job",
)
async def create_job(
    body: JobCreate,
    onbeat: OnbeatApp,
    caller: CallerDep,
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Makes a retried POST return the first job instead of creating a second.",
            # checked by the App, as the Python API's idempotency_key is
            json_schema_extra={"minLength": 1, "maxLength": validation.MAX_IDEMPOTENCY_KEY},
        ),
    ] = None,
) -> Response:
    """Validate everything (task registered, schedule, zone, policies, params size), store the job
    (in the caller's tenant) and its first execution, and answer with the job and its next fire
    times. An ``Idempotency-Key`` is the caller's tenant's: other tenants' keys never match it.

    On the event loop, not in a thread (a thread per create cost about 70 us of CPU): the task
    is looked up in a thread only when that reads the store, and the write waits in the
    App's group commit without holding a thread."""
    prepare = functools.partial(_prepare, onbeat, body, caller.home_tenant, idempotency_key)
    known = onbeat.known_task(body.task) is not None
    new = prepare() if known else await run_in_threadpool(prepare)
    created = await onbeat.submit_async(new)
    headers = {"Location": resource_url(request, "get_job", "job_id", created.job.id)}
    if idempotency_key is not None:
        headers["Idempotent-Replayed"] = "true" if created.replayed else "false"
    document = job_document(created.job)
    return serialized(document, 201, headers, in_utc=in_utc(document))


@router.post(
    "/batch",
    status_code=201,
    response_model=JobBatchOut,
    responses=problem_responses(400, 413, 422, 503, 504),
    summary="Submit many jobs at once",
)
def create_jobs(
    body: JobBatch,
    onbeat: OnbeatApp,
    caller: CallerDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Makes a retried batch return the jobs the first one created (each job "
            "is keyed by this key and its index) instead of creating them again.",
            json_schema_extra={"minLength": 1, "maxLength": MAX_BATCH_IDEMPOTENCY_KEY},
        ),
    ] = None,
) -> Response:
    """Validate every job as ``POST /jobs`` does, then store them all in one transaction: all
    of them, or (any one invalid, named by its index: ``jobs[3].schedule.expression``) none."""
    if idempotency_key is not None:
        validation.text("Idempotency-Key", idempotency_key, MAX_BATCH_IDEMPOTENCY_KEY)
    news = []
    tasks = onbeat.get_tasks(job.task for job in body.jobs)  # one store read, not one per job
    for index, job in enumerate(body.jobs):
        key = None if idempotency_key is None else f"{idempotency_key}#{index}"
        try:
            news.append(_prepare(onbeat, job, caller.home_tenant, key, tasks))
        except ValidationError as exc:
            raise ValidationError(f"jobs[{index}].{exc.field}", exc.message) from None
    created = onbeat.submit_many(news)
    headers = {}
    if idempotency_key is not None:
        # All or none: a retry finds every job of the first request (or, if it never
        # committed, creates them all now).
        headers["Idempotent-Replayed"] = "true" if created[0].replayed else "false"
    documents = [job_document(c.job) for c in created]
    utc = all(map(in_utc, documents))
    return serialized({"items": documents}, 201, headers, in_utc=utc)


def _prepare(
    onbeat: App,
    body: JobCreate,
    tenant: str,
    idempotency_key: str | None,
    tasks: Mapping[str, Task | PublishedTask] | None = None,
) -> NewJob:
    cron, at = _schedule_args(body.schedule)
    # The options given, as body.model_dump(exclude_none=True, exclude=...) has them, without
    # its cost (a bulk create prepares 1,000 of these: docs/performance.md, W5).
    options = {name: value for name in _OPTIONS if (value := getattr(body, name)) is not None}
    with fields_renamed(SCHEDULE_FIELDS):
        return onbeat.prepare(
            body.task,
            body.params,
            cron=cron,
            at=at,
            timezone=body.schedule.timezone,
            tenant=tenant,
            idempotency_key=idempotency_key,
            tasks=tasks,
            **options,
        )


_OPTIONS = tuple(
    name for name in JobCreate.model_fields if name not in ("task", "params", "schedule")
)


def _schedule_args(schedule: ScheduleIn) -> tuple[str | None, str | None]:
    """``(cron, at)`` for the App, after checking they fit ``type``."""
    if schedule.type is ScheduleKind.CRON:
        if schedule.expression is None:
            raise ValidationError("schedule.expression", "is required for a cron schedule")
        if schedule.at is not None:
            raise ValidationError("schedule.at", "must be omitted for a cron schedule")
    elif schedule.type is ScheduleKind.ONCE:
        if schedule.at is None:
            raise ValidationError("schedule.at", "is required for a once schedule")
        if schedule.expression is not None:
            raise ValidationError("schedule.expression", "must be omitted for a once schedule")
    else:
        for name in ("expression", "at"):
            if getattr(schedule, name) is not None:
                raise ValidationError(f"schedule.{name}", "must be omitted for a now schedule")
    return schedule.expression, schedule.at


# --- read -------------------------------------------------------------------------------------
@router.get("/{job_id}", response_model=JobDetail, responses=_READ, summary="Get a job")
def get_job(job_id: str, onbeat: OnbeatApp, caller: CallerDep) -> Response:
    """The job's definition, its next fire times and its most recent executions (newest first),
    each with its attempts."""
    job = onbeat.get_job(job_id, tenant=caller.tenant)
    recent = onbeat.list_executions(job, limit=RECENT_EXECUTIONS, tenant=caller.tenant)
    return serialized(job_detail(job, recent))


@router.get("", response_model=JobPage, responses=_READ, summary="List jobs")
def list_jobs(
    onbeat: OnbeatApp,
    caller: CallerDep,
    status: JobStatus | None = None,
    task: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
) -> JobPage:
    """The caller's tenant's jobs in creation order, ``limit`` per page, optionally only those in
    ``status`` or of ``task``."""
    after_id = decode_cursor("jobs", cursor)
    fetched = onbeat.list_jobs(
        tenant=caller.tenant, status=status, task=task, after_id=after_id, limit=limit + 1
    )
    jobs, next_cursor = page_of("jobs", fetched, limit, lambda j: j.id)
    return JobPage(items=[job_out(j) for j in jobs], next_cursor=next_cursor)


@router.get(
    "/{job_id}/executions",
    response_model=ExecutionPage,
    responses=_READ,
    summary="List a job's executions",
)
def list_executions(
    job_id: str,
    onbeat: OnbeatApp,
    caller: CallerDep,
    status: ExecutionStatus | None = None,
    since: Timestamp = None,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
) -> ExecutionPage:
    """The job's executions, newest fire time first, each with its attempts; with ``since``, only
    those whose fire time (``scheduled_for``) is at or after it."""
    onbeat.get_job(job_id, tenant=caller.tenant)
    start = None if since is None else parse_instant("since", since)
    before_id = decode_cursor("executions", cursor)
    if before_id is not None:
        # The store pages from the cursor's execution; one that is gone or of another job would
        # silently restart the listing, so it is refused instead.
        try:
            before = onbeat.get_execution(before_id, tenant=caller.tenant)
        except NotFoundError:
            raise invalid_cursor() from None
        if before.job_id != job_id:
            raise invalid_cursor()
    executions = onbeat.list_executions(
        job_id, limit + 1, status=status, before_id=before_id, tenant=caller.tenant
    )
    if start is not None:
        # The listing is ordered by scheduled_for, newest first, so the executions at or after
        # ``since`` are a prefix of every page: cutting the page there is exact keyset paging
        # (a page is short only when it is the last one; nothing is skipped or repeated).
        executions = list(itertools.takewhile(lambda e: e.scheduled_for >= start, executions))
    page, next_cursor = page_of("executions", executions, limit, lambda e: e.id)
    return ExecutionPage(items=[execution_out(e) for e in page], next_cursor=next_cursor)


@router.get(
    "/{job_id}/audit",
    response_model=AuditOut,
    responses=_READ,
    summary="Audit a job's runs",
)
def audit_job(
    job_id: str,
    onbeat: OnbeatApp,
    caller: CallerDep,
    since: Timestamp = None,
    until: Timestamp = None,
) -> AuditOut:
    """Reconcile every fire time the job's schedule produced in [``since``, ``until``] (default:
    from its creation, or from the fire time of a once job submitted for a time already past,
    until now; ``until`` is capped at now), accounting for edits and pauses,
    against its execution records. ``missing`` lists each fire time with no record: "did the
    3 a.m. run happen?" answered with proof; an empty list is the promise kept."""
    start = None if since is None else parse_instant("since", since)
    end = None if until is None else parse_instant("until", until)
    try:
        report = onbeat.audit(job_id, start, end, tenant=caller.tenant)
    except OverflowError:  # a bound at the very edge of the datetime range
        raise ValidationError("since", "is out of range") from None
    return audit_out(job_id, report)


# --- edit -------------------------------------------------------------------------------------
@router.patch("/{job_id}", response_model=JobOut, responses=_WRITE, summary="Edit a job")
def update_job(job_id: str, body: JobPatch, onbeat: OnbeatApp, caller: CallerDep) -> JobOut:
    """Change params, schedule or policies. A new schedule takes over from now: the old one's fire
    times up to now keep their runs, its later planned runs are removed, and the new one's first
    fire time is planned; a schedule equal to the current one changes nothing. Other edits apply
    to every run that starts afterwards."""
    job = onbeat.get_job(job_id, tenant=caller.tenant)
    options = body.model_dump(exclude_none=True, exclude={"params", "schedule"})
    schedule = {} if body.schedule is None else _schedule_change(job, body.schedule)
    with fields_renamed(SCHEDULE_FIELDS):
        updated = onbeat.update_job(
            job_id, tenant=caller.tenant, params=body.params, **schedule, **options
        )
    return job_out(updated)


def _schedule_change(job: Job, change: ScheduleChange) -> dict[str, Any]:
    """``cron``/``at``/``timezone`` arguments for ``App.update_job``; {} if nothing changes."""
    if change.expression is not None and change.at is not None:
        raise ValidationError("schedule", "give either an expression or an at time, not both")
    kind = change.type
    if kind is None and change.expression is not None:
        kind = ScheduleKind.CRON
    elif kind is None and change.at is not None:
        kind = ScheduleKind.ONCE
    expression, at = change.expression, change.at
    if kind is ScheduleKind.CRON:
        if at is not None:
            raise ValidationError("schedule.at", "must be omitted for a cron schedule")
        if expression is None:
            if job.schedule.kind is not ScheduleKind.CRON:
                raise ValidationError("schedule.expression", "is required to make this a cron job")
            expression = job.schedule.expression
    elif kind is ScheduleKind.ONCE:
        if expression is not None:
            raise ValidationError("schedule.expression", "must be omitted for a once schedule")
        if at is None:
            raise ValidationError("schedule.at", "is required for a once schedule")
    else:
        if change.timezone is None:
            raise ValidationError("schedule", "give an expression, an at time or a timezone")
        if job.schedule.kind is not ScheduleKind.CRON:
            return {"timezone": change.timezone}  # which the App refuses, as for Python callers
        kind, expression = ScheduleKind.CRON, job.schedule.expression
    timezone = change.timezone or job.schedule.timezone
    cron = expression if kind is ScheduleKind.CRON else None
    with fields_renamed(SCHEDULE_FIELDS):
        new = Schedule.parse(cron=cron, at=at, timezone=timezone)
    if new == job.schedule:
        return {}  # nothing to re-plan: the planned runs stay as they are
    return {"cron": cron, "at": at, "timezone": timezone}


@router.post("/{job_id}/pause", response_model=JobOut, responses=_WRITE, summary="Pause a job")
def pause_job(job_id: str, onbeat: OnbeatApp, caller: CallerDep) -> JobOut:
    """Nothing of the job is dispatched until it is resumed; pending runs wait, running ones
    finish. Pausing a paused job changes nothing; a cancelled job is a 409."""
    return job_out(onbeat.pause(job_id, tenant=caller.tenant))


@router.post("/{job_id}/resume", response_model=JobOut, responses=_WRITE, summary="Resume a job")
def resume_job(job_id: str, onbeat: OnbeatApp, caller: CallerDep) -> JobOut:
    """Dispatch again: a pending one-shot run runs at once; a cron run whose time passed while
    paused is recorded as skipped and the next future fire is planned. A cancelled job is a 409."""
    return job_out(onbeat.resume(job_id, tenant=caller.tenant))


@router.post(
    "/{job_id}/run",
    status_code=201,
    response_model=ExecutionOut,
    responses=_WRITE,
    summary="Run a job now",
)
def run_job(
    job_id: str, onbeat: OnbeatApp, caller: CallerDep, request: Request, response: Response
) -> ExecutionOut:
    """Create an execution with trigger ``manual``, due now, subject to the job's overlap policy
    when it starts. A paused or cancelled job is a 409."""
    execution = onbeat.run_now(job_id, tenant=caller.tenant)
    response.headers["Location"] = resource_url(
        request, "get_execution", "execution_id", execution.id
    )
    return execution_out(execution)


@router.delete("/{job_id}", response_model=JobOut, responses=_WRITE, summary="Cancel a job")
def cancel_job(job_id: str, onbeat: OnbeatApp, caller: CallerDep) -> JobOut:
    """Make the job inactive for good: its not-yet-started executions are cancelled (kept, with a
    reason); a running one finishes but is not retried. The job stays readable."""
    return job_out(onbeat.cancel(job_id, tenant=caller.tenant))
