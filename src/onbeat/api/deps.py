"""What route handlers share: the onbeat App they serve, and the paging parameters."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from onbeat.api.cursors import MAX_CURSOR_LENGTH
from onbeat.api.idempotency import IdempotencyKeys
from onbeat.app import App

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


async def _onbeat_app(request: Request) -> App:
    app: App = request.app.state.onbeat
    return app


async def _idempotency_keys(request: Request) -> IdempotencyKeys:
    keys: IdempotencyKeys = request.app.state.idempotency_keys
    return keys


OnbeatApp = Annotated[App, Depends(_onbeat_app)]
IdempotencyMap = Annotated[IdempotencyKeys, Depends(_idempotency_keys)]
Cursor = Annotated[
    str | None,
    Query(
        max_length=MAX_CURSOR_LENGTH,
        description="The next_cursor of the previous page; omit for the first page.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Items per page.")]
