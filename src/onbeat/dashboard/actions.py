"""The actions (POST): create, edit, pause, resume, run now and cancel a job; replay and drop a
dead letter; log in and out. Each checks the session's CSRF token and the role (``Dashboard.
acting``), then calls the App method the REST API calls, scoped to the visitor's tenant, and
redirects to a page with a notice of what happened."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from onbeat.api.auth import MAX_KEY_LENGTH
from onbeat.dashboard import pages
from onbeat.dashboard.app import base_path, dashboard_of, safe_next
from onbeat.dashboard.forms import JobForm, read_form
from onbeat.dashboard.session import Notice, Session
from onbeat.errors import ConflictError, NotFoundError, ValidationError
from onbeat.schedule import ScheduleKind

Handler = Callable[[Request, dict[str, str]], Response]


def _in_pool(handler: Handler) -> Callable[[Request], Any]:
    """An endpoint that reads the form on the event loop, then runs ``handler`` (which makes
    blocking store calls) in the thread pool."""

    async def endpoint(request: Request) -> Response:
        form = await read_form(request)
        return await run_in_threadpool(handler, request, form)

    endpoint.__name__ = handler.__name__
    return endpoint


# --- jobs ---------------------------------------------------------------------------------------
def _create_job(request: Request, fields: dict[str, str]) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.acting(request, fields)
    form = JobForm.of(fields)
    try:
        when = form.schedule_args()
        job = dashboard.onbeat.schedule(
            form.task,
            form.params_value(),
            cron=when.cron,
            at=when.at,
            timezone=when.timezone,
            tenant=visitor.caller.home_tenant,
        )
    except ValidationError as exc:
        return pages.jobs_page(request, form=form.with_error(exc), status_code=422)
    return dashboard.done(request, f"/jobs/{job.id}", Notice("ok", f"Created job {job.id}."))


def _edit_job(request: Request, fields: dict[str, str]) -> Response:
    """A new schedule and/or params, as ``PATCH /api/v1/jobs/{id}``: a schedule equal to the
    current one changes nothing (its planned runs stay)."""
    dashboard = dashboard_of(request)
    visitor = dashboard.acting(request, fields)
    onbeat, tenant = dashboard.onbeat, visitor.caller.tenant
    job = onbeat.get_job(request.path_params["job_id"], tenant=tenant)
    form = JobForm.of({**fields, "kind": fields.get("kind") or job.schedule.kind.value})
    try:
        if form.kind == "now" and job.schedule.kind is not ScheduleKind.NOW:
            raise ValidationError("kind", "a job is not rescheduled to run now: use Run now")
        changes: dict[str, Any] = {}
        params = form.params_value()
        if params != job.params:
            changes["params"] = params
        if form.schedule() != job.schedule:
            changes |= dataclasses.asdict(form.schedule_args())
        if changes:
            onbeat.update_job(job.id, tenant=tenant, **changes)
    except ValidationError as exc:
        return pages.job_page(request, form=form.with_error(exc), status_code=422)
    except ConflictError as exc:
        return dashboard.done(request, f"/jobs/{job.id}", Notice("error", str(exc)))
    text = "Saved the job." if changes else "Nothing changed."
    return dashboard.done(request, f"/jobs/{job.id}", Notice("ok", text))


_JOB_ACTIONS = {
    "pause": ("pause", "Paused: nothing of it is dispatched until it is resumed."),
    "resume": ("resume", "Resumed."),
    "run": ("run_now", "Started a run now."),
    "cancel": ("cancel", "Cancelled: its pending runs are cancelled."),
}


def _job_action(request: Request, fields: dict[str, str]) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.acting(request, fields)
    job_id, action = request.path_params["job_id"], request.path_params["action"]
    if action not in _JOB_ACTIONS:
        raise NotFoundError(f"there is no job action {action!r}")
    method, done = _JOB_ACTIONS[action]
    try:
        getattr(dashboard.onbeat, method)(job_id, tenant=visitor.caller.tenant)
    except (ConflictError, ValidationError) as exc:
        return dashboard.done(request, f"/jobs/{job_id}", Notice("error", str(exc)))
    return dashboard.done(request, f"/jobs/{job_id}", Notice("ok", done))


# --- dead letters -------------------------------------------------------------------------------
def _dead_letter_action(request: Request, fields: dict[str, str]) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.acting(request, fields)
    execution_id, action = request.path_params["execution_id"], request.path_params["action"]
    onbeat, tenant = dashboard.onbeat, visitor.caller.tenant
    try:
        if action == "replay":
            onbeat.replay_dead_letter(execution_id, tenant=tenant)
            notice = Notice("ok", f"Replaying {execution_id}: it runs now with fresh attempts.")
        elif action == "drop":
            onbeat.drop_dead_letter(execution_id, tenant=tenant)
            notice = Notice("ok", f"Dropped {execution_id}; the failed run stays on record.")
        else:
            raise NotFoundError(f"there is no dead-letter action {action!r}")
    except (ConflictError, ValidationError) as exc:
        notice = Notice("error", str(exc))
    return dashboard.done(request, "/dead-letters", notice)


# --- sessions -----------------------------------------------------------------------------------
def _log_in(request: Request, fields: dict[str, str]) -> Response:
    """Exchange an API key for a session. The key goes no further than ``App.authenticate``:
    it is not logged, not echoed back on a failure, and never part of a URL."""
    dashboard = dashboard_of(request)
    dashboard.form_session(request, fields)
    key = fields.get("key", "").strip()
    session = dashboard.sessions.log_in(key) if len(key) <= MAX_KEY_LENGTH else None
    if session is None:
        refused = "That key is unknown or revoked."
        return pages.login_form(request, dashboard, refused, after=fields.get("next"))
    response = RedirectResponse(base_path(request) + safe_next(fields.get("next")), status_code=303)
    dashboard.sessions.set_session(response, request, session)
    return response


def _log_out(request: Request, fields: dict[str, str]) -> Response:
    dashboard = dashboard_of(request)
    dashboard.form_session(request, fields)
    response = RedirectResponse(base_path(request) + "/login", status_code=303)
    dashboard.sessions.set_session(response, request, Session.new())
    return response


create_job = _in_pool(_create_job)
edit_job = _in_pool(_edit_job)
job_action = _in_pool(_job_action)
dead_letter_action = _in_pool(_dead_letter_action)
log_in = _in_pool(_log_in)
log_out = _in_pool(_log_out)
