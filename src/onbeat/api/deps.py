"""What route handlers share: the onbeat App they serve, the paging parameters and timestamps in
query strings. (The caller is ``onbeat.api.auth.CallerDep``.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import Depends, Query, Request, Response
from pydantic import BaseModel, TypeAdapter

from onbeat.api.cursors import MAX_CURSOR_LENGTH
from onbeat.api.schemas import MAX_TEXT
from onbeat.app import App
from onbeat.errors import ValidationError

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
PLAIN_VALUES: TypeAdapter[Any] = TypeAdapter(Any)
"""Writes plain values (datetimes, enums, dicts) as pydantic writes them in a model."""


_URL_PREFIXES: dict[tuple[Any, ...], str] = {}
_URL_PREFIXES_MAX = 256
"""Bounds the cache: a client can send any Host header."""


def resource_url(request: Request, route: str, param: str, value: str) -> str:
    """``str(request.url_for(route, **{param: value}))`` for a route whose path ends with that
    parameter, for the cost of a dict look-up. Starlette's ``url_for`` walks the router, raising
    NoMatchFound at each route it passes, and builds three URLs: 8 % of an ``onbeat api``'s CPU
    in W5's single creates, for the Location of each. The prefix before the parameter is made
    by ``url_for`` itself, once per route, scheme, host and root path."""
    scope = request.scope
    host = next((raw for name, raw in scope["headers"] if name == b"host"), None)
    server = scope.get("server")  # used when there is no Host header; a list in some servers
    key = (route, scope["scheme"], server and tuple(server), scope.get("root_path"), host)
    prefix = _URL_PREFIXES.get(key)
    if prefix is None:
        probe = str(request.url_for(route, **{param: "_"}))
        assert probe.endswith("/_"), f"{route}'s path does not end with {{{param}}}"
        prefix = probe[:-1]
        if len(_URL_PREFIXES) >= _URL_PREFIXES_MAX:
            _URL_PREFIXES.clear()
        _URL_PREFIXES[key] = prefix
    return prefix + value


async def _onbeat_app(request: Request) -> App:
    app: App = request.app.state.onbeat
    return app


OnbeatApp = Annotated[App, Depends(_onbeat_app)]
Cursor = Annotated[
    str | None,
    Query(
        max_length=MAX_CURSOR_LENGTH,
        description="The next_cursor of the previous page; omit for the first page.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Items per page.")]
Timestamp = Annotated[
    str | None,
    Query(
        max_length=MAX_TEXT,
        description="ISO-8601 with a UTC offset (send '+' as %2B).",
        json_schema_extra={"format": "date-time"},
    ),
]


def parse_instant(field: str, text: str) -> datetime:
    """``text`` as an aware UTC datetime; a ValidationError naming ``field`` (422) if it is not
    ISO-8601, has no UTC offset or is out of range."""
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        hint = " (a '+' in a query string must be sent as %2B)" if " " in text else ""
        raise ValidationError(field, f"is not an ISO-8601 timestamp{hint}") from None
    if parsed.utcoffset() is None:
        raise ValidationError(field, "has no UTC offset; add one, e.g. 'Z' or '%2B02:00'")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValidationError(field, "is out of range") from None


def serialized(
    content: BaseModel | dict[str, Any],
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    *,
    in_utc: bool = False,
) -> Response:
    """``content`` as a JSON response, serialized in the calling route's thread. A sync route that
    returns a model has FastAPI validate and serialize it in another hand-off to a thread; under
    load the hand-offs cost the API more CPU than the work (bench/README.md, W5). The route
    keeps its ``response_model`` for the OpenAPI document. A dict of plain values (such as
    ``schemas.job_document``) is written with pydantic's bytes too, as its model would be;
    ``in_utc`` (every datetime in it is in UTC): by :func:`plain_json`."""
    body: str | bytes
    if isinstance(content, BaseModel):
        body = content.model_dump_json()
    elif in_utc:
        body = plain_json(content)
    else:
        body = PLAIN_VALUES.dump_json(content)
    return Response(body, status_code, headers, "application/json")


def plain_json(content: dict[str, Any]) -> bytes:
    """``PLAIN_VALUES.dump_json(content)``'s bytes for content whose datetimes are all in UTC,
    written by orjson: 2.6 against 19 us a created job (docs/performance.md, W5). orjson
    writes the same bytes but for an integer past 64 bits, which it refuses (then pydantic
    writes it all), and a UTC offset with seconds, which it rounds to the minute where pydantic
    truncates (hence UTC only). tests/api/test_job_document.py holds the bytes equal."""
    try:
        return orjson.dumps(content, option=orjson.OPT_UTC_Z)
    except orjson.JSONEncodeError:  # an integer past 64 bits, in params
        return PLAIN_VALUES.dump_json(content)
