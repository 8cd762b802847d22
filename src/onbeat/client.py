"""A Python client for onbeat's REST API: :class:`Client` (blocking) and :class:`AsyncClient`.

Both have the same methods, one per endpoint, with the same arguments; on ``AsyncClient`` each is a
coroutine (and the ``iter_*`` methods are async iterators)::

    with Client("http://127.0.0.1:8000", api_key="onb_...") as onbeat:
        job = onbeat.create_job("reports.send", {"to": "ops@example.com"}, cron="0 9 * * MON-FRI",
                                timezone="Europe/Berlin")
        print(job.id, [f.at for f in job.next_fire_times])

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

How it is built: each endpoint is described once, by a function that turns the method's arguments
into a :class:`_Request` (HTTP method, path, query, body, and how to read the answer). The
:class:`_Endpoint` descriptor makes that function a method of both clients; each client only knows
how to send a ``_Request`` (``httpx.Client`` or ``httpx.AsyncClient``) -- so the two cannot drift.
"""

from __future__ import annotations

import email.utils
import inspect
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import TracebackType
from typing import Any, Generic, Literal, ParamSpec, Self, TypeVar, overload
from urllib.parse import quote

import httpx

from onbeat.errors import ConflictError, NotFoundError, OnbeatError, ValidationError
from onbeat.model import (
    AttemptOutcome,
    ExecutionStatus,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Trigger,
)
from onbeat.schedule import ScheduleKind

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
]

API_PREFIX = "/api/v1"
DEFAULT_TIMEOUT = 10.0
_USER_AGENT = "onbeat-client/1"

T = TypeVar("T")
P = ParamSpec("P")
Json = Any
"""A decoded JSON value."""
Instant = datetime | str
"""A timestamp argument: an aware ``datetime``, or an ISO-8601 string with a UTC offset."""


# --- results ------------------------------------------------------------------------------------
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


# --- errors -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FieldProblem:
    field: str
    """The offending input: a dotted body path (``schedule.expression``), a query parameter or a
    header name."""
    message: str


@dataclass(frozen=True, slots=True)
class Problem:
    """An RFC 9457 problem document, as the server sent it (or, for an error response that is not
    one -- from a proxy, say -- made up from the status and the body's first characters)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldProblem]

    @classmethod
    def of(cls, response: httpx.Response) -> Problem:
        phrase = response.reason_phrase or f"HTTP {response.status_code}"
        try:
            doc = response.json()
            if not isinstance(doc, dict):
                raise ValueError("not an object")
            return cls(
                type=str(doc.get("type", "about:blank")),
                title=str(doc.get("title") or phrase),
                status=int(doc.get("status", response.status_code)),
                detail=str(doc.get("detail") or ""),
                errors=[
                    FieldProblem(str(e.get("field", "")), str(e.get("message", "")))
                    for e in doc.get("errors") or []
                    if isinstance(e, dict)
                ],
            )
        except (ValueError, TypeError):
            text = " ".join(response.text.split())
            return cls("about:blank", phrase, response.status_code, text[:200], [])


class ApiError(OnbeatError):
    """The API answered with an error status. ``problem`` is its problem document."""

    def __init__(self, status: int, problem: Problem, *, method: str = "", url: str = "") -> None:
        self.status = status
        self.problem = problem
        self.method = method
        self.url = url
        self.retry_after: float | None = None
        """Seconds the server asked to wait before retrying (``Retry-After``), if it said."""
        Exception.__init__(self, self._summary())

    def _summary(self) -> str:
        text = f"{self.status} {self.problem.title}"
        if self.problem.detail:
            text += f": {self.problem.detail}"
        return text

    @property
    def errors(self) -> list[FieldProblem]:
        return self.problem.errors


class ApiValidationError(ApiError, ValidationError):
    """400, 413 or 422: the request was malformed or a value is invalid; nothing was changed.
    ``field``/``message`` are those of the first field error (as on ``onbeat.ValidationError``);
    ``errors`` lists them all."""

    def __init__(self, status: int, problem: Problem, *, method: str = "", url: str = "") -> None:
        super().__init__(status, problem, method=method, url=url)
        first = problem.errors[0] if problem.errors else FieldProblem("body", problem.detail)
        self.field = first.field
        self.message = first.message


class AuthenticationError(ApiError):
    """401: no API key was sent, or it is wrong or revoked."""


class PermissionDeniedError(ApiError):
    """403: the API key's role does not allow this."""


class ApiNotFoundError(ApiError, NotFoundError):
    """404: no such job, execution or dead letter (or it belongs to another tenant)."""


