"""The pages (GET): overview, jobs, one job, dead letters, the login form and the schedule
preview fragment. Plain functions: Starlette runs them in its thread pool, where store calls
belong."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from onbeat.app import App
from onbeat.audit import AuditReport
from onbeat.dashboard.app import Dashboard, base_path, dashboard_of, safe_next
from onbeat.dashboard.forms import JobForm, at_in_zone
from onbeat.dashboard.overview import overview
from onbeat.dashboard.render import render
from onbeat.errors import NotFoundError, ValidationError
from onbeat.model import Job, JobStatus
from onbeat.schedule import MAX_CRON_LENGTH, FireTime, Schedule, ScheduleKind

PAGE_SIZE = 50
EXECUTIONS_PAGE = 25
NEXT_FIRES = 10
PREVIEW_FIRES = 8
AUDIT_DAY, AUDIT_HOUR = timedelta(days=1), timedelta(hours=1)
"""The audit on a job's page covers the last day, or the last hour for a schedule that fired
more than once a minute in it: a day of an every-second job is 86,400 fire times to replay."""
MAX_SEARCH = 200
_ID = re.compile(r"[0-9A-Za-z_-]{1,100}")
_BEGINNING = datetime(1, 1, 2, tzinfo=UTC)
"""Before every ``at`` time: a once schedule's preview shows its time even if it has passed."""
DST_NOTES = {
    "gap": "DST gap: this local time did not exist; it fires at the first instant after the gap",
    "overlap": "DST overlap: this local time occurs twice; it fires once",
}


def overview_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.sessions.visitor(request)
    figures = overview(dashboard.onbeat, visitor.caller.tenant)
    return dashboard.page(request, visitor, "overview.html", section="overview", ov=figures)


# --- jobs ---------------------------------------------------------------------------------------
def jobs_page(request: Request, form: JobForm | None = None, status_code: int = 200) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.sessions.visitor(request)
    query = request.query_params
    status = _job_status(query.get("status"))
    text = query.get("q", "").strip()[:MAX_SEARCH]
    after = _id_or_none(query.get("after"))
    found = dashboard.onbeat.store.job_search(
        tenant=visitor.caller.tenant,
        status=status,
        text=text or None,
        after_id=after,
        limit=PAGE_SIZE + 1,
    )
    jobs = found[:PAGE_SIZE]
    next_after = jobs[-1].id if len(found) > PAGE_SIZE else None
    return dashboard.page(
        request,
        visitor,
        "jobs.html",
        status_code=status_code,
        section="jobs",
        jobs=jobs,
        last_runs=dashboard.onbeat.store.execution_last_of_jobs([j.id for j in jobs]),
        status=status.value if status else "",
        statuses=[s.value for s in JobStatus],
        q=text,
        paged=after is not None,
        next_after=next_after,
        tasks=[t.name for t in dashboard.onbeat.list_tasks()],
        form=form or JobForm(),
        describe=describe_schedule,
        next_fire=next_fire,
    )


def job_page(request: Request, form: JobForm | None = None, status_code: int = 200) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.sessions.visitor(request)
    onbeat, tenant = dashboard.onbeat, visitor.caller.tenant
    job = onbeat.get_job(request.path_params["job_id"], tenant=tenant)
    now = onbeat.store.now()
    before = _execution_cursor(onbeat, job, request.query_params.get("before"), tenant)
    found = onbeat.list_executions(job, EXECUTIONS_PAGE + 1, before_id=before, tenant=tenant)
    executions = found[:EXECUTIONS_PAGE]
    return dashboard.page(
        request,
        visitor,
        "job.html",
        status_code=status_code,
        section="jobs",
        job=job,
        describe=describe_schedule,
        fires=upcoming_fires(job, now),
        dst_notes=DST_NOTES,
        executions=executions,
        before=before,
        next_before=executions[-1].id if len(found) > EXECUTIONS_PAGE else None,
        audit=audit_verdict(onbeat, job, tenant, now),
        form=form or JobForm.of_job(job),
    )


def next_fire(job: Job, now: datetime) -> datetime | None:
    """When the job fires next. ``next_fire_at`` is its next fire time not yet handed to the
    delay queue; a cron fire inside the dispatch window comes before it (it is already queued),
    and a paused job fires again only after it is resumed, so from now on."""
    if job.next_fire_at is None or job.status in (JobStatus.CANCELLED, JobStatus.COMPLETED):
        return None
    if job.schedule.kind is not ScheduleKind.CRON:
        return job.next_fire_at
    after_now = job.schedule.next_fire_after(now)
    if job.status is JobStatus.PAUSED or after_now is None:
        return after_now
    return min(job.next_fire_at, after_now)


def upcoming_fires(job: Job, now: datetime) -> list[FireTime]:
    """The job's next fire times, each with its DST flag."""
    first = next_fire(job, now)
    if first is None:
        return []
    if job.schedule.kind is not ScheduleKind.CRON:
        return [FireTime(first)]
    # From just before the first, so that it comes first and carries its flag.
    return job.schedule.fire_times(first - timedelta(microseconds=1), NEXT_FIRES)


