"""Task functions for the process-pool tests. They run in child processes, which import them by
module and qualified name, so they live at module level here."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from onbeat.task import TaskContext


def pid(ctx: TaskContext) -> int:
    return os.getpid()


def niceness(ctx: TaskContext) -> int:
    return os.nice(0)


def noop(ctx: TaskContext) -> None:
    return None


def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
    """The params and the context's fields, as the child saw them."""
    return {
        "params": params,
        "execution_id": ctx.execution_id,
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "fencing_token": ctx.fencing_token,
        "scheduled_for": ctx.scheduled_for,
        "logger": ctx.logger.name,
    }


async def async_double(ctx: TaskContext, n: int) -> int:
    return 2 * n


def fail(ctx: TaskContext, message: str) -> None:
    raise ValueError(message)


def hang(ctx: TaskContext) -> None:
    time.sleep(60)


def announce_then_hang(ctx: TaskContext) -> None:
    """Writes this process's pid on stdout (a line), then hangs: for a test that kills the parent."""
    sys.stdout.write(f"{os.getpid()}\n")
    sys.stdout.flush()
    time.sleep(60)


def nap_then_pid(ctx: TaskContext, seconds: float) -> tuple[int, float, float]:
    """(pid, start, end) on the system-wide monotonic clock, which children share with the test."""
    start = time.monotonic()
    time.sleep(seconds)
    return os.getpid(), start, time.monotonic()


def exit_hard(ctx: TaskContext) -> None:
    os._exit(137)


def segfault(ctx: TaskContext) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def system_exit(ctx: TaskContext) -> None:
    raise SystemExit(3)


def unpicklable_result(ctx: TaskContext) -> Any:
    return lambda: None


def balloon(ctx: TaskContext, size: int) -> int:
    return len(bytearray(size))
