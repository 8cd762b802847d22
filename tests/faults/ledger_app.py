"""The app the crash and fault tests run: its tasks write a start and an end line per run to a ledger file
(one ``write()`` each, O_APPEND), independent of the store, so lost and duplicate runs can be counted."""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import resource
import signal
import time

from onbeat import App, TaskContext

app = App()


def _lineage(levels: int = 4) -> list[int]:
    """This process and its ancestors: a run in a worker's pool child (forked by the pool's
    forkserver) is the worker's, two levels up."""
    pids = [os.getpid(), os.getppid()]
    while len(pids) < levels and pids[-1] > 1:
        try:
            with open(f"/proc/{pids[-1]}/stat") as stat:
                pids.append(int(stat.read().rsplit(")", 1)[1].split()[1]))
        except OSError:
            break
    return pids


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
            "lineage": _lineage(),
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
    _die(how)


def _die(how: str) -> None:
    if how == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "exit":
        os._exit(137)
    raise SystemExit(3)


def hold_the_gil(seconds: float) -> None:
    """One C call that never lets the GIL go (no bytecode runs inside it), about ``seconds``
    long: what a heavy native extension call does to every other thread of its process."""
    calibration = 10**7
    began = time.perf_counter()
    collections.deque(itertools.repeat(None, calibration), maxlen=0)
    per_item = (time.perf_counter() - began) / calibration
    collections.deque(itertools.repeat(None, int(seconds / per_item)), maxlen=0)


@app.task(name="gil_hog", max_attempts=3, backoff=0.2, backoff_max=1.0, pool="processes")
def gil_hog(ctx: TaskContext, seconds: float) -> None:
    """Holds the GIL for ``seconds``; marked ``pool="processes"`` as docs/executors.md says such
    a task must be, so the worker's heartbeat thread never waits for it."""
    _record("start", ctx)
    hold_the_gil(seconds)
    _record("end", ctx)


@app.task(name="crash_isolated", max_attempts=2, backoff=0.1, backoff_max=0.2, pool="processes")
def crash_isolated(ctx: TaskContext, how: str) -> None:
    """Poison in a child process: it dies (``exit``, ``segfault``) or balloons past an address
    space limit (``balloon``, ``MemoryError``); the worker must only lose that attempt."""
    _record("start", ctx)
    if how == "balloon":
        limit = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, limit[1]))
        try:
            hoard = [bytearray(64 * 1024**2) for _ in range(64)]
            del hoard
        finally:
            resource.setrlimit(resource.RLIMIT_AS, limit)
    _die(how)
