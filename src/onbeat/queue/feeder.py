"""QueueFeeder: hands the runs a submission created ``queued`` to the delay queue, from the
synchronous code that submits (``App``'s methods) to the event loop the queue lives on.

A one-shot job due now (or within the dispatch window) needs no decision from a scheduler: it is
on time and no fire time follows it. So the store creates its run ``queued``
(``Store.job_create_many(queue_within=...)``) and the submitter enqueues it here, after the
commit: no scheduler reads it, writes it again or enqueues it, and it is in the queue the moment
its submission returns (docs/architecture.md, "Runs due at submission").

The feeder never fails a submission, which has committed by then: a run it could not hand over
(the queue down or slow, the process killed in between) is found ``queued`` and missing from the
queue by a scheduler's sweep (``sweep_overdue``), as a run the queue lost is.

It runs on a loop that runs anyway (``on_loop``: a node's, whose queue it shares), or on a
daemon thread with a loop and a queue of its own (``on_own_thread``: a script's or ``onbeat
api``'s App, which makes it at its first submission).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError

from onbeat.queue.base import DelayQueue, QueueItem

log = logging.getLogger("onbeat.queue")

ENQUEUE_TIMEOUT = 5.0
"""Seconds a submitter waits for the queue to take its runs; past that they are the sweep's."""


class QueueFeeder:
    def __init__(
        self,
        queue: DelayQueue,
        loop: asyncio.AbstractEventLoop,
        *,
        owned: threading.Thread | None = None,
    ) -> None:
        self._queue = queue
        self._loop = loop
        self._owned = owned
        """The thread running ``loop``, if this feeder started it (it then closes the queue)."""
        self._loop_thread = owned.ident if owned is not None else threading.get_ident()
        self._detached: set[asyncio.Task[None]] = set()
        self._closed = False
        self.fed = 0
        """Runs handed to the queue."""

    @classmethod
    def on_loop(cls, queue: DelayQueue) -> QueueFeeder:
        """Feed ``queue`` on the running loop (call from it): a node's queue."""
        return cls(queue, asyncio.get_running_loop())

    @classmethod
    def on_own_thread(cls, open_queue: Callable[[], DelayQueue]) -> QueueFeeder:
        """Feed a queue of its own, opened now by ``open_queue``, on a daemon thread's loop."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="onbeat-queue-feeder", daemon=True)
        thread.start()
        return cls(open_queue(), loop, owned=thread)

    def enqueue(self, items: Sequence[QueueItem]) -> None:
        """Hand ``items`` to the queue; returns once it has them, or has failed or timed out
        (logged: the sweep has them then). Called from the loop's own thread, it cannot wait
        for the loop: the enqueue then runs as soon as the caller yields."""
        if not items or self._closed:
            return
        coroutine = self._enqueue(list(items))
        if threading.get_ident() == self._loop_thread:
            task = self._loop.create_task(coroutine)
            self._detached.add(task)
            task.add_done_callback(self._detached.discard)
            return
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the loop is closed: the node stopped under our feet
            coroutine.close()
            return
        try:
            future.result(ENQUEUE_TIMEOUT)
        except FutureTimeoutError:
            future.cancel()
            log.warning(
                "the delay queue took over %.0fs to take %d runs due now; the scheduler's "
                "sweep enqueues them",
                ENQUEUE_TIMEOUT,
                len(items),
            )

    async def _enqueue(self, items: list[QueueItem]) -> None:
        try:
            await self._queue.enqueue(items)
        except Exception as exc:
            log.warning(
                "could not hand %d runs due now to the delay queue (%s); the scheduler's sweep "
                "enqueues them",
                len(items),
                exc,
            )
        else:
            self.fed += len(items)

    async def drain(self) -> None:
        """Wait for the enqueues begun from the loop's own thread (before its queue closes)."""
        self._closed = True
        await asyncio.gather(*self._detached, return_exceptions=True)

    def close(self) -> None:
        """Stop feeding: a feeder of its own drains, closes its queue and stops its thread."""
        if self._owned is None or self._closed:
            self._closed = True
            return
        self._closed = True
        future = asyncio.run_coroutine_threadsafe(self._close_own(), self._loop)
        try:
            future.result(ENQUEUE_TIMEOUT)
        except Exception:
            future.cancel()
            log.warning("the delay queue of this process's submissions did not close cleanly")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._owned.join(ENQUEUE_TIMEOUT)
            if not self._owned.is_alive():
                self._loop.close()

    async def _close_own(self) -> None:
        await asyncio.gather(*self._detached, return_exceptions=True)
        await self._queue.close()
