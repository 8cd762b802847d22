"""Who is calling: API keys (``Authorization: Bearer KEY``), their tenant and their role.

:class:`AuthMiddleware` resolves the caller of every request before anything else looks at it
(before the body is read or parsed, before routing), so an unauthenticated request is a 401 and a
reader's write a 403 whatever else is wrong with it, and a refused request never reaches a route.
Routes get the result through the :data:`Caller` dependency and pass ``caller.tenant`` to every
App call, which answers another tenant's ids exactly like unknown ones (404).

The rules:

- **No active key exists** (``App.auth_enabled()`` is False; the node then serves loopback only,
  enforced by ``onbeat up``): a request without ``Authorization`` acts as an admin of every tenant
  (no tenant filter; jobs it creates belong to :data:`DEFAULT_TENANT`).
- **A request that sends** ``Authorization`` must send ``Bearer KEY`` with an active key, in every
  mode: a malformed, unknown or revoked key is a 401, even while no key is required.
- **Once a key exists**, a request without one is a 401. A ``reader`` key may only read (GET); a
  write needs a ``writer`` or ``admin`` key (403 otherwise).

:func:`is_public` names the paths that need no key (liveness, readiness, the spec and its docs);
the OpenAPI document declares bearer security on every other operation from the same predicate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from onbeat.api.problems import (
    PROBLEM_MEDIA_TYPE,
    FieldError,
    ProblemError,
    problem_body,
    unavailable,
)
from onbeat.app import App
from onbeat.auth import DEFAULT_TENANT, ApiKey, Role
from onbeat.errors import QueueUnavailableError, StoreUnavailableError

"""The tenant of jobs created while no key is configured (``App.schedule``'s default)."""
PUBLIC_PATHS = frozenset(
    {"/api/v1/healthz", "/api/v1/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect"}
)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_KEY_LENGTH = 512
"""Longer bearer tokens are refused unhashed (onbeat's keys are about 70 characters)."""
log = logging.getLogger("onbeat.api")
SCHEME_NAME = "bearer"
"""The security scheme's name in the OpenAPI document."""
_SCOPE_KEY = "onbeat.caller"
_REALM = 'Bearer realm="onbeat"'


@dataclass(frozen=True, slots=True)
class Caller:
    """The resolved caller of a request."""

    tenant: str | None
    """The tenant every App call is scoped to; None (every tenant) only while no key exists."""
    role: Role
    key_id: str | None
    """The API key's id; None for an unauthenticated caller (no key configured)."""

    @property
    def home_tenant(self) -> str:
        """The tenant that owns what this caller creates."""
        return self.tenant if self.tenant is not None else DEFAULT_TENANT


def is_public(path: str) -> bool:
    """Whether a route path is served without a key."""
    return path in PUBLIC_PATHS


def is_write(method: str) -> bool:
    return method.upper() not in READ_METHODS


def unauthorized(message: str, *, invalid_token: bool) -> ProblemError:
    challenge = f'{_REALM}, error="invalid_token"' if invalid_token else _REALM
    return ProblemError(
        401,
        "unauthorized",
        f"Authorization {message}",
        [FieldError(field="Authorization", message=message)],
        headers={"WWW-Authenticate": challenge},
    )


def resolve_caller(onbeat: App, authorization: str | None) -> Caller:
    """The caller an ``Authorization`` header value (None: no header) stands for; a 401
    ProblemError if it stands for none. May make blocking store calls."""
    if authorization is None:
        return _keyless_caller(onbeat.auth_enabled())
    api_key = onbeat.authenticate(_bearer_key(authorization))
    if api_key is None:
        raise unauthorized("carries a key that is unknown or revoked", invalid_token=True)
    return _caller_of(api_key)


def resolve_caller_known(onbeat: App, authorization: str | None) -> Caller | None:
    """:func:`resolve_caller` without blocking: None where it would need a store read (a key
    or the keys' existence not read within ``KEYS_EXIST_TTL``). Saves most requests the hand-off
    to a thread, which costs an API under load more CPU than the check itself."""
    if authorization is None:
        enabled = onbeat.auth_enabled_known()
        return None if enabled is None else _keyless_caller(enabled)
    api_key = onbeat.authenticate_known(_bearer_key(authorization))
    return None if api_key is None else _caller_of(api_key)


def _keyless_caller(auth_enabled: bool) -> Caller:
    if auth_enabled:
        raise unauthorized(
            "is required: send 'Authorization: Bearer KEY' with an onbeat API key",
            invalid_token=False,
        )
    return Caller(tenant=None, role=Role.ADMIN, key_id=None)


def _bearer_key(authorization: str) -> str:
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key or " " in key or len(key) > MAX_KEY_LENGTH:
        raise unauthorized("must be 'Bearer KEY' with an onbeat API key", invalid_token=True)
    return key


def _caller_of(api_key: ApiKey) -> Caller:
    return Caller(tenant=api_key.tenant, role=api_key.role, key_id=api_key.id)


def authorize(caller: Caller, method: str) -> None:
    """A 403 ProblemError if ``caller`` may not make a request with ``method``."""
    if is_write(method) and not caller.role.allows(Role.WRITER):
        message = (
            f"is a {caller.role.value} key, which may only read (GET); this needs a writer key"
        )
        raise ProblemError(
            403,
            "forbidden",
            f"Authorization {message}",
            [FieldError(field="Authorization", message=message)],
        )


class AuthMiddleware:
    """Resolve and authorize the caller of every non-public request, first of all.

    A refused request is answered here with a problem document; an accepted one goes on with the
    caller in its scope, where :func:`current_caller` finds it.
    """

    def __init__(self, app: ASGIApp, onbeat: App) -> None:
        self.app = app
        self.onbeat = onbeat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(_route_path(scope)):
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        try:
            if len(values) > 1:
                raise unauthorized("must be sent once", invalid_token=True)
            header = values[0].decode("latin-1") if values else None
            caller = resolve_caller_known(self.onbeat, header)
            if caller is None:
                caller = await run_in_threadpool(resolve_caller, self.onbeat, header)
            authorize(caller, scope["method"])
        except ProblemError as exc:
            await _send_problem(send, exc)
            return
        except (StoreUnavailableError, QueueUnavailableError) as exc:
            # Before any route, so the app's exception handlers would not see it: a 503 with
            # Retry-After here too, not a 500 (the key lookup is a store read).
            log.warning("%s %s: %s", scope["method"], scope["path"], exc)
            await _send_problem(send, unavailable(exc))
            return
        scope[_SCOPE_KEY] = caller  # in place: RequestTimingMiddleware reads the route back
        await self.app(scope, receive, send)


async def current_caller(request: Request) -> Caller:
    """The caller :class:`AuthMiddleware` resolved for this request."""
    found = request.scope.get(_SCOPE_KEY)
    if isinstance(found, Caller):
        return found
    # Not behind the middleware (a router mounted elsewhere): resolve and authorize here.
    caller = await run_in_threadpool(
        resolve_caller, request.app.state.onbeat, request.headers.get("authorization")
    )
    authorize(caller, request.method)
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]


def _route_path(scope: Scope) -> str:
    """The path the router matches (``path`` without the ``root_path`` it is mounted under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


async def _send_problem(send: Send, exc: ProblemError) -> None:
    body = problem_body(exc.status, exc.kind, exc.detail, exc.errors)
    headers = [
        (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()),
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
