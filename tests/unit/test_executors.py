"""The executors on their own: timeouts on the injected clock, what reaches the worker when task
code raises, and the thread pool's reuse, abandonment and shrinking."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from onbeat import TaskContext
from onbeat.errors import TaskAborted, TaskTimeout
from onbeat.task import Task, TaskFunction, TaskRegistry
from onbeat.testing import FakeClock
from onbeat.worker.executors import AsyncExecutor, ThreadExecutor


def _task(fn: TaskFunction) -> Task:
    return TaskRegistry().register(fn, name="t")


def _ctx(execution_id: str = "e1") -> TaskContext:
    return TaskContext(
        execution_id, "j1", 1, 1, datetime(2026, 1, 5, tzinfo=UTC), logging.getLogger("t")
    )


async def test_async_executor__timeout_on_the_clock_cancels_the_coroutine(
    clock: FakeClock,
) -> None:
    cancelled = asyncio.Event()

    async def forever(ctx: TaskContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = asyncio.create_task(AsyncExecutor(clock).run(_task(forever), _ctx(), {}, 2.0))
    await asyncio.wait_for(clock.until_sleeping(), 5)
    clock.advance(1.9)
    await asyncio.sleep(0)
    assert not running.done()
    clock.advance(0.1)
    with pytest.raises(TaskTimeout):
        await asyncio.wait_for(running, 5)
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_async_executor__task_code_cancelled_error_is_aborted_not_a_stop(
    clock: FakeClock,
) -> None:
    """With a timeout the task runs in a child task: what it raises must not stop the loop."""

    async def raises(ctx: TaskContext) -> None:
        raise asyncio.CancelledError

    with pytest.raises(TaskAborted, match="CancelledError"):
        await AsyncExecutor(clock).run(_task(raises), _ctx(), {}, 5.0)


async def test_async_executor__the_callers_cancellation_passes_through(clock: FakeClock) -> None:
    started = asyncio.Event()

    async def waits(ctx: TaskContext) -> None:
        started.set()
        await asyncio.Event().wait()

    for timeout in (None, 5.0):
        started.clear()
        running = asyncio.create_task(AsyncExecutor(clock).run(_task(waits), _ctx(), {}, timeout))
        await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running


async def test_thread_executor__reuses_an_idle_thread(clock: FakeClock) -> None:
    threads: list[int] = []

    def where(ctx: TaskContext) -> int:
        threads.append(threading.get_ident())
        return len(threads)

    executor = ThreadExecutor(clock)
    assert await executor.run(_task(where), _ctx(), {}, None) == 1
    assert await executor.run(_task(where), _ctx(), {}, 1.0) == 2
    assert threads[0] == threads[1]
    await executor.close()


async def test_thread_executor__timed_out_thread_is_abandoned_and_blocks_nobody(
    clock: FakeClock,
) -> None:
    release = threading.Event()
    slow_thread: list[threading.Thread] = []
    abandoned: list[None] = []

    def slow(ctx: TaskContext) -> str:
        slow_thread.append(threading.current_thread())
        release.wait(5)
        return "late"

    def fast(ctx: TaskContext) -> threading.Thread:
        return threading.current_thread()

    executor = ThreadExecutor(clock, on_abandon=lambda: abandoned.append(None), idle_exit=0.01)
    running = asyncio.create_task(executor.run(_task(slow), _ctx(), {}, 1.0))
    await asyncio.wait_for(clock.until_sleeping(), 5)
    clock.advance(1)
    with pytest.raises(TaskTimeout):
        await running
    assert (abandoned, executor.abandoned_running) == ([None], 1)
    assert await executor.run(_task(fast), _ctx("e2"), {}, None) is not slow_thread[0]
    release.set()  # the abandoned task returns; its late result goes nowhere
    await asyncio.to_thread(slow_thread[0].join, 5)  # then it idles, and exits
    assert executor.abandoned_running == 0
    await executor.close()


async def test_thread_executor__cancelled_run_abandons_its_thread(clock: FakeClock) -> None:
    release = threading.Event()
    started = threading.Event()

    def hangs(ctx: TaskContext) -> None:
        started.set()
        release.wait(5)

    executor = ThreadExecutor(clock)
    running = asyncio.create_task(executor.run(_task(hangs), _ctx(), {}, None))
    await asyncio.to_thread(started.wait, 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert executor.abandoned_running == 1
    release.set()
    await executor.close()


async def test_thread_executor__idle_threads_exit(clock: FakeClock) -> None:
    def thread(ctx: TaskContext) -> tuple[threading.Thread, str]:
        return threading.current_thread(), threading.current_thread().name

    executor = ThreadExecutor(clock, idle_exit=0.01)
    ran_in, name = await executor.run(_task(thread), _ctx("e9"), {}, None)
    assert name == "onbeat-run-e9"  # named after its run while it runs it
    await asyncio.to_thread(ran_in.join, 5)
    assert not ran_in.is_alive()
    assert (await executor.run(_task(thread), _ctx("e10"), {}, None))[0] is not ran_in


@pytest.mark.parametrize("is_async", [True, False])
async def test_executors__base_exception_from_task_code_becomes_task_aborted(
    clock: FakeClock, is_async: bool
) -> None:
    def sync_exit(ctx: TaskContext) -> Any:
        raise SystemExit(2)

    async def async_exit(ctx: TaskContext) -> Any:
        raise SystemExit(2)

    executor = AsyncExecutor(clock) if is_async else ThreadExecutor(clock)
    task = _task(async_exit if is_async else sync_exit)
    with pytest.raises(TaskAborted, match=r"^SystemExit: 2 \(raised by the task"):
        await executor.run(task, _ctx(), {}, 5.0)
    await executor.close()
