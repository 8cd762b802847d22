"""``onbeat jobs ...`` and ``onbeat preview``: submit, inspect and change jobs over the REST API
(see :mod:`onbeat.cli.remote` for the options, output and exit status every command shares)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from onbeat.cli import OnbeatGroup, main
from onbeat.cli.remote import (
    P,
    R,
    api_client,
    as_json,
    choice,
    job_view,
    json_object,
    listing,
    paged,
    print_json,
    remote,
    schedule_text,
    table,
    ts,
)
from onbeat.client import (
    Client,
    JobInfo,
)
from onbeat.model import JobStatus, MisfirePolicy, OverlapPolicy


def _job_options(creating: bool) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The schedule and policy options of ``jobs add`` and ``jobs edit``."""
    tz_help = "Time zone of --cron." + (" [default: UTC]" if creating else "")
    options = [
        click.option("--params", callback=json_object, help="A JSON object."),
        click.option("--cron", default=None, help="A cron expression: run on this schedule."),
        click.option("--at", default=None, help="ISO-8601 with offset: run once at this time."),
        click.option("--tz", "timezone", default=None, help=tz_help),
        click.option("--max-attempts", type=int, default=None),
        click.option("--timeout", type=float, default=None, help="Seconds per attempt."),
        click.option("--backoff", type=float, default=None, help="Retry backoff base, seconds."),
        click.option("--backoff-max", type=float, default=None, help="Retry backoff cap, seconds."),
        click.option("--overlap", type=choice(OverlapPolicy), default=None),
        click.option("--misfire", type=choice(MisfirePolicy), default=None),
        click.option("--priority", type=int, default=None, help="-100 to 100."),
        click.option("--jitter", type=float, default=None, help="Seconds."),
    ]

    def decorate(command: Callable[P, R]) -> Callable[P, R]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _one_schedule(cron: str | None, at: str | None) -> None:
    if cron is not None and at is not None:
        raise click.UsageError("give --cron or --at, not both")


# --- jobs ---------------------------------------------------------------------------------------
@main.group(cls=OnbeatGroup)
def jobs() -> None:
    """Submit, list, inspect, edit, pause, resume, run and cancel jobs (over the REST API)."""


@jobs.command("add")
@click.argument("task")
@_job_options(creating=True)
@click.option(
    "--idempotency-key", default=None, help="A retry with the same key makes no second job."
)
@remote
def jobs_add(
    task: str,
    params: dict[str, Any] | None,
    cron: str | None,
    at: str | None,
    timezone: str | None,
    idempotency_key: str | None,
    **policies: Any,
) -> None:
    """Submit a job of TASK: --cron to repeat, --at to run once, neither to run now."""
    _one_schedule(cron, at)
    with api_client() as onbeat:
        job = onbeat.create_job(
            task,
            params,
            cron=cron,
            at=at,
            timezone=timezone or "UTC",
            idempotency_key=idempotency_key,
            **policies,
        )
    if as_json():
        print_json(job.raw)
    else:
        click.echo(f"created job {job.id}\n\n{job_view(job)}")


@jobs.command("list")
@click.option("--status", type=choice(JobStatus), default=None)
@click.option("--task", default=None, help="Only jobs of this task.")
@paged
@remote
def jobs_list(
    status: str | None, task: str | None, limit: int, cursor: str | None, every: bool
) -> None:
    """List jobs in creation order."""
    with api_client() as onbeat:
        listing(
            lambda c: onbeat.list_jobs(status=status, task=task, limit=limit, cursor=c),
            cursor,
            every,
            lambda items: table(
                ["ID", "TASK", "STATUS", "SCHEDULE", "NEXT FIRE"],
                (
                    [j.id, j.task, j.status, schedule_text(j.schedule), ts(j.next_fire_at)]
                    for j in items
                ),
            ),
            "jobs",
        )


@jobs.command("show")
@click.argument("job_id", metavar="JOB")
@remote
def jobs_show(job_id: str) -> None:
    """Show a job, its next fire times and its recent executions."""
    with api_client() as onbeat:
        job = onbeat.get_job(job_id)
    if as_json():
        print_json(job.raw)
    else:
        click.echo(job_view(job))


@jobs.command("edit")
@click.argument("job_id", metavar="JOB")
@_job_options(creating=False)
@remote
def jobs_edit(
    job_id: str,
    params: dict[str, Any] | None,
    cron: str | None,
    at: str | None,
    timezone: str | None,
    **policies: Any,
) -> None:
    """Edit a job. A new schedule (--cron, --at, or --tz alone for a cron job) replaces its
    not-yet-started scheduled runs; other changes apply to every run that starts afterwards."""
    _one_schedule(cron, at)
    changes = {name: value for name, value in policies.items() if value is not None}
    if params is None and cron is None and at is None and timezone is None and not changes:
        raise click.UsageError("nothing to change: give at least one option (see --help)")
    with api_client() as onbeat:
        job = onbeat.update_job(
            job_id, params=params, cron=cron, at=at, timezone=timezone, **changes
        )
    if as_json():
        print_json(job.raw)
    else:
        click.echo(f"updated job {job.id}\n\n{job_view(job)}")


def _job_action(name: str, past: str, call: Callable[[Client, str], JobInfo], doc: str) -> None:
    @jobs.command(name, help=doc)
    @click.argument("job_id", metavar="JOB")
    @remote
    def action(job_id: str) -> None:
        with api_client() as onbeat:
            job = call(onbeat, job_id)
        if as_json():
            print_json(job.raw)
        else:
            click.echo(f"{past} job {job.id}: status {job.status}")


_job_action(
    "pause",
    "paused",
    lambda onbeat, job_id: onbeat.pause(job_id),
    "Pause a job: nothing of it runs until it is resumed.",
)
_job_action(
    "resume", "resumed", lambda onbeat, job_id: onbeat.resume(job_id), "Resume a paused job."
)
_job_action(
    "cancel",
    "cancelled",
    lambda onbeat, job_id: onbeat.cancel(job_id),
    "Cancel a job for good: its not-yet-started runs are cancelled; it stays readable.",
)


@jobs.command("run")
@click.argument("job_id", metavar="JOB")
@remote
def jobs_run(job_id: str) -> None:
    """Run a job now (trigger 'manual'), subject to its overlap policy."""
    with api_client() as onbeat:
        execution = onbeat.run_now(job_id)
    if as_json():
        print_json(execution.raw)
    else:
        click.echo(
            f"started execution {execution.id} of job {execution.job_id}: "
            f"status {execution.status}, due {ts(execution.due_at)}"
        )


# --- preview ----------------------------------------------------------------------------------
@main.command()
@click.argument("expression", metavar="EXPR")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="Time zone of EXPR.")
@click.option("--count", type=int, default=10, show_default=True)
@click.option("--after", default=None, help="ISO-8601 with offset; default: now.")
@remote
def preview(expression: str, timezone: str, count: int, after: str | None) -> None:
    """Show the next fire times of a cron EXPR, flagging daylight-saving gaps and overlaps."""
    with api_client() as onbeat:
        result = onbeat.preview(expression, timezone=timezone, after=after, count=count)
    if as_json():
        print_json(result.raw)
        return
    try:
        zone: ZoneInfo | None = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):  # the server accepted it; show UTC only
        zone = None
    headers = ["#", "AT (UTC)", *([f"LOCAL ({timezone})"] if zone else []), "DST"]
    rows = (
        [
            str(n),
            ts(f.at),
            *([f.at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")] if zone else []),
            f.dst or "-",
        ]
        for n, f in enumerate(result.fire_times, 1)
    )
    click.echo(table(headers, rows))
