"""Errors as RFC 9457 problem documents (``application/problem+json``).

Every 4xx and 5xx the API answers is a :class:`Problem`: ``type`` (a URN naming the kind of problem),
``title`` (the same for every problem of that type), ``status``, ``detail`` (this occurrence) and
``errors``, one ``{field, message}`` per offending input. ``field`` is a dotted path into the JSON
body (``schedule.expression``), a query or path parameter name (``cursor``) or a header name
(``Idempotency-Key``).

Status codes, used consistently: **400** the request could not be read (malformed JSON, invalid
UTF-8, a cursor this API did not issue); **422** it was read but a value is invalid (a schema
violation or an :class:`onbeat.errors.ValidationError`); **401** no valid API key (with
``WWW-Authenticate: Bearer``); **403** the key's role may not do this; **404** no such resource or
route; **405** method not allowed; **409** the resource's state forbids the change; **413** body
too large; **431** request line and headers too long; **500** a stored record cannot be read
(``unreadable-record``: a row written behind onbeat's back; listings leave it out) or an unexpected
error; **503** not ready, or the store refuses writes (``store-refuses-writes``: disk full,
read-only; nothing was changed), or cannot be reached (``store-unavailable``: its server is down or
the connection dropped; nothing was changed), with ``Retry-After``; **504** the connection to the
store was lost while the change was being committed and the store could not say whether it was
(``store-outcome-unknown``: the change may have been applied; send a create again only with the
same ``Idempotency-Key``, and look a change up before making it again).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from onbeat.errors import (
    ConflictError,
    NotFoundError,
    QueueUnavailableError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
    StoreWriteRefusedError,
    UnreadableRecordError,
    ValidationError,
)

log = logging.getLogger("onbeat.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_SECONDS = 30
"""What a 503 asks the client to wait (``Retry-After``)."""
RETRY_AFTER_UNAVAILABLE = 5
"""What a 503 for an unreachable store or queue asks the client to wait: a dropped connection is
usually back within seconds."""
_MAX_MESSAGE = 500  # longest message echoed back; some messages quote user input

TITLES = {
    "malformed-request": "Malformed request",
    "invalid-cursor": "Invalid cursor",
    "validation": "Invalid request",
    "unauthorized": "Unauthorized",
    "forbidden": "Forbidden",
    "not-found": "Not found",
    "method-not-allowed": "Method not allowed",
    "conflict": "Conflict",
    "payload-too-large": "Request body too large",
    "head-too-large": "Request header fields too large",
    "not-ready": "Not ready",
    "store-refuses-writes": "Store refuses writes",
    "store-unavailable": "Store unavailable",
    "store-outcome-unknown": "Outcome unknown",
    "queue-unavailable": "Queue unavailable",
    "unreadable-record": "Stored record unreadable",
    "internal": "Internal server error",
    "http-error": "HTTP error",
}


def problem_type(kind: str) -> str:
    return f"urn:onbeat:problem:{kind}"


class FieldError(BaseModel):
    field: str = Field(
        description="The offending input: a dotted body path, a parameter or a header name."
    )
    message: str = Field(description="What is wrong with it.")


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field(
        description="A URN naming the kind of problem, e.g. urn:onbeat:problem:validation."
    )
    title: str
    status: int
    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class ProblemError(Exception):
    """Raised by route code to answer with a problem document."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        errors: Sequence[FieldError] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})


def problem_body(status: int, kind: str, detail: str, errors: Sequence[FieldError] = ()) -> bytes:
    document = Problem(
        type=problem_type(kind),
        title=TITLES.get(kind, TITLES["http-error"]),
        status=status,
        detail=_clip(detail),
        errors=list(errors),
    )
    return document.model_dump_json().encode()