@dataclass(frozen=True, slots=True)
class AuditVerdict:
    report: AuditReport | None
    window: timedelta
    problem: str | None = None
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def kept(self) -> bool:
        return self.report is not None and not self.report.missing


def audit_verdict(onbeat: App, job: Job, tenant: str | None, now: datetime) -> AuditVerdict:
    """ "Did every fire time run?" over the last day, or hour (``AUDIT_HOUR``)."""
    window = AUDIT_DAY
    if job.schedule.kind is ScheduleKind.CRON:
        fires = job.schedule.fire_times(now - AUDIT_HOUR, 61)
        if len([f for f in fires if f.at <= now]) > 60:
            window = AUDIT_HOUR
    try:
        report = onbeat.audit(job.id, max(job.created_at, now - window), now, tenant=tenant)
    except ValidationError as exc:  # over audit.MAX_AUDITED_FIRES: a very irregular schedule
        return AuditVerdict(None, window, exc.message)
    return AuditVerdict(report, window, by_status=dict(sorted(report.records.items())))


def describe_schedule(schedule: Schedule) -> str:
    if schedule.kind is ScheduleKind.CRON:
        return f"cron {schedule.expression} ({schedule.timezone})"
    if schedule.kind is ScheduleKind.ONCE:
        assert schedule.at is not None
        return f"once at {schedule.at:%Y-%m-%d %H:%M:%S} UTC"
    return "now"


# --- dead letters -------------------------------------------------------------------------------
def dead_letters_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    visitor = dashboard.sessions.visitor(request)
    after = _id_or_none(request.query_params.get("after"))
    found = dashboard.onbeat.list_dead_letters(
        PAGE_SIZE + 1, tenant=visitor.caller.tenant, after_id=after
    )
    letters = found[:PAGE_SIZE]
    return dashboard.page(
        request,
        visitor,
        "dead_letters.html",
        section="dead-letters",
        letters=letters,
        paged=after is not None,
        next_after=letters[-1].execution_id if len(found) > PAGE_SIZE else None,
    )


# --- the schedule preview and the login form ----------------------------------------------------
def preview_fragment(request: Request) -> Response:
    """The next fire times of the schedule being typed into a form (HTML, for the page script),
    flagged where a DST gap or overlap moves or merges them: ``Schedule.fire_times``, as
    ``/api/v1/schedules/preview`` computes them, behind the session instead of a bearer key."""
    dashboard = dashboard_of(request)
    dashboard.sessions.visitor(request)
    query = request.query_params
    timezone = query.get("timezone", "UTC").strip()[:64] or "UTC"
    fires: list[FireTime] = []
    error = None
    try:
        if query.get("kind") == "cron":
            expression = query.get("expression", "")[:MAX_CRON_LENGTH]
            schedule = Schedule.parse(cron=expression, timezone=timezone)
            fires = schedule.fire_times(dashboard.onbeat.store.now(), PREVIEW_FIRES)
        elif query.get("kind") == "once":
            at = at_in_zone(query.get("at", ""), timezone)
            fires = Schedule.parse(at=at, timezone=timezone).fire_times(_BEGINNING, 1)
    except ValidationError as exc:
        error = exc.message
    return render("_preview.html", fires=fires, error=error, timezone=timezone, dst_notes=DST_NOTES)


def login_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    if not dashboard.onbeat.auth_enabled():
        return RedirectResponse(base_path(request) + "/", status_code=303)
    return login_form(request, dashboard)


def login_form(
    request: Request, dashboard: Dashboard, error: str | None = None, after: str | None = None
) -> Response:
    """The login form (again, with ``error``, after a refused key); ``after``: the page to go
    to once logged in (default: the ``next`` of the query string)."""
    session, fresh = dashboard.sessions.anonymous(request)
    response = render(
        "login.html",
        401 if error else 200,
        base=base_path(request),
        csrf=dashboard.sessions.csrf_token(session),
        next=safe_next(after or request.query_params.get("next")),
        error=error,
    )
    if fresh:
        dashboard.sessions.set_session(response, request, session)
    return response


# --- helpers ------------------------------------------------------------------------------------
def _job_status(value: str | None) -> JobStatus | None:
    try:
        return JobStatus(value) if value else None
    except ValueError:
        return None


def _id_or_none(value: str | None) -> str | None:
    return value if value and _ID.fullmatch(value) else None


def _execution_cursor(onbeat: App, job: Job, value: str | None, tenant: str | None) -> str | None:
    """The execution a page of the job's executions continues after, if it is one of the job's."""
    before = _id_or_none(value)
    if before is None:
        return None
    try:
        execution = onbeat.get_execution(before, tenant=tenant)
    except NotFoundError:
        return None
    return before if execution.job_id == job.id else None
