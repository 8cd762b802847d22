"""The fleet's processes, one part of onbeat each, sharing one store and one delay queue:
``onbeat scheduler``, ``onbeat worker``, ``onbeat api``; and ``onbeat migrate``, which applies the
schema and exits. (``onbeat up``, all parts in one process, is in ``cli/node.py``.)

Their flags come from ``onbeat.settings.Settings`` (``cli/options.py``); everything else is an
``ONBEAT_*`` variable. Each fails fast, in one line, if its store or queue cannot be reached when
it starts, and rides out later outages (see docs/settings.md).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

import click

from onbeat.app import App
from onbeat.auth import is_loopback
from onbeat.cli import main
from onbeat.cli.options import (
    OneLineUsageError,
    SettingsCommand,
    apply_log_level,
    load_app,
    setting_options,
    settings_from,
)
from onbeat.settings import Settings, redact_url
from onbeat.store import open_store, pending_migrations


def start(app: App, what: str, *, scheduler: bool, worker: bool, api: bool) -> None:
    """Run ``what`` until SIGINT/SIGTERM: the store is opened (and migrated unless
    ``--no-migrate``) before anything else, so a store that cannot be opened is one line."""
    from onbeat.node import serve

    settings = app.settings
    app.store  # noqa: B018  (opened now: a store that cannot be opened is one line, not a traceback)
    if api:
        refuse_open_api(app)
    queue = f", queue {redact_url(settings.queue_url)}" if scheduler or worker or api else ""
    banner = f"onbeat {what}: store {redact_url(settings.database_url)}{queue}"
    listen = (settings.host, settings.port) if api else None
    tune_gc(settings)
    with asyncio.Runner(loop_factory=event_loop_factory(settings)) as runner:
        runner.run(serve(app, listen, scheduler=scheduler, worker=worker, banner=banner))


def tune_gc(settings: Settings) -> None:
    """Collect less often than Python's default: every run, request and claim allocates
    objects that die young (no cycle), and a pass every 700 of them cost a busy worker 4-7 %
    of its CPU and the API's bulk create 15-25 % of its rate. What start-up made (modules,
    the app, the store) lives as long as the process, so it is frozen out of every pass."""
    gc.freeze()
    if settings.gc_threshold:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(settings.gc_threshold, older, oldest)


def event_loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop unless ``event_loop`` says otherwise or it is not installed; None: the
    standard library's."""
    if settings.event_loop != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def refuse_open_api(app: App) -> None:
    """An API on a non-loopback address while no API key exists would let anyone in as admin:
    refuse, unless ``--insecure``."""
    host = app.settings.host
    if not is_loopback(host) and not app.settings.insecure and not app.api_keys_exist():
        raise OneLineUsageError(
            f"refusing to serve {host}: no API key exists, so the API would be open to anyone. "
            "Create one with `onbeat keys create`, bind to 127.0.0.1, or pass --insecure."
        )


@main.command(cls=SettingsCommand)
@setting_options("scheduler")
def scheduler(**flags: Any) -> None:
    """Run a scheduler: it leases a fair share of the shards and, in them, hands due runs to the
    delay queue and plans each cron job's next run; in every shard it re-queues the runs of dead
    workers and those the queue lost. Run several: a dead one's shards are taken over."""
    apply_log_level(flags)
    app = App(**settings_from(flags).model_dump())
    start(app, "scheduler", scheduler=True, worker=False, api=False)


@main.command(cls=SettingsCommand)
@setting_options("worker")
def worker(**flags: Any) -> None:
    """Run a worker for the tasks of --app: it claims due runs from the delay queue and runs up
    to --concurrency at once, and publishes its tasks (with their defaults) to the store, so
    `onbeat api` accepts jobs for them."""
    apply_log_level(flags)
    app = load_app(flags)
    start(app, "worker", scheduler=False, worker=True, api=False)


@main.command(cls=SettingsCommand)
@setting_options("api")
def api(**flags: Any) -> None:
    """Serve the REST API and dashboard, without your code: a job's task must have been
    published by a worker (see docs/settings.md). Run several behind a load balancer."""
    apply_log_level(flags)
    app = App(**settings_from(flags).model_dump())
    start(app, "api", scheduler=False, worker=False, api=True)


@main.command(cls=SettingsCommand)
@setting_options("migrate")
def migrate(**flags: Any) -> None:
    """Apply the store's pending schema migrations and create the history's day partitions
    ahead, then exit. Safe to run again (it then applies nothing) and while other processes use
    the store."""
    apply_log_level(flags)
    settings = settings_from(flags)
    url = settings.database_url
    pending = pending_migrations(url)
    store = open_store(url, None, settings.shards)
    try:  # the history's day partitions ahead too (retention is the schedulers' job)
        store.history_maintain(0, settings.partitions_ahead_days)
    finally:
        store.close()
    if pending:
        applied = ", ".join(map(str, pending))
        click.echo(f"onbeat migrate: applied migration(s) {applied} to {redact_url(url)}")
    else:
        click.echo(f"onbeat migrate: {redact_url(url)} is up to date")