def problem_response(
    status: int,
    kind: str,
    detail: str,
    errors: Sequence[FieldError] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        json.loads(problem_body(status, kind, detail, errors)),
        status_code=status,
        headers=dict(headers or {}),
        media_type=PROBLEM_MEDIA_TYPE,
    )


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries declaring problem documents for ``statuses``."""
    descriptions = {
        400: "Malformed request (unreadable JSON or UTF-8, or a cursor this API did not issue).",
        404: "No such resource (or one of another tenant).",
        409: "The resource's current state forbids this change.",
        413: "Request body too large.",
        422: "A value is invalid; `errors` names each offending field.",
        500: "A stored record cannot be read (written behind onbeat's back), or an unexpected "
        "error.",
        503: "The store refuses writes (disk full, read-only) or is unreachable; nothing was "
        "changed. Retry after `Retry-After` seconds.",
        504: "The connection to the store was lost while the change was being committed, and the "
        "store could not say whether it was: it may have been applied. Send a create again only "
        "with the same `Idempotency-Key`; look any other change up before making it again.",
    }
    return {s: {"model": Problem, "description": descriptions[s]} for s in statuses}


@contextmanager
def fields_renamed(names: Mapping[str, str]) -> Iterator[None]:
    """Re-raise an :class:`onbeat.errors.ValidationError` with its field named as the HTTP client
    knows it (the App says ``cron``; the request body says ``schedule.expression``)."""
    try:
        yield
    except ValidationError as exc:
        if exc.field not in names:
            raise
        raise ValidationError(names[exc.field], exc.message) from None


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _field_of(loc: Sequence[str | int]) -> str:
    """``("body", "schedule", "expression")`` -> ``schedule.expression``; ``("query", "limit")``
    -> ``limit``; ``("header", "idempotency-key")`` -> ``Idempotency-Key``."""
    if not loc:
        return "body"
    where, rest = loc[0], list(loc[1:])
    if where == "header" and rest:
        return "-".join(part.capitalize() for part in str(rest[0]).split("-"))
    if where not in ("body", "query", "path", "cookie"):
        rest = list(loc)
    if not rest:
        return "body"
    out = ""
    for part in rest:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def _summary(errors: Sequence[FieldError]) -> str:
    if len(errors) == 1:
        return f"{errors[0].field}: {errors[0].message}"
    return f"{len(errors)} inputs are invalid: " + ", ".join(sorted({e.field for e in errors}))


# --- handlers ---------------------------------------------------------------------------------
async def _on_request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    bad_json = [e for e in raw if e.get("type") == "json_invalid"]
    if bad_json:
        ctx = bad_json[0].get("ctx") or {}
        position = bad_json[0]["loc"][-1] if len(bad_json[0]["loc"]) > 1 else "?"
        message = f"is not valid JSON: {ctx.get('error', 'decode error')} at character {position}"
        errors = [FieldError(field="body", message=message)]
        return problem_response(400, "malformed-request", f"body {message}", errors)
    errors = [FieldError(field=_field_of(e["loc"]), message=_clip(str(e["msg"]))) for e in raw]
    return problem_response(422, "validation", _summary(errors), errors)


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    errors = [FieldError(field=exc.field, message=_clip(exc.message))]
    return problem_response(422, "validation", _summary(errors), errors)


async def _on_not_found(request: Request, exc: Exception) -> JSONResponse:
    return problem_response(404, "not-found", str(exc))


async def _on_conflict(request: Request, exc: Exception) -> JSONResponse:
    return problem_response(409, "conflict", str(exc))


async def _on_unreadable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnreadableRecordError)
    log.error("%s %s: %s", request.method, request.url.path, exc)
    detail = f"{exc}; repair or delete it in the store"
    return problem_response(500, "unreadable-record", detail)


async def _on_write_refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreWriteRefusedError)
    detail = f"{exc}; nothing was changed: retry later"
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return problem_response(503, "store-refuses-writes", detail, headers=headers)


def unavailable(exc: StoreUnavailableError | QueueUnavailableError) -> ProblemError:
    """The 503 for a store or queue that cannot be reached, wherever the request met it (a
    route, or the auth middleware before any route); the 504 for a change whose commit the
    store could not confirm or deny (no ``Retry-After``: sending it again may apply it twice)."""
    if isinstance(exc, StoreOutcomeUnknownError):
        detail = (
            f"{exc}; the change may have been applied: send a create again only with the same"
            " Idempotency-Key, and look any other change up before making it again"
        )
        return ProblemError(504, "store-outcome-unknown", detail)
    kind = "store-unavailable" if isinstance(exc, StoreUnavailableError) else "queue-unavailable"
    headers = {"Retry-After": str(RETRY_AFTER_UNAVAILABLE)}
    return ProblemError(503, kind, f"{exc}; nothing was changed: retry later", headers=headers)


async def _on_unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StoreUnavailableError | QueueUnavailableError)
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    problem = unavailable(exc)
    return problem_response(problem.status, problem.kind, problem.detail, headers=problem.headers)


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    return problem_response(exc.status, exc.kind, exc.detail, exc.errors, exc.headers)


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 400:
        # FastAPI answers 400 when the body cannot be decoded at all: say why, naming the body.
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):
            message = "is not valid UTF-8"
        elif isinstance(cause, RecursionError):
            message = "is nested too deeply to parse"
        elif isinstance(cause, ValueError):
            message = f"could not be parsed as JSON ({_clip(str(cause))})"
        else:
            message = "could not be parsed"
        errors = [FieldError(field="body", message=message)]
        return problem_response(400, "malformed-request", f"body {message}", errors, headers)
    if exc.status_code == 404:
        detail = f"no route for {request.method} {request.url.path}"
        return problem_response(404, "not-found", detail, headers=headers)
    if exc.status_code == 405:
        # Starlette names only the first route matching the path; list every method it takes.
        allowed = _allowed_methods(request)
        if allowed:
            headers["Allow"] = ", ".join(allowed)
        detail = f"{request.method} is not allowed on {request.url.path}"
        return problem_response(405, "method-not-allowed", detail, headers=headers)
    kind = "payload-too-large" if exc.status_code == 413 else "http-error"
    return problem_response(exc.status_code, kind, str(exc.detail), headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    spec = request.app.openapi_schema or request.app.openapi()  # the paths of every variant
    paths = spec.get("paths", {})
    if request.url.path in paths:
        # A literal path (/jobs/batch) is a resource of its own, though a template matches it too
        # (/jobs/{job_id}): its Allow is what it declares.
        return sorted(method.upper() for method in paths[request.url.path])
    for template, operations in paths.items():
        regex, _, _ = compile_path(template)
        if regex.match(request.url.path):
            methods.update(method.upper() for method in operations)
    return sorted(methods)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(500, "internal", "an unexpected error occurred; see the server log")


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(ValidationError, _on_validation)
    app.add_exception_handler(NotFoundError, _on_not_found)
    app.add_exception_handler(ConflictError, _on_conflict)
    app.add_exception_handler(UnreadableRecordError, _on_unreadable)
    app.add_exception_handler(StoreWriteRefusedError, _on_write_refused)
    app.add_exception_handler(StoreUnavailableError, _on_unavailable)
    app.add_exception_handler(QueueUnavailableError, _on_unavailable)
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)
