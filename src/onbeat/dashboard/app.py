"""The dashboard as an ASGI app, and :class:`DashboardFirst`, which serves it beside the API.

Pages (GET) render for any visitor the session admits; actions (POST) also need the session's
CSRF token and a writer's role, and then call the same ``App`` methods the REST API calls, with
the visitor's tenant, so validation and tenancy are the API's. Store calls are blocking: GET
handlers are plain functions (Starlette runs them in its thread pool) and POST handlers read
the body, then hand the work to the pool.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from onbeat.api.middleware import RequestSizeMiddleware
from onbeat.app import App
from onbeat.dashboard.render import render
from onbeat.dashboard.session import LoginRequired, Notice, Session, Sessions, Visitor
from onbeat.errors import NotFoundError

MAX_FORM_BYTES = 512 * 1024
"""A job's params may be 64 KiB of JSON; form encoding can triple that."""
DASHBOARD_PATHS = ("/jobs", "/dead-letters", "/login", "/logout", "/preview", "/static")
"""Paths the dashboard serves (each with everything under it), besides ``/`` itself."""
REFRESH_HEADER = "x-onbeat-refresh"
"""Sent by the page script's live refresh: the page is re-rendered but its notice stays."""


class Forbidden(Exception):
    """The visitor may not do this (a reader's action, a missing or wrong CSRF token)."""


class Dashboard:
    """What every handler shares: the App and its sessions."""

    def __init__(self, onbeat: App) -> None:
        self.onbeat = onbeat
        self.sessions = Sessions(onbeat)

    def page(
        self,
        request: Request,
        visitor: Visitor,
        template: str,
        *,
        status_code: int = 200,
        **context: Any,
    ) -> Response:
        """Render ``template`` for ``visitor``, with the notice an action left for this page."""
        refresh = REFRESH_HEADER in request.headers
        notice = None if refresh else self.sessions.read_notice(request)
        response = render(
            template,
            status_code,
            visitor=visitor,
            base=base_path(request),
            now=self.onbeat.store.now(),
            notice=notice,
            **context,
        )
        if not refresh:
            self.sessions.clear_notice(request, response)
        if visitor.new_session:
            self.sessions.set_session(response, request, visitor.session)
        return response

    def acting(self, request: Request, form: dict[str, str]) -> Visitor:
        """The visitor of a state-changing request, once its origin, CSRF token and role check
        out (Forbidden otherwise)."""
        visitor = self.sessions.visitor(request)
        same_origin(request)
        if visitor.new_session or not self.sessions.csrf_valid(visitor.session, form.get("csrf")):
            raise Forbidden(
                "This form has no valid CSRF token (it is stale, or it came from another site). "
                "Reload the page and try again."
            )
        if not visitor.can_write:
            raise Forbidden(
                f"Your key is a {visitor.caller.role.value} key, which may only look; "
                "this needs a writer key."
            )
        return visitor

    def form_session(self, request: Request, form: dict[str, str]) -> Session:
        """The session of a form that needs no login (logging in or out), once its origin and
        CSRF token check out (Forbidden otherwise)."""
        same_origin(request)
        session, fresh = self.sessions.anonymous(request)
        if fresh or not self.sessions.csrf_valid(session, form.get("csrf")):
            raise Forbidden("This form has expired or came from another site; reload it.")
        return session

    def done(self, request: Request, to: str, notice: Notice) -> Response:
        """Redirect after an action (POST, then GET), leaving ``notice`` for the next page."""
        response = RedirectResponse(base_path(request) + to, status_code=303)
        self.sessions.set_notice(response, request, notice)
        return response


def dashboard_of(request: Request) -> Dashboard:
    found: Dashboard = request.app.state.dashboard
    return found


def base_path(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def same_origin(request: Request) -> None:
    """Refuse a request a browser says came from another site (a second line behind the
    SameSite=Strict cookie and the CSRF token)."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise Forbidden("This request came from another site.")
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden("This request came from another site.")


def safe_next(value: str | None) -> str:
    """A path on this dashboard to go to after logging in; anything else is ``/``."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


# --- errors -------------------------------------------------------------------------------------
async def _login_required(request: Request, exc: Exception) -> Response:
    target = request.url.path.removeprefix(base_path(request))
    if request.method == "GET" and request.url.query:
        target += "?" + request.url.query
    query = "" if target == "/" or request.method != "GET" else f"?next={quote(target, safe='/')}"
    return RedirectResponse(f"{base_path(request)}/login{query}", status_code=303)


async def _forbidden(request: Request, exc: Exception) -> Response:
    return render("error.html", 403, title="Not allowed", message=str(exc), base=base_path(request))


async def _not_found(request: Request, exc: Exception) -> Response:
    message = str(exc) if isinstance(exc, NotFoundError) else "There is no page here."
    return render("error.html", 404, title="Not found", message=message, base=base_path(request))


# --- the app ------------------------------------------------------------------------------------
def create_dashboard(onbeat: App) -> Starlette:
    from onbeat.dashboard import actions, pages

    routes = [
        Route("/", pages.overview_page, methods=["GET"]),
        Route("/jobs", pages.jobs_page, methods=["GET"]),
        Route("/jobs", actions.create_job, methods=["POST"]),
        Route("/jobs/{job_id}", pages.job_page, methods=["GET"]),
        Route("/jobs/{job_id}/edit", actions.edit_job, methods=["POST"]),
        Route("/jobs/{job_id}/{action}", actions.job_action, methods=["POST"]),
        Route("/dead-letters", pages.dead_letters_page, methods=["GET"]),
        Route(
            "/dead-letters/{execution_id}/{action}", actions.dead_letter_action, methods=["POST"]
        ),
        Route("/preview", pages.preview_fragment, methods=["GET"]),
        Route("/login", pages.login_page, methods=["GET"]),
        Route("/login", actions.log_in, methods=["POST"]),
        Route("/logout", actions.log_out, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("onbeat.dashboard", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RequestSizeMiddleware, max_bytes=MAX_FORM_BYTES)],
        exception_handlers={
            LoginRequired: _login_required,
            Forbidden: _forbidden,
            NotFoundError: _not_found,
            404: _not_found,
        },
    )
    app.state.dashboard = Dashboard(onbeat)
    return app


class DashboardFirst:
    """Serve the dashboard's paths with the dashboard and everything else with the wrapped API.

    Added as the API's outermost middleware, so a dashboard request never meets the API's
    bearer-key middleware: the dashboard authenticates with its own session cookie, by the
    same keys and roles.
    """

    def __init__(self, app: ASGIApp, onbeat: App) -> None:
        self.api = app
        self.dashboard = create_dashboard(onbeat)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_dashboard_path(_route_path(scope)):
            await self.dashboard(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def is_dashboard_path(path: str) -> bool:
    return path == "/" or any(path == p or path.startswith(p + "/") for p in DASHBOARD_PATHS)


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
