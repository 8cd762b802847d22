"""``create_app``: the REST API of one onbeat App, as a FastAPI application.

Every route goes through the :class:`onbeat.App` (validation included); none writes SQL. Every
``/api/v1`` route but the health checks needs an API key once one exists (``onbeat.api.auth``),
and answers for the key's tenant only.
Store calls are synchronous, so the handlers that make them are plain ``def`` functions, which
FastAPI runs in its thread pool while the event loop keeps serving.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI, Response

from onbeat.api.auth import SCHEME_NAME, AuthMiddleware, is_public, is_write
from onbeat.api.middleware import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    NulInUrlMiddleware,
    RequestSizeMiddleware,
    RequestTimingMiddleware,
)
from onbeat.api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers
from onbeat.api.routes import dead_letters, executions, jobs, meta, tenants
from onbeat.app import App
from onbeat.metrics import CONTENT_TYPE, Metrics

API_PREFIX = "/api/v1"


def create_app(
    onbeat_app: App,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: Metrics | None = None,
) -> FastAPI:
    """The API for ``onbeat_app``: routes under ``/api/v1``, the OpenAPI spec at
    ``/openapi.json``, docs at ``/docs``, and the web dashboard (``onbeat.dashboard``) at ``/``.
    Request bodies over ``max_bytes`` are refused (413) before they are parsed, and request
    lines and headers over ``MAX_HEAD_BYTES`` (431).

    ``GET /metrics`` serves ``metrics`` (the node's; a registry of the API's own if None) in the
    Prometheus text format, behind the same keys as the API: any valid key may read it, and
    while no key exists it is as open as the API (loopback only, enforced by ``onbeat up``)."""
    api = _OnbeatAPI(
        title="onbeat",
        version="1",
        summary="A distributed job scheduler: jobs, executions, dead letters.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    api.state.onbeat = onbeat_app
    for module in (jobs, executions, dead_letters, meta, tenants):
        api.include_router(module.router, prefix=API_PREFIX)
    served = metrics or Metrics()

    @api.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        return Response(served.exposition(), media_type=CONTENT_TYPE)

    install_problem_handlers(api)
    api.add_middleware(NulInUrlMiddleware)  # after the auth check (middleware added later is outer)
    api.add_middleware(RequestSizeMiddleware, max_bytes=max_body_bytes)
    api.add_middleware(AuthMiddleware, onbeat=onbeat_app)  # before the body is read
    from onbeat.dashboard import DashboardFirst  # imported here: the dashboard imports onbeat.api

    api.add_middleware(DashboardFirst, onbeat=onbeat_app)  # the web UI at /, with its own sessions
    prefixes = {
        id(route): API_PREFIX
        for module in (jobs, executions, dead_letters, meta, tenants)
        for route in module.router.routes
    }
    api.add_middleware(RequestTimingMiddleware, metrics=served, prefixes=prefixes)  # outermost
    return api


class _OnbeatAPI(FastAPI):
    """Serves the OpenAPI document as the node enforces it right now: bearer security is
    required on every non-public operation once an API key exists, and optional before."""

    _keyless_spec: dict[str, Any] | None = None

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            spec = _with_head_limit(_errors_as_problems(super().openapi()))
            self.openapi_schema = _with_security(spec)
            self._keyless_spec = _security_optional(self.openapi_schema)
        onbeat_app: App = self.state.onbeat
        if self._keyless_spec is not None and not onbeat_app.auth_enabled():
            return self._keyless_spec
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


_PROBLEM_REF = {"schema": {"$ref": "#/components/schemas/Problem"}}
_HEAD_TOO_LARGE = {
    "description": f"The request line and headers are longer than {MAX_HEAD_BYTES} bytes.",
    "content": {PROBLEM_MEDIA_TYPE: _PROBLEM_REF},
}


def _with_head_limit(spec: dict[str, Any]) -> dict[str, Any]:
    """Declare the 431 that :class:`onbeat.api.middleware.RequestSizeMiddleware` may answer to
    any request."""
    for path in spec.get("paths", {}).values():
        for operation in path.values():
            operation.setdefault("responses", {})["431"] = copy.deepcopy(_HEAD_TOO_LARGE)
    return spec


_UNAUTHORIZED = {
    "description": "No API key, or one that is malformed, unknown or revoked.",
    "headers": {
        "WWW-Authenticate": {
            "description": 'The bearer challenge, e.g. `Bearer realm="onbeat"`.',
            "required": True,
            "schema": {"type": "string"},
        }
    },
    "content": {PROBLEM_MEDIA_TYPE: _PROBLEM_REF},
}
_FORBIDDEN = {
    "description": "The key's role may not do this (a reader key may only read).",
    "content": {PROBLEM_MEDIA_TYPE: _PROBLEM_REF},
}
_SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An onbeat API key (`onbeat keys create --tenant NAME --role ROLE`), sent as "
    "`Authorization: Bearer KEY`. A key sees and changes only its tenant's jobs, executions and "
    "dead letters; a reader key may only read. While no key exists, a request without one acts "
    "for every tenant (the node then serves loopback only); a wrong key is refused either way.",
}


def _with_security(spec: dict[str, Any]) -> dict[str, Any]:
    """Declare bearer security, and the 401 (and for writes 403) it brings, on every operation
    :class:`onbeat.api.auth.AuthMiddleware` guards: the same predicate decides both."""
    spec.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME_NAME] = (
        _SECURITY_SCHEME
    )
    for template, path in spec.get("paths", {}).items():
        if is_public(template):
            continue
        for method, operation in path.items():
            operation["security"] = [{SCHEME_NAME: []}]
            responses = operation.setdefault("responses", {})
            responses["401"] = copy.deepcopy(_UNAUTHORIZED)
            if is_write(method):
                responses["403"] = copy.deepcopy(_FORBIDDEN)
    return spec


def _security_optional(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` as it holds while no key exists: a request may also come without one."""
    keyless = copy.deepcopy(spec)
    for path in keyless.get("paths", {}).values():
        for operation in path.values():
            if "security" in operation:
                operation["security"] = [{SCHEME_NAME: []}, {}]
    return keyless
