"""Commands that run a node or manage its store directly: ``up`` and ``keys``."""

from __future__ import annotations

import asyncio
import importlib
import ipaddress
import os
import sys
from typing import Literal

import click

from onbeat.app import App
from onbeat.cli import OnbeatGroup, main
from onbeat.logs import configure_logging


def load_app(spec: str, database_url: str | None) -> App:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the App it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(
            f"{spec!r}: expected MODULE:ATTR, e.g. examples.app:app", param_hint="--app"
        )
    sys.path.insert(0, os.getcwd())
    if database_url:
        os.environ["ONBEAT_DATABASE_URL"] = database_url
    try:
        app = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint="--app") from None
    if not isinstance(app, App):
        raise click.BadParameter(
            f"{spec!r} is a {type(app).__name__}, not an onbeat.App", param_hint="--app"
        )
    if database_url:
        app.settings.database_url = database_url
    return app


@main.command()
@click.option(
    "--app", "app_spec", required=True, envvar="ONBEAT_APP", help="MODULE:ATTR of your App."
)
@click.option("--database-url", default=None, help="Overrides ONBEAT_DATABASE_URL.")
@click.option("--host", default="127.0.0.1", envvar="ONBEAT_HOST", show_default=True)
@click.option("--port", default=8000, type=int, envvar="ONBEAT_PORT", show_default=True)
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve a non-loopback address although no API key exists (anyone reaching it is admin).",
)
@click.option("--no-api", is_flag=True, help="Run scheduler and workers only.")
@click.option(
    "--pool",
    type=click.Choice(["threads", "processes"]),
    default=None,
    help="Where sync tasks run (overrides ONBEAT_POOL; default threads). Hard timeouts and crash "
    "isolation need processes: see docs/executors.md.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default=None,
    help="Overrides `onbeat --log-level`. Logs go to stderr: JSON lines unless it is a terminal.",
)
def up(
    app_spec: str,
    database_url: str | None,
    host: str,
    port: int,
    insecure: bool,
    no_api: bool,
    pool: Literal["threads", "processes"] | None,
    log_level: str | None,
) -> None:
    """Run the embedded node: REST API, scheduler and workers in one process."""
    from onbeat.node import serve

    if log_level is not None:
        configure_logging(log_level)

    app = load_app(app_spec, database_url)
    app.store  # noqa: B018  (opened now: a store that cannot be opened is one line, not a traceback)
    if pool is not None:
        app.settings.pool = pool
    if not no_api and not _is_loopback(host) and not insecure and not app.auth_enabled():
        raise click.UsageError(
            f"refusing to serve {host}: no API key exists, so the API would be open to anyone. "
            "Create one with `onbeat keys create`, bind to 127.0.0.1, or pass --insecure."
        )
    click.echo(f"onbeat up: store {app.settings.database_url}, queue {app.settings.queue_url}")
    asyncio.run(serve(app, None if no_api else (host, port)))


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@main.group(cls=OnbeatGroup)
def keys() -> None:
    """Manage API keys (works on the store directly: run it where the database is reachable)."""


def _store_app(database_url: str | None) -> App:
    return App(database_url) if database_url else App()


_database_option = click.option(
    "--database-url", default=None, envvar="ONBEAT_DATABASE_URL", help="The store to manage."
)


@keys.command("create")
@click.option("--tenant", required=True)
@click.option("--role", type=click.Choice(["admin", "writer", "reader"]), required=True)
@_database_option
def keys_create(tenant: str, role: str, database_url: str | None) -> None:
    """Create a key; the key itself is printed alone on the last line, and never again."""
    api_key, secret = _store_app(database_url).create_api_key(tenant, role)
    click.echo(f"created key {api_key.id} for tenant {tenant!r} with role {role}")
    click.echo(secret)


@keys.command("list")
@_database_option
def keys_list(database_url: str | None) -> None:
    """List keys (ids, tenants, roles; never the keys themselves)."""
    listed = _store_app(database_url).list_api_keys()
    click.echo(f"{'ID':<14}{'TENANT':<24}{'ROLE':<8}{'CREATED':<34}REVOKED")
    for k in listed:
        revoked = k.revoked_at.isoformat() if k.revoked_at else "-"
        click.echo(
            f"{k.id:<14}{k.tenant:<24}{k.role.value:<8}{k.created_at.isoformat():<34}{revoked}"
        )


@keys.command("revoke")
@click.argument("key_id")
@_database_option
def keys_revoke(key_id: str, database_url: str | None) -> None:
    """Revoke a key by id; requests with it are refused from now on."""
    _store_app(database_url).revoke_api_key(key_id)
    click.echo(f"revoked key {key_id}")
