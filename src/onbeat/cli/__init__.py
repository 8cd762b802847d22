"""The ``onbeat`` command: ``fleet`` holds the processes of a fleet (``scheduler``, ``worker``,
``api``) and ``migrate``; ``node`` the embedded node (``up``) and ``keys``, on the store;
``remote`` the commands that drive a running node over its REST API. ``options`` builds the
process commands' flags from ``onbeat.settings.Settings``."""

from __future__ import annotations

import click

from onbeat.errors import OnbeatError
from onbeat.logs import configure_logging


class OnbeatGroup(click.Group):
    """Shows onbeat's errors (bad input, unknown ids) as one line and exit status 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except OnbeatError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=OnbeatGroup)
@click.option("--log-level", default="INFO", envvar="ONBEAT_LOG_LEVEL", show_default=True)
def main(log_level: str) -> None:
    """onbeat: a distributed job scheduler."""
    configure_logging(log_level)


from onbeat.cli import fleet, jobs, node, runs  # noqa: E402,F401  (registers their commands on main)

__all__ = ["OnbeatGroup", "main"]
