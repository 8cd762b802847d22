"""Commands that drive a running node over its REST API: ``jobs``, ``executions``, ``dlq``,
``preview`` and ``audit``.

Every command takes ``--url`` (or ``ONBEAT_URL``, default http://127.0.0.1:8000), ``--api-key``
(or ``ONBEAT_API_KEY``) and ``--json``. Without ``--json`` the output is for people: aligned
tables with full ids and UTC timestamps. With ``--json`` it is the API's JSON document, as
received (``dlq drop``, which gets no body, prints ``{"id": ..., "dropped": true}``).

Exit status: 0 on success; 1 when the API refuses the request (its problem's title, detail and
field errors go to stderr) or cannot be reached; 2 for a usage error caught before any request
(unknown option, ``--params`` that is not a JSON object...). ``audit --check`` also exits 1 when a
fire time has no execution record.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ParamSpec, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from onbeat.cli import OnbeatGroup, main
from onbeat.client import (
    ApiConnectionError,
    ApiError,
    AuthenticationError,
    Client,
    ExecutionInfo,
    JobDetail,
    JobInfo,
    Page,
    ScheduleInfo,
)
from onbeat.model import ExecutionStatus, JobStatus, MisfirePolicy, OverlapPolicy
from onbeat.schedule import ScheduleKind

DEFAULT_URL = "http://127.0.0.1:8000"
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
_META = "onbeat.remote."
_ERROR_WIDTH = 60


# --- connection options, client, errors ---------------------------------------------------------
def _remember(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[_META + name] = value
        return value

    return store


def _check_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not an http(s) URL, e.g. {DEFAULT_URL}")
    ctx.meta[_META + "url"] = value
    return value


def remote(command: Callable[P, R]) -> Callable[P, R]:
    """Give ``command`` the connection options (``--url``, ``--api-key``, ``--json``) and turn
    API errors into a message on stderr and exit status 1. Apply it below ``@click.command``."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except ApiError as exc:
            raise click.ClickException(describe_api_error(exc)) from None
        except ApiConnectionError as exc:
            raise click.ClickException(
                f"{exc}\nIs the node running (`onbeat up`)? Point at it with --url or ONBEAT_URL."
            ) from None
        except ValueError as exc:  # refused by the client before sending (empty id, NaN...)
            raise click.UsageError(str(exc)) from None

    options = [
        click.option(
            "--url",
            envvar="ONBEAT_URL",
            default=DEFAULT_URL,
            show_default=True,
            expose_value=False,
            callback=_check_url,
            help="The onbeat server (also ONBEAT_URL).",
        ),
        click.option(
            "--api-key",
            envvar="ONBEAT_API_KEY",
            default=None,
            expose_value=False,
            callback=_remember("api_key"),
            help="Sent as 'Authorization: Bearer KEY' (also ONBEAT_API_KEY).",
        ),
        click.option(
            "--json",
            "as_json",
            is_flag=True,
            expose_value=False,
            callback=_remember("json"),
            help="Print the API's JSON instead of a table.",
        ),
    ]
    for option in reversed(options):  # so --help lists them in this order
        run = option(run)
    return run


def describe_api_error(exc: ApiError) -> str:
    """The problem document on one line (title, status, detail), plus one indented line per
    field error that the detail does not already say."""
    problem = exc.problem
    text = f"{problem.title} (HTTP {exc.status})"
    if problem.detail:
        text += f": {problem.detail}"
    errors = problem.errors
    if len(errors) > 1 or (errors and errors[0].message not in problem.detail):
        text += "".join(f"\n  {e.field}: {e.message}" for e in errors)
    if isinstance(exc, AuthenticationError):
        text += "\nPass an API key with --api-key or ONBEAT_API_KEY."
    return text


def _client() -> Client:
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, unless debugging
    meta = click.get_current_context().meta
    return Client(meta.get(_META + "url", DEFAULT_URL), meta.get(_META + "api_key"))


def _as_json() -> bool:
    return bool(click.get_current_context().meta.get(_META + "json"))


def _print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


