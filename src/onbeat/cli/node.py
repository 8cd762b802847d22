"""Commands that run the embedded node or manage its store directly: ``up`` and ``keys``."""

from __future__ import annotations

from typing import Any

import click

from onbeat.app import App
from onbeat.cli import OnbeatGroup, main
from onbeat.cli.fleet import start
from onbeat.cli.options import SettingsCommand, apply_log_level, load_app, setting_options


@main.command(cls=SettingsCommand)
@setting_options("up")
@click.option("--no-api", is_flag=True, help="Run scheduler and workers only.")
def up(no_api: bool, **flags: Any) -> None:
    """Run the embedded node: REST API, scheduler and workers in one process."""
    apply_log_level(flags)
    app = load_app(flags)
    start(app, "up", scheduler=True, worker=True, api=not no_api)


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
