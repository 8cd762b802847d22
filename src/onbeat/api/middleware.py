"""ASGI middleware of the API: caps on the request head and body, applied before anything reads them, the
refusal of NUL in a URL, and request timing for the latency histogram."""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from onbeat.api.auth import is_public
from onbeat.api.problems import PROBLEM_MEDIA_TYPE, FieldError, problem_body
from onbeat.metrics import Metrics

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_HEAD_BYTES = 32 * 1024
"""The longest request line and headers the API reads, as nginx's default (4 buffers of 8 KiB)."""


class RequestSizeMiddleware:
    """Answer 431 to a request head (request line and headers) over ``MAX_HEAD_BYTES`` and 413
    to a body over ``max_bytes`` (problem documents), before anything else reads them. The body
    is judged by ``Content-Length`` when given and by the bytes actually received otherwise
    (chunked bodies).

    The head has been parsed by then: the server bounds what it buffers of a head still arriving
    (``onbeat.api.server``), and this makes the limit exact, whatever server runs the app.
    The body is read here, up to the cap, and handed on in one piece: the app parses JSON from
    memory anyway, and nothing downstream sees a body that is too large.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        head = len(scope.get("raw_path") or b"") + len(scope["query_string"])
        head += sum(len(name) + len(value) + 4 for name, value in headers)  # ": ", CRLF
        if head > MAX_HEAD_BYTES:
            why = f"are longer than the {MAX_HEAD_BYTES} bytes accepted"
            errors = [FieldError(field="headers", message=why)]
            detail = f"the request line and headers {why}"
            await _send_problem(send, 431, "head-too-large", detail, errors, close=True)
            return
        for name, value in headers:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._too_large(send)
                return
        chunks: list[bytes] = []
        size = 0
        pending: list[Message] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect: let the app see it
                pending.append(message)
                break
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        pending.insert(0, {"type": "http.request", "body": b"".join(chunks), "more_body": False})

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        message = f"is larger than the {self.max_bytes} bytes accepted"
        errors = [FieldError(field="body", message=message)]
        await _send_problem(send, 413, "payload-too-large", f"body {message}", errors, close=True)


class NulInUrlMiddleware:
    """Refuse NUL in a URL before any route sees it: in the path, an id or a tenant name with NUL
    names nothing (404); in a query value or name it is malformed (400, naming the parameter).
    PostgreSQL text cannot hold NUL, so the store's lookup would fail (a 500) instead of finding
    nothing. Placed after the auth check: a stranger still gets a 401 first."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):  # health checks read nothing
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"]:
            detail = f"no resource at {scope['path'].replace(chr(0), '%00')!r}"
            await _send_problem(send, 404, "not-found", detail)
            return
        for name, value in QueryParams(scope["query_string"]).multi_items():
            if "\x00" in name or "\x00" in value:
                shown = name.replace("\x00", "%00")
                message = "must not contain NUL"
                errors = [FieldError(field=shown, message=message)]
                await _send_problem(send, 400, "malformed-request", f"{shown}: {message}", errors)
                return
        await self.app(scope, receive, send)


async def _send_problem(
    send: Send,
    status: int,
    kind: str,
    detail: str,
    errors: list[FieldError] | None = None,
    close: bool = False,
) -> None:
    """Answer with a problem document from ASGI middleware (before the app's handlers exist)."""
    body = problem_body(status, kind, detail, errors or [])
    headers = [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestTimingMiddleware:
    """Observe every HTTP request's latency in ``onbeat_api_request_duration_seconds``, labelled
    by its route template (``/api/v1/jobs/{job_id}``, never the path itself, so that ids do not
    become label values) and method. A path no route matches (the dashboard's included) is
    labelled ``other``."""

    def __init__(self, app: ASGIApp, metrics: Metrics, prefixes: Mapping[int, str]) -> None:
        """``prefixes``: id(route) -> the prefix of the router it was included with (the route
        itself knows only its path within that router)."""
        self.app = app
        self.metrics = metrics
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            # The router records the route it matched in the scope (the middlewares between
            # here and the router pass that same scope on, never a copy).
            route = scope.get("route")
            template = self.prefixes.get(id(route), "") + getattr(route, "path", "other")
            self.metrics.api_request_duration.labels(template, scope["method"]).observe(
                time.perf_counter() - started
            )
