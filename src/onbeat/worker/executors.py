"""Executors: where a task's code runs, and what a timeout can do to it.

The worker picks one per task: ``async def`` tasks run on its event loop (``AsyncExecutor``), sync
tasks in the configured pool: daemon threads (``ThreadExecutor``, the default) or child processes
(``onbeat.worker.processes.ProcessExecutor``, ``--pool processes``). docs/executors.md says what
each guarantees and which to pick.

A ``BaseException`` from task code (``SystemExit``, ``KeyboardInterrupt``...) must fail the run,
never stop the node: where it would escape an asyncio task or a thread, the executor turns it into
``TaskAborted``; where it is raised in the worker's own run task, the worker does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from onbeat.clock import Clock
from onbeat.errors import TaskAborted, TaskTimeout
from onbeat.task import Task, TaskContext

log = logging.getLogger("onbeat.worker")

T = TypeVar("T")

IDLE_THREAD_EXIT = 60.0
"""Seconds an idle task thread waits for work before it exits (the pool shrinks after a burst)."""
_thread_numbers = itertools.count(1)


class Executor(Protocol):
    async def run(
        self, task: Task, ctx: TaskContext, params: dict[str, Any], timeout: float | None
    ) -> Any:
        """The task's return value. Raises TaskTimeout when ``timeout`` passed (the run is stopped
        as far as this executor can), TaskCrashed when the process running it died, or what the
        task raised."""
        ...

    async def close(self) -> None: ...


class AsyncExecutor:
    """``async def`` tasks, on the worker's event loop; a timeout cancels the task's coroutine.

    A task that blocks the loop (``time.sleep``, a CPU loop) blocks every other async task of the
    process until it yields; the worker's heartbeat runs in its own thread, so leases survive it,
    and the watchdog names the run that holds the loop."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def run(
        self, task: Task, ctx: TaskContext, params: dict[str, Any], timeout: float | None
    ) -> Any:
        if timeout is None:
            # In the caller's task: the watchdog sees the run's task name, and the worker's
            # handler catches a BaseException before it reaches the event loop.
            return await task.fn(ctx, **params)
        current = asyncio.current_task()
        child = asyncio.create_task(
            _guarded(task.fn(ctx, **params)), name=current.get_name() if current else None
        )
        timer = asyncio.ensure_future(self._clock.sleep(timeout))
        try:
            done, _ = await asyncio.wait([child, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not child.done():
                child.cancel()
        if child not in done:
            raise TaskTimeout(f"timed out after {timeout}s")
        return child.result()

    async def close(self) -> None:
        return None


async def _guarded(work: Awaitable[T]) -> T:
    """Await task code in a task of its own; a BaseException it raises becomes TaskAborted (an
    asyncio task that raises SystemExit or KeyboardInterrupt stops the event loop). The worker's
    own cancellation of the run passes through."""
    try:
        return await work
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        raise TaskAborted(exc) from exc
    except Exception:
        raise
    except BaseException as exc:
        raise TaskAborted(exc) from exc


@dataclass(eq=False)
class _ThreadRun:
    """One sync run handed to a task thread; ``state`` and ``abandoned`` change under the pool's
    lock. ``done`` and ``started`` are settled on the loop's thread, unless abandoned."""

    fn: Callable[[], Any]
    ctx: TaskContext
    task: str
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    started: asyncio.Future[None] | None
    """For a run with a timeout: set when a thread picks it up (the timeout counts from then)."""
    state: Literal["queued", "running", "finished"] = "queued"
    abandoned: bool = False
    began: float = 0.0

    @property
    def label(self) -> str:
        return f"execution {self.ctx.execution_id} (task {self.task})"

    def post(
        self, future: asyncio.Future[Any], value: Any = None, error: Exception | None = None
    ) -> None:
        """Settle ``future`` on the loop's thread (a no-op once the loop is closed)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, future, value, error)


def _settle(future: asyncio.Future[Any], value: Any, error: Exception | None) -> None:
    if future.done():  # cancelled: the run was abandoned
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class ThreadExecutor:
    """Sync tasks, each in a daemon thread, so process exit never waits for task code.

    Threads are reused and started on demand: a run never waits for a thread, and its timeout
    counts from when its thread starts it. A thread cannot be stopped: when a run times out (or is
    cancelled) its thread is abandoned, and the run fails at once. The abandoned thread runs on
    holding no slot, is logged and counted, and rejoins the pool if the task ever returns. Hard
    timeouts need ``--pool processes``."""

    def __init__(
        self,
        clock: Clock,
        on_abandon: Callable[[], None] | None = None,
        idle_exit: float = IDLE_THREAD_EXIT,
    ) -> None:
        self._clock = clock
        self._on_abandon = on_abandon
        self._idle_exit = idle_exit
        self._runs: queue.SimpleQueue[_ThreadRun | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        """Threads waiting for work that no queued run is promised to."""
        self._closed = False
        self.abandoned_running = 0
        """Abandoned threads still running their task."""

    async def run(
        self, task: Task, ctx: TaskContext, params: dict[str, Any], timeout: float | None
    ) -> Any:
        loop = asyncio.get_running_loop()
        job = _ThreadRun(
            functools.partial(task.fn, ctx, **params),
            ctx,
            task.name,
            loop,
            loop.create_future(),
            None if timeout is None else loop.create_future(),
        )
        self._submit(job)
        try:
            if job.started is None or timeout is None:
                return await job.done
            await job.started
            timer = asyncio.ensure_future(self._clock.sleep(timeout))
            try:
                done, _ = await asyncio.wait([job.done, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            if job.done not in done:
                self._abandon(job, f"passed its {timeout}s timeout")
                raise TaskTimeout(f"timed out after {timeout}s")
            return job.done.result()
        except asyncio.CancelledError:
            self._abandon(job, "was cancelled")
            raise

    async def close(self) -> None:
        """Let idle threads exit; busy (and abandoned) ones are daemons and are not waited for."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._runs.put(None)

    # --- the pool -----------------------------------------------------------------------------
    def _submit(self, job: _ThreadRun) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # promised to one of the waiting threads
                spawn = False
            else:
                spawn = True
        if spawn:
            name = f"onbeat-task-{next(_thread_numbers)}"
            threading.Thread(target=self._work, name=name, daemon=True).start()
        self._runs.put(job)

    def _work(self) -> None:
        me = threading.current_thread()
        idle_name = me.name
        while True:
            try:
                job = self._runs.get(timeout=self._idle_exit)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nobody is promised this thread: shrink
                        self._idle -= 1
                        return
                continue  # a run is on its way to this thread
            if job is None:
                return
            me.name = f"onbeat-run-{job.ctx.execution_id}"
            if not self._execute(job):
                return
            me.name = idle_name

    def _execute(self, job: _ThreadRun) -> bool:
        """Run ``job`` and post its outcome; False if the pool closed meanwhile (the thread
        exits)."""
        with self._lock:
            if job.abandoned:  # cancelled before a thread picked it up
                if self._closed:
                    return False
                self._idle += 1
                return True
            job.state = "running"
        job.began = time.monotonic()
        if job.started is not None:
            job.post(job.started)
        value: Any = None
        error: Exception | None = None
        try:
            value = job.fn()
        except Exception as exc:
            error = exc
        except BaseException as exc:
            error = TaskAborted(exc)
        with self._lock:
            job.state = "finished"
            if job.abandoned:
                self.abandoned_running -= 1
            open_ = not self._closed
            if open_:
                self._idle += 1  # before the outcome is posted: the next run may come at once
        if job.abandoned:
            log.info(
                "%s: abandoned thread returned after %.1fs; it is free again",
                job.label,
                time.monotonic() - job.began,
            )
        else:
            job.post(job.done, value, error)
        return open_

    def _abandon(self, job: _ThreadRun, why: str) -> None:
        """Called on the loop's thread: nobody waits for ``job`` any more."""
        if job.started is not None:
            job.started.cancel()
        job.done.cancel()
        with self._lock:
            if job.state == "finished" or job.abandoned:
                return
            job.abandoned = True
            if job.state == "queued":  # its thread will skip it
                return
            self.abandoned_running += 1
            running = self.abandoned_running
        log.warning(
            "%s %s, but its thread cannot be stopped: abandoned, it runs on without a slot "
            "(%d abandoned threads running; hard timeouts need --pool processes)",
            job.label,
            why,
            running,
        )
        if self._on_abandon is not None:
            self._on_abandon()
