"""A Python client for onbeat's REST API: :class:`Client` (blocking) and :class:`AsyncClient`.

Both have the same methods, one per endpoint, with the same arguments; on ``AsyncClient`` each is a
coroutine (and the ``iter_*`` methods are async iterators)::

    with Client("http://127.0.0.1:8000", api_key="onb_...") as onbeat:
        job = onbeat.create_job("reports.send", {"to": "ops@example.com"}, cron="0 9 * * MON-FRI",
                                timezone="Europe/Berlin")
        print(job.id, [f.at for f in job.next_fire_times])
        jobs = onbeat.create_jobs([JobSpec("reports.send", {"to": to}) for to in recipients])

    async with AsyncClient("http://127.0.0.1:8000") as onbeat:
        async for job in onbeat.iter_jobs(status="active"):
            ...

``base_url`` is the server (``http://host:port``); ``/api/v1`` is appended unless the URL already
ends with it.

**Results** are frozen dataclasses of the API's JSON documents (:class:`JobInfo`,
:class:`JobDetail`, :class:`ExecutionInfo`, :class:`DeadLetterInfo`, :class:`TaskInfo`,
:class:`Preview`, :class:`AuditResult`, :class:`Page` of any of them...): timestamps are aware
``datetime``\\ s, statuses and policies are onbeat's enums (``JobStatus``, ``ExecutionStatus``...,
which compare equal to their string values). Each also keeps the JSON object it was read from in
``raw``, untouched (for fields this client does not know yet, and for printing).

**Errors**: every error response raises an :class:`ApiError` carrying the server's problem
document (``status``, ``problem.title``, ``problem.detail``, ``problem.errors`` naming each
offending field); its subclasses say which kind: :class:`ApiValidationError` (400, 413, 422; also
an ``onbeat.ValidationError``), :class:`AuthenticationError` (401), :class:`PermissionDeniedError`
(403), :class:`ApiNotFoundError` (404; also an ``onbeat.NotFoundError``), :class:`ApiConflictError`
(409; also an ``onbeat.ConflictError``), :class:`RateLimitError` (429), :class:`ServerError` (5xx)
and :class:`ServiceUnavailableError` (503); 429 and 503 carry ``retry_after`` (seconds) when the
server sends ``Retry-After``. A server that cannot be reached raises :class:`ApiConnectionError`
(:class:`ApiTimeoutError` when it does not answer in time), naming the URL.

How it is built, one module per part: ``results`` (the answers' dataclasses), ``errors`` (the
error types), ``endpoints`` (each endpoint described once, by a function that turns the method's
arguments into a ``_Request``: HTTP method, path, query, body, and how to read the answer),
``methods`` (the ``_Endpoint`` descriptor that makes such a function a method of both clients) and
``transport`` (the two clients, which only know how to send a ``_Request`` with ``httpx.Client`` or
``httpx.AsyncClient``) -- so the two cannot drift.
"""

from __future__ import annotations

# Names outside __all__ below are re-exported as the single-module client had them (for type
# hints, and the tests that list every endpoint).
from onbeat.client.endpoints import Instant as Instant
from onbeat.client.endpoints import JobSpec
from onbeat.client.endpoints import _Api as _Api
from onbeat.client.errors import (
    ApiConflictError,
    ApiConnectionError,
    ApiError,
    ApiNotFoundError,
    ApiTimeoutError,
    ApiValidationError,
    AuthenticationError,
    FieldProblem,
    PermissionDeniedError,
    Problem,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
)
from onbeat.client.methods import PageAt as PageAt
from onbeat.client.methods import _Endpoint as _Endpoint
from onbeat.client.results import (
    AttemptInfo,
    AuditResult,
    DeadLetterInfo,
    ExecutionInfo,
    FireTime,
    Health,
    JobDetail,
    JobInfo,
    Page,
    Preview,
    Readiness,
    ScheduleInfo,
    TaskInfo,
    TenantLimitsInfo,
)
from onbeat.client.results import Json as Json
from onbeat.client.transport import API_PREFIX as API_PREFIX
from onbeat.client.transport import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from onbeat.client.transport import AsyncClient, Client

__all__ = [
    "ApiConflictError",
    "ApiConnectionError",
    "ApiError",
    "ApiNotFoundError",
    "ApiTimeoutError",
    "ApiValidationError",
    "AsyncClient",
    "AttemptInfo",
    "AuditResult",
    "AuthenticationError",
    "Client",
    "DeadLetterInfo",
    "ExecutionInfo",
    "FieldProblem",
    "FireTime",
    "Health",
    "JobDetail",
    "JobInfo",
    "JobSpec",
    "Page",
    "PermissionDeniedError",
    "Preview",
    "Problem",
    "RateLimitError",
    "Readiness",
    "ScheduleInfo",
    "ServerError",
    "ServiceUnavailableError",
    "TaskInfo",
    "TenantLimitsInfo",
]
