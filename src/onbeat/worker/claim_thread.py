"""Claims from the delay queue on a thread of its own, so that a task blocking the worker's event
loop cannot hold ids the queue has already handed out.

The queue removes an id as it hands it out. A claim whose answer arrives while a task blocks the
worker's loop would sit unread in a socket for the length of the block: the queue has handed the
id out, the worker has not read it, so the watchdog cannot requeue it and it waits for the
scheduler's sweep (``sweep_overdue``). The fault suite's S2 saw runs start 3.3-3.8 s late so, on
another worker, right after the sweep. On this thread's own loop and connection the answer is
read at once and ``work`` puts the ids in the worker's hand (a set under a lock), where the
watchdog requeues them while the block lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from onbeat.queue.base import DelayQueue

__all__ = ["ClaimThread"]

T = TypeVar("T")

STOP_WAIT = 5.0
"""Longest time ``stop`` waits for a claim under way (a queue that stopped answering): what it
took is then the sweep's to find, as a killed worker's."""


class ClaimThread:
    """A thread running an event loop that owns a queue opened by ``open_queue`` (a second
    connection to the worker's queue: an asyncio client belongs to one loop)."""

    def __init__(self, open_queue: Callable[[], DelayQueue]) -> None:
        self._open_queue = open_queue
        self._queue: DelayQueue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._in_flight: set[Future[Any]] = set()

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="onbeat-claims", daemon=True)
        self._thread.start()

    async def run(self, work: Callable[[DelayQueue], Awaitable[T]]) -> T:
        """``work(queue)`` on the thread's loop. It runs to its end even if the caller is
        cancelled meanwhile (the worker stopping): what it took from the queue reaches the
        worker's hand, and ``stop`` waits for it."""
        assert self._loop is not None, "start() first"
        future = asyncio.run_coroutine_threadsafe(self._with_queue(work), self._loop)
        self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)
        return await asyncio.shield(asyncio.wrap_future(future))

    async def stop(self) -> None:
        """Wait for the work under way (``STOP_WAIT`` at most), close the queue, end the
        thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        if self._in_flight:
            claims = [asyncio.wrap_future(f) for f in list(self._in_flight)]
            await asyncio.wait(claims, timeout=STOP_WAIT)
        if self._queue is not None:
            closing = asyncio.run_coroutine_threadsafe(self._queue.close(), loop)
            with contextlib.suppress(Exception):  # an unreachable queue: nothing left to undo
                await asyncio.wrap_future(closing)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        loop.close()

    async def _with_queue(self, work: Callable[[DelayQueue], Awaitable[T]]) -> T:
        if self._queue is None:  # made on this loop: a client binds to the loop it is made on
            self._queue = self._open_queue()
        return await work(self._queue)
