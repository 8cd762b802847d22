"""Everything that is not a job, an execution or a dead letter: tasks, schedule previews, health."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query

from onbeat.api.deps import OnbeatApp, parse_instant
from onbeat.api.problems import (
    RETRY_AFTER_SECONDS,
    ProblemError,
    fields_renamed,
    problem_responses,
)
from onbeat.api.schemas import (
    MAX_TEXT,
    FireTimeOut,
    Health,
    Preview,
    Readiness,
    TaskPage,
    task_out,
)
from onbeat.schedule import MAX_CRON_LENGTH, Schedule

router = APIRouter(tags=["meta"])
log = logging.getLogger("onbeat.api")
MAX_PREVIEW_COUNT = 100


@router.get(
    "/tasks", response_model=TaskPage, responses=problem_responses(400, 413), summary="List tasks"
)
def list_tasks(onbeat: OnbeatApp) -> TaskPage:
    """The tasks jobs may name, by name, with their default policies: those registered in this
    process and those a worker published within ``task_ttl`` (see docs/settings.md). One page."""
    return TaskPage(items=[task_out(t) for t in onbeat.list_tasks()], next_cursor=None)


@router.get(
    "/schedules/preview",
    response_model=Preview,
    responses=problem_responses(400, 413, 422),
    summary="Preview a cron expression",
)
def preview_schedule(
    onbeat: OnbeatApp,
    expression: Annotated[str, Query(min_length=1, max_length=MAX_CRON_LENGTH)],
    timezone: Annotated[str, Query(min_length=1, max_length=MAX_TEXT)] = "UTC",
    after: Annotated[
        str | None,
        Query(
            max_length=MAX_TEXT,
            description="ISO-8601 with a UTC offset (send '+' as %2B); default: now.",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    count: Annotated[int, Query(ge=1, le=MAX_PREVIEW_COUNT)] = 10,
) -> Preview:
    """The next ``count`` fire times after ``after``, each flagged where a daylight-saving gap or
    overlap moved or merged it, so a user sees what an expression does before saving it."""
    with fields_renamed({"cron": "expression"}):
        schedule = Schedule.parse(cron=expression, timezone=timezone)
    start = onbeat.clock.now() if after is None else parse_instant("after", after)
    return Preview(fire_times=[FireTimeOut.of(f) for f in schedule.fire_times(start, count)])


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    """The process is up and serving."""
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=problem_responses(503),
    summary="Readiness",
)
def readyz(onbeat: OnbeatApp) -> Readiness:
    """The store answers a query and accepts writes. (The embedded node's delay queue is
    in-process, so it is reachable whenever this answers.) After a write was refused (disk full,
    read-only), each call probes with a small write and reports ready again once one succeeds."""
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    try:
        onbeat.list_jobs(limit=1)
        refusal = onbeat.store.write_refusal()
    except Exception as exc:
        log.warning("readiness check failed: store unreachable", exc_info=exc)
        raise ProblemError(
            503, "not-ready", f"the store is unreachable ({type(exc).__name__})", headers=retry
        ) from None
    if refusal is not None:
        raise ProblemError(503, "not-ready", f"the store refuses writes ({refusal})", headers=retry)
    return Readiness(checks={"store": "ok", "store_writes": "ok"})
