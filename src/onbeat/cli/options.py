"""The flags of the process commands, built from ``onbeat.settings.Settings``: each setting whose
``flag_on`` names a command is a ``--flag`` of it, with the setting's description as its help.
A flag left out is None here, so the environment (or the code) decides; see ``docs/settings.md``.

Errors are one line (``Error: ...``): a bad flag value (exit status 2) and a setting pydantic
refuses, whether it came from a flag or from an ``ONBEAT_*`` variable (exit status 1).
"""

from __future__ import annotations

import importlib
import os
import sys
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click
import pydantic

from onbeat.app import App
from onbeat.logs import configure_logging
from onbeat.settings import Settings, env_name, flag_commands

F = TypeVar("F", bound=Callable[..., Any])


class OneLineUsageError(click.ClickException):
    """A usage error shown as its one line, without the usage text."""

    exit_code = 2


class SettingsCommand(click.Command):
    """A command whose usage errors (bad flag values, unknown flags) are one line."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise OneLineUsageError(exc.format_message()) from None


def setting_options(command: str) -> Callable[[F], F]:
    """Add to ``command`` a flag for every setting it takes (in the settings' order)."""

    def decorate(f: F) -> F:
        for name in reversed(list(Settings.model_fields)):
            if command in flag_commands(name):
                f = _option(name)(f)
        return f

    return decorate


def _option(name: str) -> Callable[[F], F]:
    field = Settings.model_fields[name]
    dashed = name.replace("_", "-")
    default = field.default
    shown = ("true" if default else "false") if isinstance(default, bool) else default
    default_text = "" if default is None else f"; default: {shown}"
    help_text = f"{field.description} [env: {env_name(name)}{default_text}]"
    if field.annotation is bool:
        decls = [f"--{dashed}/--no-{dashed}"] if default else [f"--{dashed}"]
        return click.option(*decls, name, default=None, is_flag=True, help=help_text)
    return click.option(
        f"--{dashed}", name, type=_click_type(field.annotation), default=None, help=help_text
    )


def _click_type(annotation: Any) -> click.ParamType[Any]:
    if typing.get_origin(annotation) is Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)], case_sensitive=False)
    types: dict[Any, click.ParamType[Any]] = {int: click.INT, float: click.FLOAT}
    return types.get(annotation, click.STRING)


def given(flags: dict[str, Any]) -> dict[str, Any]:
    """The settings given as flags (those left out are None)."""
    return {k: v for k, v in flags.items() if k in Settings.model_fields and v is not None}


def settings_from(flags: dict[str, Any]) -> Settings:
    """Settings from ``flags``, the environment and the defaults; one-line error if invalid."""
    overrides = given(flags)
    try:
        return Settings(**overrides)
    except pydantic.ValidationError as exc:
        raise click.ClickException(settings_error(exc, overrides)) from None


def settings_error(exc: pydantic.ValidationError, flags: dict[str, Any]) -> str:
    """What is wrong with each refused setting, in one line, naming the flag or the variable
    it came from."""
    problems = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "settings"
        if name in flags:
            source = f"--{name.replace('_', '-')} {flags[name]!r}"
        elif name in Settings.model_fields:
            source = f"{env_name(name)}={os.environ.get(env_name(name), '')!r}"
        else:
            source = name
        problems.append(f"{source}: {error['msg']}")
    return "invalid setting: " + "; ".join(problems)


def load_app(flags: dict[str, Any]) -> App:
    """Import the App that the ``app`` setting (``--app`` or ``ONBEAT_APP``) names,
    ``MODULE:ATTR``, from the current directory too, and apply the flags to its settings (they
    win over the App's own arguments and the environment)."""
    overrides = given(flags)
    spec = overrides.get("app") or settings_from(flags).app
    if not spec:
        raise click.ClickException(
            "no app: pass --app MODULE:ATTR (or set ONBEAT_APP), the onbeat.App with your tasks"
        )
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.ClickException(f"--app {spec!r}: expected MODULE:ATTR, e.g. examples.app:app")
    sys.path.insert(0, os.getcwd())
    for name, value in overrides.items():  # seen by an App built when its module is imported
        os.environ[env_name(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        app = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise click.ClickException(f"--app {spec!r}: cannot load it: {exc}") from None
    except pydantic.ValidationError as exc:  # its App() read a bad ONBEAT_* variable
        raise click.ClickException(settings_error(exc, overrides)) from None
    if not isinstance(app, App):
        raise click.ClickException(f"--app {spec!r} is a {type(app).__name__}, not an onbeat.App")
    try:
        app.settings = app.settings.with_overrides(overrides)
    except pydantic.ValidationError as exc:
        raise click.ClickException(settings_error(exc, overrides)) from None
    return app


def apply_log_level(flags: dict[str, Any]) -> None:
    """The command's ``--log-level`` wins over ``onbeat --log-level`` (and ``ONBEAT_LOG_LEVEL``),
    which configured logging before the command ran."""
    if flags.get("log_level") is not None:
        configure_logging(flags["log_level"])