class ApiConflictError(ApiError, ConflictError):
    """409: the resource's current state forbids the change (e.g. resuming a cancelled job)."""


class RateLimitError(ApiError):
    """429: too many requests; wait ``retry_after`` seconds (if given)."""


class ServerError(ApiError):
    """5xx: the server failed; the request may or may not have been applied."""


class ServiceUnavailableError(ServerError):
    """503: the server is not ready (its store is unreachable); retry after ``retry_after``."""


class ApiConnectionError(OnbeatError, ConnectionError):
    """The API could not be reached (refused, DNS, TLS, dropped connection)."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class ApiTimeoutError(ApiConnectionError, TimeoutError):
    """The API did not answer within the client's timeout."""


_ERRORS: dict[int, type[ApiError]] = {
    400: ApiValidationError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: ApiNotFoundError,
    409: ApiConflictError,
    413: ApiValidationError,
    422: ApiValidationError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def _api_error(response: httpx.Response) -> ApiError:
    status = response.status_code
    kind = _ERRORS.get(status, ServerError if status >= 500 else ApiError)
    error = kind(
        status, Problem.of(response), method=response.request.method, url=str(response.url)
    )
    error.retry_after = _retry_after(response.headers.get("retry-after"))
    return error


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: delay-seconds or an HTTP date."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# --- requests -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Request(Generic[T]):
    """One API call: what to send, and how to read a successful answer's JSON (``None`` for an
    empty body) into the method's result."""

    method: str
    path: str
    parse: Callable[[Json], T]
    params: Mapping[str, str | int] | None = None
    body: Json = None
    headers: Mapping[str, str] | None = None


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


def _response_json(call: _Request[T], response: httpx.Response) -> T:
    """The result of a call from the server's answer; raises ``ApiError`` for an error status."""
    if response.is_error:
        raise _api_error(response)
    try:
        doc = response.json() if response.content else None
        return call.parse(doc)
    except (ValueError, KeyError, TypeError) as exc:
        # Not onbeat's API (another service on that port?) or an incompatible version.
        problem = Problem(
            "about:blank",
            "Unexpected response",
            response.status_code,
            f"{call.method} {call.path} answered what this client cannot read "
            f"({type(exc).__name__}: {exc}); is {response.url.host}:{response.url.port} an "
            "onbeat API of a compatible version?",
            [],
        )
        raise ApiError(
            response.status_code, problem, method=call.method, url=str(response.url)
        ) from exc


def _connection_error(exc: httpx.TransportError, url: str) -> ApiConnectionError:
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return ApiTimeoutError(
            f"the onbeat API at {url} did not answer in time ({reason}); a write may still have "
            "been applied (an idempotency key makes a retried create safe)",
            url=url,
        )
    return ApiConnectionError(f"cannot reach the onbeat API at {url}: {reason}", url=url)


# --- the methods: one description per endpoint ----------------------------------------------------
class _ClientMember:
    """A member of both clients, built from one describing function whose name, docstring and
    signature the bound methods carry (for help() and editors)."""

    kind = "member"

    def __init__(self, describe: Callable[..., Any]) -> None:
        self.__doc__ = describe.__doc__
        self.__name__ = describe.__name__
        self._signature = inspect.signature(describe).replace(
            return_annotation=inspect.Signature.empty
        )

    def __repr__(self) -> str:
        return f"<onbeat API {self.kind} {self.__name__}>"

    def _described(self, method: Callable[..., Any]) -> Any:
        method.__name__ = method.__qualname__ = self.__name__
        method.__doc__ = self.__doc__
        method.__signature__ = self._signature  # type: ignore[attr-defined]
        return method


class _Endpoint(_ClientMember, Generic[P, T]):
    """Makes ``build(*args) -> _Request[T]`` a method of both clients: on a :class:`Client` it
    returns ``T``; on an :class:`AsyncClient` it is a coroutine function returning ``T``."""

    kind = "method"

    def __init__(self, build: Callable[P, _Request[T]]) -> None:
        super().__init__(build)
        self._build = build

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, client: AsyncClient, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, client: Client | AsyncClient | None, owner: type[Any]) -> Any:
        if client is None:
            return self
        build = self._build
        method: Callable[..., Any]
        if isinstance(client, AsyncClient):
            async_client = client

            async def method(*args: P.args, **kwargs: P.kwargs) -> T:
                return await async_client._send(build(*args, **kwargs))

        else:
            sync_client = client

            def method(*args: P.args, **kwargs: P.kwargs) -> T:
                return sync_client._send(build(*args, **kwargs))

        return self._described(method)


