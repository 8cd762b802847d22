"""The app ``bench/fleet.py`` and ``bench/inflight.py`` run in their workers: a no-op task that
appends one line per run, ``execution_id scheduled_for start`` (epoch seconds), to a file of its
process's own with a single ``write()`` (O_APPEND), so lost and duplicated runs are counted
independently of the store; and a task that does the same, then sleeps (runs held in flight)."""

from __future__ import annotations

import asyncio
import os
import time

from onbeat import App, TaskContext

app = App()
_fd: int | None = None


def _starts_fd() -> int:
    global _fd
    if _fd is None:
        directory = os.environ["ONBEAT_BENCH_STARTS_DIR"]
        path = os.path.join(directory, f"starts-{os.getpid()}.txt")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def _record_start(ctx: TaskContext) -> None:
    started = time.time()
    line = f"{ctx.execution_id} {ctx.scheduled_for.timestamp():.6f} {started:.6f}\n"
    os.write(_starts_fd(), line.encode())


@app.task(name="bench.noop", max_attempts=1)
async def noop(ctx: TaskContext, n: int = 0) -> None:
    """``n``: the parameter bench/api.py's jobs carry (it is ignored)."""
    _record_start(ctx)


@app.task(name="bench.sleep", max_attempts=1)
async def sleep(ctx: TaskContext, *, seconds: float) -> None:
    """W4: one run in flight for ``seconds``, costing the worker only its coroutine."""
    _record_start(ctx)
    await asyncio.sleep(seconds)
