"""Every endpoint of the REST API, described once (:class:`_Api`): each function turns a
method's arguments into the request to send and says how to read the answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from onbeat.client.methods import PageAt, _Endpoint, _Pages, _Request
from onbeat.client.results import (
    AuditResult,
    DeadLetterInfo,
    ExecutionInfo,
    Health,
    JobDetail,
    JobInfo,
    Page,
    Preview,
    Readiness,
    TaskInfo,
    TenantLimitsInfo,
    _items_of,
    _nothing,
    _page_of,
)
from onbeat.model import ExecutionStatus, JobStatus, MisfirePolicy, OverlapPolicy

Instant = datetime | str
"""A timestamp argument: an aware ``datetime``, or an ISO-8601 string with a UTC offset."""


def _segment(value: str, name: str) -> str:
    """``value`` as one path segment (quoted: an id is opaque, it may hold anything)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return quote(value, safe="")


def _instant(value: Instant) -> str:
    return value.isoformat() if isinstance(value, datetime) else value


def _query(**values: str | int | datetime | None) -> dict[str, str | int]:
    """Query parameters, leaving out the ``None`` ones."""
    out: dict[str, str | int] = {}
    for name, value in values.items():
        if value is not None:
            out[name] = _instant(value) if isinstance(value, datetime) else value
    return out