PageAt = Callable[[str | None], _Request[Page[T]]]
"""The request for the page at a cursor (``None``: the first page)."""


class _Pages(_ClientMember, Generic[P, T]):
    """Makes ``pages(*args) -> PageAt[T]`` an iterator over every item of every page: an
    ``Iterator[T]`` on a :class:`Client`, an ``AsyncIterator[T]`` on an :class:`AsyncClient`.
    Pages are fetched as the iteration reaches them."""

    kind = "iterator"

    def __init__(self, pages: Callable[P, PageAt[T]]) -> None:
        super().__init__(pages)
        self._pages = pages

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: Client, owner: type[Any]) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type[Any]) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, client: Client | AsyncClient | None, owner: type[Any]) -> Any:
        if client is None:
            return self
        pages = self._pages
        method: Callable[..., Any]
        if isinstance(client, AsyncClient):
            async_client = client

            async def method(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
                page_at, cursor = pages(*args, **kwargs), None
                while True:
                    page = await async_client._send(page_at(cursor))
                    for item in page.items:
                        yield item
                    cursor = _next_cursor(cursor, page)
                    if cursor is None:
                        return

        else:
            sync_client = client

            def method(*args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
                page_at, cursor = pages(*args, **kwargs), None
                while True:
                    page = sync_client._send(page_at(cursor))
                    yield from page.items
                    cursor = _next_cursor(cursor, page)
                    if cursor is None:
                        return

        return self._described(method)


def _next_cursor(previous: str | None, page: Page[Any]) -> str | None:
    if page.next_cursor is not None and page.next_cursor == previous:
        raise RuntimeError(f"the API returned the cursor {previous!r} again; stopping")
    return page.next_cursor


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
        schedule: dict[str, Any] = {"type": "now", "timezone": timezone}
        if cron is not None:
            schedule.update(type="cron", expression=cron)
        if at is not None:  # with cron too: the server names the conflict (schedule.at)
            schedule.update(type="cron" if cron is not None else "once", at=_instant(at))
        body = {
            "task": task,
            "params": dict(params or {}),
            "schedule": schedule,
            **_drop_none(
                max_attempts=max_attempts,
                backoff=backoff,
                backoff_max=backoff_max,
                timeout=timeout,
                overlap=overlap,
                misfire=misfire,
                catchup_window=catchup_window,
                priority=priority,
                jitter=jitter,
            ),
        }
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Request("POST", "/jobs", JobInfo.of, body=body, headers=headers)

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


# --- the two transports ---------------------------------------------------------------------------
def _api_url(base_url: str) -> str:
    url = httpx.URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}"
        )
    path = url.path.rstrip("/")
    if not path.endswith(API_PREFIX):
        path += API_PREFIX
    return str(url.copy_with(path=path, query=None, fragment=None))


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _url(base: str, call: _Request[Any]) -> str:
    return base + call.path


def _content(call: _Request[Any]) -> tuple[bytes | None, dict[str, str]]:
    """The body bytes (strict JSON: NaN is refused here, not sent) and per-call headers."""
    headers = dict(call.headers or {})
    if call.body is None:
        return None, headers
    headers["Content-Type"] = "application/json"
    return json.dumps(call.body, allow_nan=False).encode(), headers


class Client(_Api):
    """Blocking client of an onbeat API. Use it as a context manager, or call :meth:`close`.

    ``api_key`` is sent as ``Authorization: Bearer KEY``; ``timeout`` (seconds) bounds each
    request. ``transport`` replaces the HTTP transport (tests: ``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _api_url(base_url)
        self._http = httpx.Client(headers=_headers(api_key), timeout=timeout, transport=transport)

    def _send(self, call: _Request[T]) -> T:
        url = _url(self.base_url, call)
        content, headers = _content(call)
        try:
            response = self._http.request(
                call.method, url, params=call.params, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise _connection_error(exc, url) from exc
        return _response_json(call, response)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"


class AsyncClient(_Api):
    """The same methods as :class:`Client`, as coroutines (``iter_*``: async iterators). Use it as
    an async context manager, or await :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = _api_url(base_url)
        self._http = httpx.AsyncClient(
            headers=_headers(api_key), timeout=timeout, transport=transport
        )

    async def _send(self, call: _Request[T]) -> T:
        url = _url(self.base_url, call)
        content, headers = _content(call)
        try:
            response = await self._http.request(
                call.method, url, params=call.params, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise _connection_error(exc, url) from exc
        return _response_json(call, response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"
