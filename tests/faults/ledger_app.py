"""The app the crash and fault tests run: its tasks write a start and an end line per run to a ledger file
(one ``write()`` each, O_APPEND), independent of the store, so lost and duplicate runs can be counted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

from onbeat import App, TaskContext

app = App()


def _record(event: str, ctx: TaskContext) -> None:
    line = json.dumps(
        {
            "event": event,
            "execution_id": ctx.execution_id,
            "job_id": ctx.job_id,
            "attempt": ctx.attempt,
            "fencing_token": ctx.fencing_token,
            "scheduled_for": ctx.scheduled_for.isoformat(),
            "pid": os.getpid(),
            "wall": time.time(),
            "wall_ns": time.time_ns(),
            "mono_ns": time.monotonic_ns(),
        }
    )
    # The fault suite gives each worker process a ledger file of its own; older tests share one.
    directory = os.environ.get("ONBEAT_TEST_LEDGER_DIR")
    path = (
        f"{directory}/ledger-{os.getpid()}.jsonl" if directory else os.environ["ONBEAT_TEST_LEDGER"]
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(name="work", max_attempts=5, backoff=0.2, backoff_max=1.0)
async def work(ctx: TaskContext, duration: float = 0.3) -> None:
    _record("start", ctx)
    await asyncio.sleep(duration)
    _record("end", ctx)


@app.task(name="work_sync", max_attempts=5, backoff=0.2, backoff_max=1.0)
def work_sync(ctx: TaskContext) -> None:
    _record("start", ctx)
    _record("end", ctx)


@app.task(name="block_loop", max_attempts=3, backoff=0.2, backoff_max=1.0)
async def block_loop(ctx: TaskContext, seconds: float) -> None:
    """The mistake it stands for: a blocking call in an ``async def`` task holds the event loop."""
    _record("start", ctx)
    time.sleep(seconds)  # noqa: ASYNC251  (on purpose)
    _record("end", ctx)


@app.task(name="hang", max_attempts=1)
def hang(ctx: TaskContext) -> None:
    """A sync task that never returns."""
    _record("start", ctx)
    while True:
        time.sleep(3600)


@app.task(name="crash", max_attempts=2, backoff=0.1, backoff_max=0.2)
def crash(ctx: TaskContext, how: str) -> None:
    """Task code that kills the process running it."""
    _record("start", ctx)
    if how == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "exit":
        os._exit(137)
    raise SystemExit(3)
