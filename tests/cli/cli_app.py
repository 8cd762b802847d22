"""The app the CLI tests serve with ``onbeat up --app tests.cli.cli_app:app``."""

from __future__ import annotations

from typing import Any

from onbeat import App, TaskContext

app = App()


@app.task(name="echo", max_attempts=3, timeout=30)
def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
    return params


@app.task(name="fail", max_attempts=1)
def fail(ctx: TaskContext) -> None:
    raise RuntimeError(f"boom on attempt {ctx.attempt}")
