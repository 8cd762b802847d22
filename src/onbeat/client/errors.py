"""The client's errors: an :class:`ApiError` per kind of error response, each carrying the
server's problem document, and :class:`ApiConnectionError` for a server that cannot be reached."""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from onbeat.errors import ConflictError, NotFoundError, OnbeatError, ValidationError


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


def _connection_error(exc: httpx.TransportError, url: str) -> ApiConnectionError:
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return ApiTimeoutError(
            f"the onbeat API at {url} did not answer in time ({reason}); a write may still have "
            "been applied (an idempotency key makes a retried create safe)",
            url=url,
        )
    return ApiConnectionError(f"cannot reach the onbeat API at {url}: {reason}", url=url)
