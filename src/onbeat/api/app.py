"""``create_app``: the REST API of one onbeat App, as a FastAPI application.

Every route goes through the :class:`onbeat.App` (validation included); none writes SQL.
Store calls are synchronous, so the handlers that make them are plain ``def`` functions, which
FastAPI runs in its thread pool while the event loop keeps serving.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from onbeat.api.idempotency import IdempotencyKeys
from onbeat.api.middleware import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from onbeat.api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from onbeat.api.routes import dead_letters, executions, jobs, meta
from onbeat.app import App

API_PREFIX = "/api/v1"


def create_app(
    onbeat_app: App,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    idempotency_capacity: int = 10_000,
) -> FastAPI:
    """The API for ``onbeat_app``: routes under ``/api/v1``, the OpenAPI spec at
    ``/openapi.json``, docs at ``/docs``. Request bodies over ``max_bytes`` are refused (413)
    before they are parsed; ``idempotency_capacity`` bounds the in-memory Idempotency-Key map."""
    api = _OnbeatAPI(
        title="onbeat",
        version="1",
        summary="A distributed job scheduler: jobs, executions, dead letters.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    api.state.onbeat = onbeat_app
    api.state.idempotency_keys = IdempotencyKeys(idempotency_capacity)
    for module in (jobs, executions, dead_letters, meta):
        api.include_router(module.router, prefix=API_PREFIX)
    install_problem_handlers(api)
    api.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return api


class _OnbeatAPI(FastAPI):
    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = _errors_as_problems(super().openapi())
        return self.openapi_schema


def _errors_as_problems(spec: dict[str, Any]) -> dict[str, Any]:
    """Declare every 4xx/5xx response as ``application/problem+json``, the media type it has."""
    for path in spec.get("paths", {}).values():
        for operation in path.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[0] in "45" and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    return spec
