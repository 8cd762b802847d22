"""A process-pool executor: sync tasks run in long-lived child processes, one run at a time each.

A thread cannot be stopped, a process can: when a run times out or its awaiting coroutine is
cancelled (the worker stops, the run was fenced), the process running it is killed with SIGKILL and
replaced, so the task really stops. A task that crashes its process (segfault, ``os._exit``,
``SystemExit``) fails only its own run.

Children come from multiprocessing's ``forkserver``: a clean single-threaded server process forks
them, so they inherit none of the worker's threads, locks or SQLite connection (plain ``fork`` would),
and, with this module preloaded in the server, a new child is ready in milliseconds where ``spawn``
would re-import onbeat each time. The constructor starts nothing: a worker whose tasks run in
processes calls ``warm()`` as it starts, which boots the server and one child in the background (the
boot takes a few hundred ms, seconds on a loaded box, and would otherwise delay the first run); more
children start on demand, and a worker with no such task never boots a server.

Task functions cross by reference (module + qualified name); params, return values and the context's
fields cross pickled. The parent waits for a reply with ``loop.add_reader`` on the pipe, so the event
loop never blocks and no thread is held per busy slot.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import multiprocessing
import os
import pickle
import resource
import select
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from onbeat.clock import Clock
from onbeat.errors import TaskCrashed, TaskTimeout
from onbeat.task import Task, TaskContext

log = logging.getLogger("onbeat.worker.processes")

EXIT_GRACE = 1.0
"""Real seconds a child whose pipe closed gets to finish exiting on its own, so the exit code we
report is its own (SystemExit's code, SIGSEGV) and not our SIGKILL."""
REAP_TIMEOUT = 5.0
"""Real seconds to wait for a SIGKILLed child to be gone (only a process stuck in the kernel takes
longer); then it is reported and left behind rather than holding up the pool."""


class ChildTaskError(Exception):
    """What a task raised in its child process, re-raised in the parent as text.

    The exception object itself is not sent back: exceptions with their own ``__init__`` often
    fail to unpickle, and their class may not be importable in the parent. ``str()`` keeps the
    original type name and message ("ValueError: bad"); ``traceback`` is the child's traceback.
    """

    def __init__(self, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message
        self.traceback = traceback


class ProcessExecutor:
    """Runs tasks in a pool of ``size`` child processes; see the module docstring.

    ``max_memory`` (bytes) caps each child's address space (``RLIMIT_AS``), so a run that balloons
    fails with MemoryError (or dies) instead of taking the machine down. ``nice`` is added to each
    child's niceness, so CPU-bound runs yield to the worker's own loop (heartbeats, claims,
    starts) when they compete. Children are daemonic: a task cannot start processes of its own
    with multiprocessing.
    """

    def __init__(
        self, size: int, clock: Clock, *, max_memory: int | None = None, nice: int = 0
    ) -> None:
        if size < 1:
            raise ValueError("a process pool needs at least one process")
        self.size = size
        self.clock = clock
        self.max_memory = max_memory
        self.nice = nice
        self._mp = multiprocessing.get_context("forkserver")
        # Applies to the (process-wide) server only if it is not running yet.
        self._mp.set_forkserver_preload(["__main__", __name__])
        self._free_slots = asyncio.Semaphore(size)
        """Slots not taken by a run; a slot whose child is being replaced stays taken until then."""
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()
        """Every child started and not yet reaped, busy or idle: what ``close()`` kills."""
        self._lock = threading.Lock()
        """Orders ``close()`` against children being started in a thread, so none escapes it."""
        self._closed = False
        self._background: set[asyncio.Task[None]] = set()

    async def run(
        self, task: Task, ctx: TaskContext, params: dict[str, Any], timeout: float | None
    ) -> Any:
        """The task's return value. Raises TaskTimeout when ``timeout`` (seconds of the clock)
        passed, TaskCrashed when the child died, ChildTaskError for what the task raised."""
        call = _Call(
            *_reference(task),
            execution_id=ctx.execution_id,
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            fencing_token=ctx.fencing_token,
            scheduled_for=ctx.scheduled_for,
            logger_name=ctx.logger.name,
            params=params,
        )
        request = pickle.dumps(call, pickle.HIGHEST_PROTOCOL)
        child = await self._acquire()
        reusable = False
        try:
            reply = await self._exchange(child, request, timeout, task.name)
            reusable = True
        finally:
            if reusable:
                self._idle.append(child)
                self._free_slots.release()
            else:  # timed out, crashed or cancelled: the child may still be running the task
                self._discard(child)
        outcome = pickle.loads(reply)
        if isinstance(outcome, _Raised):
            raise ChildTaskError(outcome.type_name, outcome.message, outcome.traceback)
        return outcome.value

    async def warm(self) -> None:
        """Start one child (and the fork server, the first time) ahead of the first run, holding
        a slot meanwhile so the pool never exceeds ``size``. A failure is only logged: the first
        run then starts its own child, as without the warm-up."""
        await self._free_slots.acquire()
        try:
            if not self._closed and not self._children:
                self._idle.append(await self._spawn())
        except Exception:
            if not self._closed:  # else the pool closed while the child started: nothing wrong
                log.exception("could not start a worker process ahead; the first run tries again")
        finally:
            self._free_slots.release()

    async def close(self) -> None:
        """Kill every child, idle or busy (their runs raise TaskCrashed), and reap them."""
        with self._lock:
            self._closed = True
            children = list(self._children)
        self._idle.clear()
        for child in children:
            child.kill()
        await asyncio.gather(*(self._reaped(child) for child in children))
        if self._background:
            await asyncio.wait(self._background)

    # --- slots ------------------------------------------------------------------------------
    async def _acquire(self) -> _Child:
        """Wait for a free slot (there is no queue beyond the waiters) and return its child."""
        await self._free_slots.acquire()
        try:
            if self._closed:
                raise RuntimeError("the process pool is closed")
            while self._idle:
                child = self._idle.pop()
                if not child.conn.poll():  # an idle child sends nothing: readable means EOF
                    return child
                log.warning("worker process %s died while idle; starting another", child.pid)
                child.kill()
                await self._reaped(child)
            return await self._spawn()
        except BaseException:
            self._free_slots.release()  # also wakes the next waiter, which then sees a closed pool
            raise

    def _discard(self, child: _Child) -> None:
        """Kill ``child``; reap it and start its replacement in the background, and free the slot
        only then, so the pool never holds more than ``size`` processes."""
        child.kill()
        replacement = asyncio.create_task(self._replace(child))
        self._background.add(replacement)
        replacement.add_done_callback(self._background.discard)

    async def _replace(self, dead: _Child) -> None:
        try:
            await self._reaped(dead)
            if not self._closed:
                self._idle.append(await self._spawn())
        except Exception:
            log.exception("could not start a worker process; the next run tries again")
        finally:
            self._free_slots.release()

    # --- children ---------------------------------------------------------------------------
    async def _spawn(self) -> _Child:
        starting = asyncio.get_running_loop().run_in_executor(None, self._start_child)
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._adopt)
            raise

    def _adopt(self, started: asyncio.Future[_Child]) -> None:
        """A child started for a run that was cancelled meanwhile joins the idle ones."""
        if not started.cancelled() and started.exception() is None:
            self._idle.append(started.result())

    def _start_child(self) -> _Child:
        """Start one child. Blocking, so it runs in a thread: ~5 ms, or a few hundred the first
        time, when the fork server itself boots and imports onbeat."""
        parent_end, child_end = self._mp.Pipe()
        process = self._mp.Process(
            target=_child_main,
            args=(child_end, self.max_memory, self.nice),
            name="onbeat-task-process",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()  # the child holds the only other end now: its death reads as EOF
        child = _Child(process, parent_end, process.pid)
        with self._lock:
            if not self._closed:
                self._children.add(child)
                return child
        process.kill()
        process.join(REAP_TIMEOUT)
        parent_end.close()
        raise RuntimeError("the process pool is closed")

    def _reaped(self, child: _Child) -> asyncio.Task[None]:
        """The one task that waits for ``child`` to exit, then releases what it holds. One per
        child: two readers on the same fd would steal each other's wake-up."""
        if child.reaper is None:
            child.reaper = asyncio.create_task(self._reap(child))
        return child.reaper

    async def _reap(self, child: _Child) -> None:
        try:
            async with asyncio.timeout(REAP_TIMEOUT):
                await _readable(child.process.sentinel)
        except TimeoutError:
            log.error("worker process %s did not exit %ss after SIGKILL", child.pid, REAP_TIMEOUT)
            return
        child.process.join()  # returns at once: it has exited
        child.exitcode = child.process.exitcode
        child.process.close()
        child.conn.close()
        self._children.discard(child)

    # --- one run ----------------------------------------------------------------------------
    async def _exchange(
        self, child: _Child, request: bytes, timeout: float | None, task_name: str
    ) -> bytes:
        """Send ``request`` to ``child`` and return its reply, raising TaskTimeout/TaskCrashed."""
        try:
            child.conn.send_bytes(request)
        except OSError:  # died since the idle check
            raise await self._crashed(child) from None
        loop = asyncio.get_running_loop()
        replied: asyncio.Future[None] = loop.create_future()
        fd = child.conn.fileno()
        loop.add_reader(fd, _resolve, replied)
        try:
            if timeout is None:
                await replied
            else:
                timer = asyncio.ensure_future(self.clock.sleep(timeout))
                try:
                    await asyncio.wait([replied, timer], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    timer.cancel()
        finally:
            loop.remove_reader(fd)
        if not replied.done():
            raise TaskTimeout(
                f"task {task_name!r} timed out after {timeout}s; its worker process was killed"
            )
        try:
            # Readable: a whole reply is there or being written right now, or the child is gone.
            return child.conn.recv_bytes()
        except (EOFError, OSError):
            raise await self._crashed(child) from None

    async def _crashed(self, child: _Child) -> TaskCrashed:
        """The error for a run whose child went away, once we know how it ended."""
        await asyncio.wait([self._reaped(child)], timeout=EXIT_GRACE)
        code = child.exitcode
        if self._closed:
            return TaskCrashed("worker process stopped: the process pool was closed")
        if code is None:
            return TaskCrashed("worker process closed its pipe without exiting; it was killed")
        if code < 0:
            return TaskCrashed(f"worker process died: killed by {_signal_name(-code)}")
        return TaskCrashed(f"worker process died: exit code {code}")


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    conn: Connection
    pid: int | None
    reaper: asyncio.Task[None] | None = None
    exitcode: int | None = None
    """Set once reaped: negative for the signal that killed it."""

    def kill(self) -> None:
        if self.exitcode is None:  # once reaped, the process object is closed
            self.process.kill()


@dataclass(frozen=True, slots=True)
class _Call:
    """One run, as sent to a child."""

    module: str
    qualname: str
    execution_id: str
    job_id: str
    attempt: int
    fencing_token: int
    scheduled_for: datetime
    logger_name: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Returned:
    value: Any


@dataclass(frozen=True, slots=True)
class _Raised:
    type_name: str
    message: str
    traceback: str


def _reference(task: Task) -> tuple[str, str]:
    """(module, qualified name) by which a child finds ``task.fn``, if that name leads back to it."""
    module = getattr(task.fn, "__module__", None) or ""
    qualname = getattr(task.fn, "__qualname__", None) or ""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not task.fn:
        raise TypeError(
            f"task {task.name!r} cannot run in a worker process: {module}.{qualname} cannot be "
            "imported by that name (a lambda, a local or decorated-away function); define it at "
            "module level"
        )
    return module, qualname


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _resolve, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# --- in the child ---------------------------------------------------------------------------
def _child_main(conn: Connection, max_memory: int | None, nice: int) -> None:
    """A child's life: run calls one at a time until the pool closes its end of the pipe."""
    # Ctrl-C signals the whole process group; the worker decides what stops, not each child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(conn)
    if max_memory is not None:
        resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))
    if nice:
        os.nice(nice)
    while True:
        try:
            request = conn.recv_bytes()
        except EOFError:
            return
        outcome = _perform(request)
        try:
            reply = pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            reply = pickle.dumps(
                _Raised(
                    type(exc).__name__,
                    f"the return value cannot be sent back from the worker process: {exc}",
                    traceback.format_exc(),
                )
            )
        conn.send_bytes(reply)


def _perform(request: bytes) -> _Returned | _Raised:
    try:
        call: _Call = pickle.loads(request)
        fn: Any = importlib.import_module(call.module)
        for part in call.qualname.split("."):
            fn = getattr(fn, part)
        ctx = TaskContext(
            execution_id=call.execution_id,
            job_id=call.job_id,
            attempt=call.attempt,
            fencing_token=call.fencing_token,
            scheduled_for=call.scheduled_for,
            logger=logging.getLogger(call.logger_name),
        )
        value = fn(ctx, **call.params)
        if inspect.iscoroutine(value):  # an async task sent here runs on a loop of its own
            value = asyncio.run(value)
        return _Returned(value)
    except Exception as exc:
        return _Raised(type(exc).__name__, str(exc), traceback.format_exc())


def _exit_with_parent(conn: Connection) -> None:
    """Exit as soon as the pool's end of the pipe closes, even mid-task, so a worker killed with
    -9 leaves no task running on. A thread watches for the hang-up (a poll for no event but
    POLLHUP): the main thread is busy with the task, and the fork server, our actual parent,
    outlives the worker while any child lives, so a parent-death signal would never come."""

    def watch() -> None:
        hangup = select.poll()
        hangup.register(conn.fileno(), 0)
        hangup.poll()
        os._exit(1)

    threading.Thread(target=watch, name="onbeat-parent-watch", daemon=True).start()
