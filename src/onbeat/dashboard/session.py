"""Who is looking at the dashboard: signed session cookies, CSRF tokens and one-shot notices.

A browser logs in once with an API key (``POST /login``); the key is checked with
``App.authenticate`` and then forgotten: the session cookie holds only the key's *id*, signed
with a secret kept in the store (every process on the store signs with the same one), and each
request looks the key up again by id, so revoking a key ends its sessions at once. The cookie is
HttpOnly and SameSite=Strict. While no API key exists the dashboard is open exactly as the API
is (the node then serves loopback only), but a browser still gets an anonymous session: every
form carries a CSRF token derived from the session id, and a request without the session cookie
(another site's form) cannot know it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from onbeat.api.auth import Caller
from onbeat.app import App
from onbeat.auth import Role

SESSION_COOKIE = "onbeat_session"
NOTICE_COOKIE = "onbeat_notice"
SESSION_TTL = 12 * 3600
"""Seconds a login lasts; then the key is asked for again."""
NOTICE_TTL = 60
SECRET_NAME = "dashboard.session"


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    """Random; the CSRF token is derived from it. A login issues a new one."""
    key_id: str | None
    """The API key this browser logged in with; None for an anonymous session."""

    @classmethod
    def new(cls, key_id: str | None = None) -> Session:
        return cls(secrets.token_urlsafe(24), key_id)


@dataclass(frozen=True, slots=True)
class Visitor:
    """The caller of one dashboard request."""

    caller: Caller
    session: Session
    csrf: str
    open_access: bool
    """No API key exists: everyone on loopback is an admin of every tenant."""
    new_session: bool
    """The session was made by this request: its cookie must be sent."""

    @property
    def can_write(self) -> bool:
        return self.caller.role.allows(Role.WRITER)


@dataclass(frozen=True, slots=True)
class Notice:
    """A message for the next page shown (the result of an action, after its redirect)."""

    kind: str
    """``ok`` or ``error``."""
    text: str


class LoginRequired(Exception):
    """The request needs a logged-in session it does not have."""


class Sessions:
    """Reads, issues and checks the dashboard's cookies for one App."""

    def __init__(self, onbeat: App) -> None:
        self.onbeat = onbeat
        self._serializer: URLSafeTimedSerializer | None = None
        self._csrf_key = b""

    def _signer(self) -> URLSafeTimedSerializer:
        # Made on first use (a store call), in the thread pool like every store call.
        if self._serializer is None:
            secret = self.onbeat.store.secret_get_or_create(SECRET_NAME, secrets.token_hex(32))
            self._csrf_key = hashlib.sha256(b"csrf:" + secret.encode()).digest()
            self._serializer = URLSafeTimedSerializer(secret, salt="onbeat.dashboard")
        return self._serializer

    # --- sessions ------------------------------------------------------------------------------
    def visitor(self, request: Request) -> Visitor:
        """The caller of ``request``. Raises LoginRequired when API keys exist and the request has
        no session of an active key. Makes blocking store calls."""
        session = self._read(request, SESSION_COOKIE, SESSION_TTL)
        current = Session(session["sid"], session.get("key")) if session else None
        if not self.onbeat.auth_enabled():
            fresh = current is None
            current = current or Session.new()
            caller = Caller(tenant=None, role=Role.ADMIN, key_id=None)
            return Visitor(caller, current, self.csrf_token(current), True, fresh)
        key = self.onbeat.store.api_key_get(current.key_id) if current and current.key_id else None
        if current is None or key is None:
            raise LoginRequired
        caller = Caller(tenant=key.tenant, role=key.role, key_id=key.id)
        return Visitor(caller, current, self.csrf_token(current), False, False)

    def anonymous(self, request: Request) -> tuple[Session, bool]:
        """The request's session, or a new anonymous one (True: it is new), for the login form."""
        found = self._read(request, SESSION_COOKIE, SESSION_TTL)
        if found:
            return Session(found["sid"], found.get("key")), False
        return Session.new(), True

    def log_in(self, key: str) -> Session | None:
        """A new session for ``key``, or None if it is not an active key. The key itself is kept
        nowhere: only its id goes into the session."""
        api_key = self.onbeat.authenticate(key)
        return None if api_key is None else Session.new(api_key.id)

    def set_session(self, response: Response, request: Request, session: Session) -> None:
        value = self._signer().dumps({"sid": session.sid, "key": session.key_id})
        _set_cookie(response, request, SESSION_COOKIE, value, SESSION_TTL)

    # --- CSRF ----------------------------------------------------------------------------------
    def csrf_token(self, session: Session) -> str:
        self._signer()
        return hmac.new(self._csrf_key, session.sid.encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, session: Session, token: str | None) -> bool:
        expected = self.csrf_token(session).encode()
        return token is not None and hmac.compare_digest(expected, token.encode())

    # --- notices -------------------------------------------------------------------------------
    def set_notice(self, response: Response, request: Request, notice: Notice) -> None:
        value = self._signer().dumps({"kind": notice.kind, "text": notice.text}, salt="notice")
        _set_cookie(response, request, NOTICE_COOKIE, value, NOTICE_TTL)

    def read_notice(self, request: Request) -> Notice | None:
        found = self._read(request, NOTICE_COOKIE, NOTICE_TTL, salt="notice")
        return Notice(str(found["kind"]), str(found["text"])) if found else None

    def clear_notice(self, request: Request, response: Response) -> None:
        """Have the browser drop the notice it showed."""
        if NOTICE_COOKIE in request.cookies:
            response.delete_cookie(NOTICE_COOKIE, path=_cookie_path(request))

    def _read(
        self, request: Request, cookie: str, max_age: int, salt: str | None = None
    ) -> dict[str, Any] | None:
        raw = request.cookies.get(cookie)
        if not raw:
            return None
        try:
            value = self._signer().loads(raw, max_age=max_age, salt=salt)
        except BadSignature:  # also expired (SignatureExpired is a BadSignature)
            return None
        return value if isinstance(value, dict) else None


def _cookie_path(request: Request) -> str:
    return request.scope.get("root_path", "") or "/"


def _set_cookie(response: Response, request: Request, name: str, value: str, ttl: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=ttl,
        path=_cookie_path(request),
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
