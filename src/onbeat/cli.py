"""The ``onbeat`` command."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys

import click

from onbeat.app import App


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


@click.group()
@click.option("--log-level", default="INFO", envvar="ONBEAT_LOG_LEVEL", show_default=True)
def main(log_level: str) -> None:
    """onbeat: a distributed job scheduler."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@main.command()
@click.option(
    "--app", "app_spec", required=True, envvar="ONBEAT_APP", help="MODULE:ATTR of your App."
)
@click.option("--database-url", default=None, help="Overrides ONBEAT_DATABASE_URL.")
def up(app_spec: str, database_url: str | None) -> None:
    """Run the embedded node: scheduler and workers in one process."""
    from onbeat.node import serve

    app = load_app(app_spec, database_url)
    click.echo(f"onbeat up: store {app.settings.database_url}, queue {app.settings.queue_url}")
    asyncio.run(serve(app))
