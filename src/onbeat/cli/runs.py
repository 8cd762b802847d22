"""``onbeat executions ...``, ``onbeat dlq ...`` and ``onbeat audit``: a job's runs, dead letters and
the audit of its fire times, over the REST API (see :mod:`onbeat.cli.remote`)."""

from __future__ import annotations

import click

from onbeat.cli import OnbeatGroup, main
from onbeat.cli.remote import (
    api_client,
    as_json,
    choice,
    execution_view,
    executions_table,
    fields_view,
    listing,
    one_line,
    paged,
    print_json,
    remote,
    table,
    ts,
)
from onbeat.model import ExecutionStatus


@main.group(cls=OnbeatGroup)
def executions() -> None:
    """List and inspect a job's executions (over the REST API)."""


@executions.command("list")
@click.argument("job_id", metavar="JOB")
@click.option("--status", type=choice(ExecutionStatus), default=None)
@click.option("--since", default=None, help="ISO-8601 with offset: only runs fired since then.")
@paged
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
    with api_client() as onbeat:
        listing(
            lambda c: onbeat.list_executions(
                job_id, status=status, since=since, limit=limit, cursor=c
            ),
            cursor,
            every,
            executions_table,
            "executions",
        )


@executions.command("show")
@click.argument("execution_id", metavar="EXECUTION")
@remote
def executions_show(execution_id: str) -> None:
    """Show an execution and each of its attempts."""
    with api_client() as onbeat:
        execution = onbeat.get_execution(execution_id)
    if as_json():
        print_json(execution.raw)
    else:
        click.echo(execution_view(execution))


# --- dead letters -------------------------------------------------------------------------------
@main.group(cls=OnbeatGroup)
def dlq() -> None:
    """List, replay and drop dead letters: runs that exhausted their attempts."""


@dlq.command("list")
@paged
@remote
def dlq_list(limit: int, cursor: str | None, every: bool) -> None:
    """List dead letters."""
    with api_client() as onbeat:
        listing(
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
                        ts(d.created_at),
                        one_line(d.last_error),
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
    with api_client() as onbeat:
        execution = onbeat.replay_dead_letter(dead_letter_id)
    if as_json():
        print_json(execution.raw)
    else:
        click.echo(
            f"replayed dead letter {dead_letter_id}: execution {execution.id} is "
            f"{execution.status}, due {ts(execution.due_at)}"
        )


@dlq.command("drop")
@click.argument("dead_letter_id", metavar="ID")
@remote
def dlq_drop(dead_letter_id: str) -> None:
    """Remove a dead letter; the failed execution stays on record."""
    with api_client() as onbeat:
        onbeat.drop_dead_letter(dead_letter_id)
    if as_json():
        print_json({"id": dead_letter_id, "dropped": True})
    else:
        click.echo(f"dropped dead letter {dead_letter_id}")


@main.command()
@click.argument("job_id", metavar="JOB")
@click.option("--since", default=None, help="ISO-8601 with offset; default: the job's creation.")
@click.option("--until", default=None, help="ISO-8601 with offset; default: now.")
@click.option("--check", is_flag=True, help="Exit with status 1 if any fire time is missing.")
@remote
def audit(job_id: str, since: str | None, until: str | None, check: bool) -> None:
    """Did every run of JOB happen? Reconciles each fire time its schedule produced (edits and
    pauses accounted for) against the execution records, and lists any without one."""
    with api_client() as onbeat:
        result = onbeat.audit(job_id, since=since, until=until)
    if as_json():
        print_json(result.raw)
    else:
        records = " ".join(f"{s}={n}" for s, n in sorted(result.records.items())) or "none"
        missing = ", ".join(ts(m) for m in result.missing) or "none"
        click.echo(
            fields_view(
                [
                    ("job", result.job_id),
                    ("range", f"{ts(result.since)} .. {ts(result.until)}"),
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
