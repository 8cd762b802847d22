"""What the commands that drive a running node over its REST API share (``jobs`` and ``preview``
in ``jobs.py``; ``executions``, ``dlq`` and ``audit`` in ``runs.py``): options, client, errors,
formatting.

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

import click

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


def api_client() -> Client:
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, unless debugging
    meta = click.get_current_context().meta
    return Client(meta.get(_META + "url", DEFAULT_URL), meta.get(_META + "api_key"))


def as_json() -> bool:
    return bool(click.get_current_context().meta.get(_META + "json"))


def print_json(doc: Any) -> None:
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


def ts(value: datetime | None) -> str:
    """An instant in UTC to the second, e.g. ``2026-01-06T08:00:00Z``; ``-`` for none."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_line(text: str | None, width: int = _ERROR_WIDTH) -> str:
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def schedule_text(schedule: ScheduleInfo) -> str:
    if schedule.type is ScheduleKind.CRON:
        return f"cron {schedule.expression} ({schedule.timezone})"
    if schedule.type is ScheduleKind.ONCE:
        return f"once {ts(schedule.at)}"
    return "now"


def fields_view(pairs: Sequence[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in pairs)


def job_view(job: JobInfo) -> str:
    fires = [ts(f.at) + (f" (dst {f.dst})" if f.dst else "") for f in job.next_fire_times]
    policies = (
        f"max_attempts={job.max_attempts} backoff={seconds_text(job.backoff)}.."
        f"{seconds_text(job.backoff_max)} timeout={seconds_text(job.timeout)} overlap={job.overlap} "
        f"misfire={job.misfire} catchup_window={seconds_text(job.catchup_window)} "
        f"priority={job.priority} jitter={seconds_text(job.jitter)}"
    )
    text = fields_view(
        [
            ("id", job.id),
            ("task", job.task),
            ("status", job.status),
            ("schedule", schedule_text(job.schedule)),
            ("params", json.dumps(job.params, ensure_ascii=False)),
            ("policies", policies),
            ("next fires", ", ".join(fires) or "-"),
            ("created", ts(job.created_at)),
            ("updated", ts(job.updated_at)),
        ]
    )
    if isinstance(job, JobDetail):
        text += "\n\nrecent executions (newest first):\n"
        text += executions_table(job.executions) if job.executions else "none"
    return text


def executions_table(executions: Iterable[ExecutionInfo]) -> str:
    return table(
        ["ID", "TRIGGER", "SCHEDULED FOR", "STATUS", "ATTEMPTS", "ERROR / REASON"],
        (
            [
                e.id,
                e.trigger,
                ts(e.scheduled_for),
                e.status,
                str(e.attempt),
                one_line(e.last_error or e.reason),
            ]
            for e in executions
        ),
    )


def execution_view(execution: ExecutionInfo) -> str:
    text = fields_view(
        [
            ("id", execution.id),
            ("job", execution.job_id),
            ("trigger", execution.trigger),
            ("status", execution.status),
            ("scheduled for", ts(execution.scheduled_for)),
            ("due", ts(execution.due_at)),
            ("started", ts(execution.started_at)),
            ("finished", ts(execution.finished_at)),
            ("attempts", str(execution.attempt)),
            ("reason", execution.reason or "-"),
            ("last error", one_line(execution.last_error, 200)),
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
                    ts(a.started_at),
                    ts(a.finished_at),
                    a.outcome,
                    one_line(a.error),
                ]
                for a in execution.attempts
            ),
        )
    return text


def listing(
    fetch: Callable[[str | None], Page[T]],
    cursor: str | None,
    every: bool,
    render: Callable[[list[T]], str],
    noun: str,
) -> None:
    """Print one page (or, with ``every``, all pages from ``cursor`` on) as a table or as JSON;
    for one page, say on stderr how to get the next."""
    pages = list(all_pages(fetch, cursor) if every else [fetch(cursor)])
    items = [item for page in pages for item in page.items]
    next_cursor = pages[-1].next_cursor
    if as_json():
        if every:
            print_json({"items": [i for p in pages for i in p.raw["items"]], "next_cursor": None})
        else:
            print_json(pages[0].raw)
        return
    click.echo(render(items) if items else f"no {noun}")
    if next_cursor is not None:
        click.echo(f"more {noun}: pass --cursor {next_cursor} (or --all)", err=True)


def all_pages(fetch: Callable[[str | None], Page[T]], cursor: str | None) -> Iterator[Page[T]]:
    while True:
        page = fetch(cursor)
        yield page
        if page.next_cursor is None or page.next_cursor == cursor:
            return
        cursor = page.next_cursor


# --- option types -------------------------------------------------------------------------------
def json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        params = json.loads(value, parse_constant=no_constant)
    except ValueError as exc:
        raise click.BadParameter(f"is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise click.BadParameter('must be a JSON object, e.g. \'{"to": "ops@example.com"}\'')
    return params


def no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def choice(values: Iterable[StrEnum]) -> click.Choice[str]:
    return click.Choice([value.value for value in values], case_sensitive=False)


page_options = [
    click.option("--limit", type=int, default=50, show_default=True, help="Items per page."),
    click.option("--cursor", default=None, help="The next_cursor of the previous page."),
    click.option("--all", "every", is_flag=True, help="Follow the cursors: every page."),
]


def paged(command: Callable[P, R]) -> Callable[P, R]:
    for option in reversed(page_options):
        command = option(command)
    return command