# --- formatting ---------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, a header line first."""
    lines = [list(headers), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _ts(value: datetime | None) -> str:
    """An instant in UTC to the second, e.g. ``2026-01-06T08:00:00Z``; ``-`` for none."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_line(text: str | None, width: int = _ERROR_WIDTH) -> str:
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def _schedule(schedule: ScheduleInfo) -> str:
    if schedule.type is ScheduleKind.CRON:
        return f"cron {schedule.expression} ({schedule.timezone})"
    if schedule.type is ScheduleKind.ONCE:
        return f"once {_ts(schedule.at)}"
    return "now"


def _fields(pairs: Sequence[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in pairs)


def _job_view(job: JobInfo) -> str:
    fires = [_ts(f.at) + (f" (dst {f.dst})" if f.dst else "") for f in job.next_fire_times]
    policies = (
        f"max_attempts={job.max_attempts} backoff={_seconds(job.backoff)}.."
        f"{_seconds(job.backoff_max)} timeout={_seconds(job.timeout)} overlap={job.overlap} "
        f"misfire={job.misfire} catchup_window={_seconds(job.catchup_window)} "
        f"priority={job.priority} jitter={_seconds(job.jitter)}"
    )
    text = _fields(
        [
            ("id", job.id),
            ("task", job.task),
            ("status", job.status),
            ("schedule", _schedule(job.schedule)),
            ("params", json.dumps(job.params, ensure_ascii=False)),
            ("policies", policies),
            ("next fires", ", ".join(fires) or "-"),
            ("created", _ts(job.created_at)),
            ("updated", _ts(job.updated_at)),
        ]
    )
    if isinstance(job, JobDetail):
        text += "\n\nrecent executions (newest first):\n"
        text += _executions_table(job.executions) if job.executions else "none"
    return text


def _executions_table(executions: Iterable[ExecutionInfo]) -> str:
    return table(
        ["ID", "TRIGGER", "SCHEDULED FOR", "STATUS", "ATTEMPTS", "ERROR / REASON"],
        (
            [
                e.id,
                e.trigger,
                _ts(e.scheduled_for),
                e.status,
                str(e.attempt),
                _one_line(e.last_error or e.reason),
            ]
            for e in executions
        ),
    )


def _execution_view(execution: ExecutionInfo) -> str:
    text = _fields(
        [
            ("id", execution.id),
            ("job", execution.job_id),
            ("trigger", execution.trigger),
            ("status", execution.status),
            ("scheduled for", _ts(execution.scheduled_for)),
            ("due", _ts(execution.due_at)),
            ("started", _ts(execution.started_at)),
            ("finished", _ts(execution.finished_at)),
            ("attempts", str(execution.attempt)),
            ("reason", execution.reason or "-"),
            ("last error", _one_line(execution.last_error, 200)),
            ("result", json.dumps(execution.result, ensure_ascii=False)),
        ]
    )
    if execution.attempts:
        text += "\n\nattempts:\n" + table(
            ["#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"],
            (
                [
                    str(a.attempt),
                    a.worker,
                    _ts(a.started_at),
                    _ts(a.finished_at),
                    a.outcome,
                    _one_line(a.error),
                ]
                for a in execution.attempts
            ),
        )
    return text


def _listing(
    fetch: Callable[[str | None], Page[T]],
    cursor: str | None,
    every: bool,
    render: Callable[[list[T]], str],
    noun: str,
) -> None:
    """Print one page (or, with ``every``, all pages from ``cursor`` on) as a table or as JSON;
    for one page, say on stderr how to get the next."""
    pages = list(_pages(fetch, cursor) if every else [fetch(cursor)])
    items = [item for page in pages for item in page.items]
    next_cursor = pages[-1].next_cursor
    if _as_json():
        if every:
            _print_json({"items": [i for p in pages for i in p.raw["items"]], "next_cursor": None})
        else:
            _print_json(pages[0].raw)
        return
    click.echo(render(items) if items else f"no {noun}")
    if next_cursor is not None:
        click.echo(f"more {noun}: pass --cursor {next_cursor} (or --all)", err=True)


def _pages(fetch: Callable[[str | None], Page[T]], cursor: str | None) -> Iterator[Page[T]]:
    while True:
        page = fetch(cursor)
        yield page
        if page.next_cursor is None or page.next_cursor == cursor:
            return
        cursor = page.next_cursor


# --- option types -------------------------------------------------------------------------------
def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        params = json.loads(value, parse_constant=_no_constant)
    except ValueError as exc:
        raise click.BadParameter(f"is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise click.BadParameter('must be a JSON object, e.g. \'{"to": "ops@example.com"}\'')
    return params


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _choice(values: Iterable[StrEnum]) -> click.Choice[str]:
    return click.Choice([value.value for value in values], case_sensitive=False)


_page_options = [
    click.option("--limit", type=int, default=50, show_default=True, help="Items per page."),
    click.option("--cursor", default=None, help="The next_cursor of the previous page."),
    click.option("--all", "every", is_flag=True, help="Follow the cursors: every page."),
]


def _paged(command: Callable[P, R]) -> Callable[P, R]:
    for option in reversed(_page_options):
        command = option(command)
    return command


def _job_options(creating: bool) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The schedule and policy options of ``jobs add`` and ``jobs edit``."""
    tz_help = "Time zone of --cron." + (" [default: UTC]" if creating else "")
    options = [
        click.option("--params", callback=_json_object, help="A JSON object."),
        click.option("--cron", default=None, help="A cron expression: run on this schedule."),
        click.option("--at", default=None, help="ISO-8601 with offset: run once at this time."),
        click.option("--tz", "timezone", default=None, help=tz_help),
        click.option("--max-attempts", type=int, default=None),
        click.option("--timeout", type=float, default=None, help="Seconds per attempt."),
        click.option("--backoff", type=float, default=None, help="Retry backoff base, seconds."),
        click.option("--backoff-max", type=float, default=None, help="Retry backoff cap, seconds."),
        click.option("--overlap", type=_choice(OverlapPolicy), default=None),
        click.option("--misfire", type=_choice(MisfirePolicy), default=None),
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
    with _client() as onbeat:
        job = onbeat.create_job(
            task,
            params,
            cron=cron,
            at=at,
            timezone=timezone or "UTC",
            idempotency_key=idempotency_key,
            **policies,
        )
    if _as_json():
        _print_json(job.raw)
    else:
        click.echo(f"created job {job.id}\n\n{_job_view(job)}")


@jobs.command("list")
@click.option("--status", type=_choice(JobStatus), default=None)
@click.option("--task", default=None, help="Only jobs of this task.")
@_paged
@remote
def jobs_list(
    status: str | None, task: str | None, limit: int, cursor: str | None, every: bool
) -> None:
    """List jobs in creation order."""
    with _client() as onbeat:
        _listing(
            lambda c: onbeat.list_jobs(status=status, task=task, limit=limit, cursor=c),
            cursor,
            every,
            lambda items: table(
                ["ID", "TASK", "STATUS", "SCHEDULE", "NEXT FIRE"],
                (
                    [j.id, j.task, j.status, _schedule(j.schedule), _ts(j.next_fire_at)]
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
    with _client() as onbeat:
        job = onbeat.get_job(job_id)
    if _as_json():
        _print_json(job.raw)
    else:
        click.echo(_job_view(job))


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
    with _client() as onbeat:
        job = onbeat.update_job(
            job_id, params=params, cron=cron, at=at, timezone=timezone, **changes
        )
    if _as_json():
        _print_json(job.raw)
    else:
        click.echo(f"updated job {job.id}\n\n{_job_view(job)}")


def _job_action(name: str, past: str, call: Callable[[Client, str], JobInfo], doc: str) -> None:
    @jobs.command(name, help=doc)
    @click.argument("job_id", metavar="JOB")
    @remote
    def action(job_id: str) -> None:
        with _client() as onbeat:
            job = call(onbeat, job_id)
        if _as_json():
            _print_json(job.raw)
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
    with _client() as onbeat:
        execution = onbeat.run_now(job_id)
    if _as_json():
        _print_json(execution.raw)
    else:
        click.echo(
            f"started execution {execution.id} of job {execution.job_id}: "
            f"status {execution.status}, due {_ts(execution.due_at)}"
        )


# --- executions ---------------------------------------------------------------------------------
@main.group(cls=OnbeatGroup)
def executions() -> None:
    """List and inspect a job's executions (over the REST API)."""


@executions.command("list")
@click.argument("job_id", metavar="JOB")
@click.option("--status", type=_choice(ExecutionStatus), default=None)
@click.option("--since", default=None, help="ISO-8601 with offset: only runs fired since then.")
@_paged
@remote
def executions_list(
    job_id: str,
    status: str | None,
    since: str | None,
    limit: int,
    cursor: str | None,
    every: bool,
) -> None:
    """List a job's executions, newest fire time first."""
    with _client() as onbeat:
        _listing(
            lambda c: onbeat.list_executions(
                job_id, status=status, since=since, limit=limit, cursor=c
            ),
            cursor,
            every,
            _executions_table,
            "executions",
        )


@executions.command("show")
@click.argument("execution_id", metavar="EXECUTION")
@remote
def executions_show(execution_id: str) -> None:
    """Show an execution and each of its attempts."""
    with _client() as onbeat:
        execution = onbeat.get_execution(execution_id)
    if _as_json():
        _print_json(execution.raw)
    else:
        click.echo(_execution_view(execution))


# --- dead letters -------------------------------------------------------------------------------
@main.group(cls=OnbeatGroup)
def dlq() -> None:
    """List, replay and drop dead letters: runs that exhausted their attempts."""


@dlq.command("list")
@_paged
@remote
def dlq_list(limit: int, cursor: str | None, every: bool) -> None:
    """List dead letters."""
    with _client() as onbeat:
        _listing(
            lambda c: onbeat.list_dead_letters(limit=limit, cursor=c),
            cursor,
            every,
            lambda items: table(
                ["ID", "JOB", "TASK", "ATTEMPTS", "CREATED", "LAST ERROR"],
                (
                    [
                        d.id,
                        d.job_id,
                        d.task,
                        str(d.attempts),
                        _ts(d.created_at),
                        _one_line(d.last_error),
                    ]
                    for d in items
                ),
            ),
            "dead letters",
        )


@dlq.command("replay")
@click.argument("dead_letter_id", metavar="ID")
@remote
def dlq_replay(dead_letter_id: str) -> None:
    """Run a dead letter's execution again, with a fresh set of attempts."""
    with _client() as onbeat:
        execution = onbeat.replay_dead_letter(dead_letter_id)
    if _as_json():
        _print_json(execution.raw)
    else:
        click.echo(
            f"replayed dead letter {dead_letter_id}: execution {execution.id} is "
            f"{execution.status}, due {_ts(execution.due_at)}"
        )


@dlq.command("drop")
@click.argument("dead_letter_id", metavar="ID")
@remote
def dlq_drop(dead_letter_id: str) -> None:
    """Remove a dead letter; the failed execution stays on record."""
    with _client() as onbeat:
        onbeat.drop_dead_letter(dead_letter_id)
    if _as_json():
        _print_json({"id": dead_letter_id, "dropped": True})
    else:
        click.echo(f"dropped dead letter {dead_letter_id}")


# --- preview and audit --------------------------------------------------------------------------
@main.command()
@click.argument("expression", metavar="EXPR")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="Time zone of EXPR.")
@click.option("--count", type=int, default=10, show_default=True)
@click.option("--after", default=None, help="ISO-8601 with offset; default: now.")
@remote
def preview(expression: str, timezone: str, count: int, after: str | None) -> None:
    """Show the next fire times of a cron EXPR, flagging daylight-saving gaps and overlaps."""
    with _client() as onbeat:
        result = onbeat.preview(expression, timezone=timezone, after=after, count=count)
    if _as_json():
        _print_json(result.raw)
        return
    try:
        zone: ZoneInfo | None = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):  # the server accepted it; show UTC only
        zone = None
    headers = ["#", "AT (UTC)", *([f"LOCAL ({timezone})"] if zone else []), "DST"]
    rows = (
        [
            str(n),
            _ts(f.at),
            *([f.at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")] if zone else []),
            f.dst or "-",
        ]
        for n, f in enumerate(result.fire_times, 1)
    )
    click.echo(table(headers, rows))


@main.command()
@click.argument("job_id", metavar="JOB")
@click.option("--since", default=None, help="ISO-8601 with offset; default: the job's creation.")
@click.option("--until", default=None, help="ISO-8601 with offset; default: now.")
@click.option("--check", is_flag=True, help="Exit with status 1 if any fire time is missing.")
@remote
def audit(job_id: str, since: str | None, until: str | None, check: bool) -> None:
    """Did every run of JOB happen? Reconciles each fire time its schedule produced (edits and
    pauses accounted for) against the execution records, and lists any without one."""
    with _client() as onbeat:
        result = onbeat.audit(job_id, since=since, until=until)
    if _as_json():
        _print_json(result.raw)
    else:
        records = " ".join(f"{s}={n}" for s, n in sorted(result.records.items())) or "none"
        missing = ", ".join(_ts(m) for m in result.missing) or "none"
        click.echo(
            _fields(
                [
                    ("job", result.job_id),
                    ("range", f"{_ts(result.since)} .. {_ts(result.until)}"),
                    ("expected", f"{result.expected} fire times"),
                    ("records", records),
                    ("missing", missing),
                ]
            )
        )
    if check and result.missing:
        raise click.ClickException(
            f"{len(result.missing)} of {result.expected} fire times have no execution record"
        )