def _drop_none(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to submit with ``create_jobs``: the arguments of ``create_job`` (the batch has one
    idempotency key for all its jobs), with the same defaults."""

    task: str
    params: Mapping[str, Any] | None = None
    _: KW_ONLY
    cron: str | None = None
    at: Instant | None = None
    timezone: str = "UTC"
    max_attempts: int | None = None
    backoff: float | None = None
    backoff_max: float | None = None
    timeout: float | None = None
    overlap: OverlapPolicy | str | None = None
    misfire: MisfirePolicy | str | None = None
    catchup_window: float | None = None
    priority: int | None = None
    jitter: float | None = None


def _job_body(spec: JobSpec) -> dict[str, Any]:
    """The JSON the API takes for one new job (``POST /jobs``, each item of ``POST
    /jobs/batch``)."""
    schedule: dict[str, Any] = {"type": "now", "timezone": spec.timezone}
    if spec.cron is not None:
        schedule.update(type="cron", expression=spec.cron)
    if spec.at is not None:  # with cron too: the server names the conflict (schedule.at)
        schedule.update(type="cron" if spec.cron is not None else "once", at=_instant(spec.at))
    return {
        "task": spec.task,
        "params": dict(spec.params or {}),
        "schedule": schedule,
        **_drop_none(
            max_attempts=spec.max_attempts,
            backoff=spec.backoff,
            backoff_max=spec.backoff_max,
            timeout=spec.timeout,
            overlap=spec.overlap,
            misfire=spec.misfire,
            catchup_window=spec.catchup_window,
            priority=spec.priority,
            jitter=spec.jitter,
        ),
    }


class _Api:
    """Every endpoint of the REST API, as methods shared by :class:`Client` and
    :class:`AsyncClient`. Each function below only describes its request."""

    # --- jobs -----------------------------------------------------------------------------------
    @_Endpoint
    def create_job(
        task: str,
        params: Mapping[str, Any] | None = None,
        *,
        cron: str | None = None,
        at: Instant | None = None,
        timezone: str = "UTC",
        max_attempts: int | None = None,
        backoff: float | None = None,
        backoff_max: float | None = None,
        timeout: float | None = None,
        overlap: OverlapPolicy | str | None = None,
        misfire: MisfirePolicy | str | None = None,
        catchup_window: float | None = None,
        priority: int | None = None,
        jitter: float | None = None,
        idempotency_key: str | None = None,
    ) -> _Request[JobInfo]:
        """Submit a job (``POST /jobs``): ``cron`` for a recurring one (evaluated in
        ``timezone``), ``at`` for one run at that instant, neither to run it now. Policies left
        ``None`` take the task's defaults (durations are seconds). With ``idempotency_key``, a
        retry of the same request returns the first job instead of creating a second. Everything
        is validated by the server first (ApiValidationError names the field)."""
        spec = JobSpec(
            task,
            params,
            cron=cron,
            at=at,
            timezone=timezone,
            max_attempts=max_attempts,
            backoff=backoff,
            backoff_max=backoff_max,
            timeout=timeout,
            overlap=overlap,
            misfire=misfire,
            catchup_window=catchup_window,
            priority=priority,
            jitter=jitter,
        )
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Request("POST", "/jobs", JobInfo.of, body=_job_body(spec), headers=headers)

    @_Endpoint
    def create_jobs(
        jobs: Sequence[JobSpec], *, idempotency_key: str | None = None
    ) -> _Request[list[JobInfo]]:
        """Submit up to 1,000 jobs in one request (``POST /jobs/batch``), each as ``create_job``
        would: the server stores all of them in one transaction, or none -- a bad one is an
        ApiValidationError naming it by its index (``jobs.3.schedule.expression``). Returns the
        jobs in the order given. With ``idempotency_key``, sending the same batch again (after a
        timeout, say) returns the jobs the first request created instead of creating more."""
        body = []
        for index, spec in enumerate(jobs):
            if not isinstance(spec, JobSpec):
                raise TypeError(f"jobs[{index}] must be a JobSpec, got {spec!r}")
            body.append(_job_body(spec))
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Request(
            "POST", "/jobs/batch", _items_of(JobInfo.of), body={"jobs": body}, headers=headers
        )

    @_Endpoint
    def get_job(job_id: str) -> _Request[JobDetail]:
        """The job (``GET /jobs/{id}``), with its next fire times and its most recent executions,
        newest first."""
        return _Request("GET", f"/jobs/{_segment(job_id, 'job_id')}", JobDetail.of)

    @_Endpoint
    def list_jobs(
        *,
        status: JobStatus | str | None = None,
        task: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _Request[Page[JobInfo]]:
        """One page of jobs in creation order (``GET /jobs``), optionally only those in
        ``status`` or of ``task``. See ``iter_jobs`` for all of them."""
        params = _query(status=status, task=task, limit=limit, cursor=cursor)
        return _Request("GET", "/jobs", _page_of(JobInfo.of), params=params)

    @_Pages
    def iter_jobs(
        *,
        status: JobStatus | str | None = None,
        task: str | None = None,
        page_size: int | None = None,
    ) -> PageAt[JobInfo]:
        """Every job (optionally only those in ``status`` or of ``task``), page after page."""
        return lambda cursor: _Api.list_jobs._build(
            status=status, task=task, limit=page_size, cursor=cursor
        )

    @_Endpoint
    def update_job(
        job_id: str,
        *,
        params: Mapping[str, Any] | None = None,
        cron: str | None = None,
        at: Instant | None = None,
        timezone: str | None = None,
        max_attempts: int | None = None,
        backoff: float | None = None,
        backoff_max: float | None = None,
        timeout: float | None = None,
        overlap: OverlapPolicy | str | None = None,
        misfire: MisfirePolicy | str | None = None,
        priority: int | None = None,
        jitter: float | None = None,
    ) -> _Request[JobInfo]:
        """Edit a job (``PATCH /jobs/{id}``); arguments left ``None`` are unchanged. A new
        schedule (``cron``, ``at``, or ``timezone`` alone for a cron job) replaces the job's
        not-yet-started scheduled runs; other edits apply to every run that starts afterwards."""
        schedule = _drop_none(
            expression=cron, at=None if at is None else _instant(at), timezone=timezone
        )
        body = _drop_none(
            params=None if params is None else dict(params),
            schedule=schedule or None,
            max_attempts=max_attempts,
            backoff=backoff,
            backoff_max=backoff_max,
            timeout=timeout,
            overlap=overlap,
            misfire=misfire,
            priority=priority,
            jitter=jitter,
        )
        return _Request("PATCH", f"/jobs/{_segment(job_id, 'job_id')}", JobInfo.of, body=body)

    @_Endpoint
    def pause(job_id: str) -> _Request[JobInfo]:
        """Pause a job: nothing of it is dispatched until it is resumed. Pausing a paused job
        changes nothing; a cancelled job is an ApiConflictError."""
        return _Request("POST", f"/jobs/{_segment(job_id, 'job_id')}/pause", JobInfo.of)

    @_Endpoint
    def resume(job_id: str) -> _Request[JobInfo]:
        """Resume a paused job (a cancelled job is an ApiConflictError)."""
        return _Request("POST", f"/jobs/{_segment(job_id, 'job_id')}/resume", JobInfo.of)

    @_Endpoint
    def run_now(job_id: str) -> _Request[ExecutionInfo]:
        """Run a job now: a new execution with trigger ``manual``, subject to the job's overlap
        policy. A paused or cancelled job is an ApiConflictError."""
        return _Request("POST", f"/jobs/{_segment(job_id, 'job_id')}/run", ExecutionInfo.of)

    @_Endpoint
    def cancel(job_id: str) -> _Request[JobInfo]:
        """Cancel a job for good (``DELETE /jobs/{id}``): its not-yet-started executions are
        cancelled; a running one finishes but is not retried. The job stays readable."""
        return _Request("DELETE", f"/jobs/{_segment(job_id, 'job_id')}", JobInfo.of)

    @_Endpoint
    def audit(
        job_id: str, *, since: Instant | None = None, until: Instant | None = None
    ) -> _Request[AuditResult]:
        """Reconcile every fire time the job's schedule produced in [since, until] (default: since
        it was created, until now), edits and pauses included, against its execution records
        (``GET /jobs/{id}/audit``)."""
        params = _query(since=since, until=until)
        path = f"/jobs/{_segment(job_id, 'job_id')}/audit"
        return _Request("GET", path, AuditResult.of, params=params)

    # --- executions -----------------------------------------------------------------------------
    @_Endpoint
    def list_executions(
        job_id: str,
        *,
        status: ExecutionStatus | str | None = None,
        since: Instant | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> _Request[Page[ExecutionInfo]]:
        """One page of the job's executions, newest fire time first, each with its attempts
        (``GET /jobs/{id}/executions``); with ``since``, only those whose fire time is at or after
        it. See ``iter_executions`` for all of them."""
        params = _query(status=status, since=since, limit=limit, cursor=cursor)
        path = f"/jobs/{_segment(job_id, 'job_id')}/executions"
        return _Request("GET", path, _page_of(ExecutionInfo.of), params=params)

    @_Pages
    def iter_executions(
        job_id: str,
        *,
        status: ExecutionStatus | str | None = None,
        since: Instant | None = None,
        page_size: int | None = None,
    ) -> PageAt[ExecutionInfo]:
        """Every execution of the job (fired at or after ``since``), newest fire time first, page
        after page."""
        _segment(job_id, "job_id")
        return lambda cursor: _Api.list_executions._build(
            job_id, status=status, since=since, limit=page_size, cursor=cursor
        )

    @_Endpoint
    def get_execution(execution_id: str) -> _Request[ExecutionInfo]:
        """One execution with its attempts (``GET /executions/{id}``)."""
        path = f"/executions/{_segment(execution_id, 'execution_id')}"
        return _Request("GET", path, ExecutionInfo.of)

    # --- dead letters ---------------------------------------------------------------------------
    @_Endpoint
    def list_dead_letters(
        *, limit: int | None = None, cursor: str | None = None
    ) -> _Request[Page[DeadLetterInfo]]:
        """One page of dead letters (``GET /dead-letters``). See ``iter_dead_letters``."""
        params = _query(limit=limit, cursor=cursor)
        return _Request("GET", "/dead-letters", _page_of(DeadLetterInfo.of), params=params)

    @_Pages
    def iter_dead_letters(*, page_size: int | None = None) -> PageAt[DeadLetterInfo]:
        """Every dead letter, page after page."""
        return lambda cursor: _Api.list_dead_letters._build(limit=page_size, cursor=cursor)

    @_Endpoint
    def replay_dead_letter(dead_letter_id: str) -> _Request[ExecutionInfo]:
        """Put the failed execution back to run now with a fresh set of attempts; the dead letter
        is removed. Returns the execution."""
        path = f"/dead-letters/{_segment(dead_letter_id, 'dead_letter_id')}/replay"
        return _Request("POST", path, ExecutionInfo.of)

    @_Endpoint
    def drop_dead_letter(dead_letter_id: str) -> _Request[None]:
        """Remove the dead letter; the failed execution stays on record."""
        path = f"/dead-letters/{_segment(dead_letter_id, 'dead_letter_id')}"
        return _Request("DELETE", path, _nothing)

    # --- tenants -------------------------------------------------------------------------------
    @_Endpoint
    def get_tenant_limits(tenant: str) -> _Request[TenantLimitsInfo]:
        """The tenant's own fleet limits (None: the fleet's default) and its runs in flight."""
        return _Request("GET", f"/tenants/{_segment(tenant, 'tenant')}/limits", TenantLimitsInfo.of)

    @_Endpoint
    def set_tenant_limits(
        tenant: str,
        *,
        max_in_flight: int | None = None,
        max_starts_per_second: float | None = None,
    ) -> _Request[TenantLimitsInfo]:
        """Replace the tenant's own limits (None: the fleet's default); needs an admin key."""
        body = {"max_in_flight": max_in_flight, "max_starts_per_second": max_starts_per_second}
        path = f"/tenants/{_segment(tenant, 'tenant')}/limits"
        return _Request("PUT", path, TenantLimitsInfo.of, body=body)

    # --- tasks, schedules, health ---------------------------------------------------------------
    @_Endpoint
    def list_tasks() -> _Request[Page[TaskInfo]]:
        """The tasks registered on the server, by name, with their default policies."""
        return _Request("GET", "/tasks", _page_of(TaskInfo.of))

    @_Endpoint
    def preview(
        expression: str,
        *,
        timezone: str = "UTC",
        after: Instant | None = None,
        count: int | None = None,
    ) -> _Request[Preview]:
        """The next ``count`` (server default 10) fire times of a cron ``expression`` in
        ``timezone`` after ``after`` (default: now), each flagged where a DST gap or overlap
        moved it -- what a schedule will do, before saving it."""
        params = _query(expression=expression, timezone=timezone, after=after, count=count)
        return _Request("GET", "/schedules/preview", Preview.of, params=params)

    @_Endpoint
    def health() -> _Request[Health]:
        """Liveness (``GET /healthz``): the server process is up."""
        return _Request("GET", "/healthz", Health.of)

    @_Endpoint
    def ready() -> _Request[Readiness]:
        """Readiness (``GET /readyz``): the store answers. Raises ServiceUnavailableError if
        not."""
        return _Request("GET", "/readyz", Readiness.of)
