"""Group commit: single writes from many callers at once share one store transaction.

A single job's create costs the store a transaction of four statements, about 0.7-0.9 ms of the
calling process's CPU on PostgreSQL (most of it per round trip); eight jobs in one transaction
cost about 0.15 ms each (``bench/README.md``, "Group commit"). Under load several creates are
always under way at once (the REST API's ``POST /jobs`` from every connection, threads of a
Python program): ``GroupCommit`` lets the first caller write everything waiting, in one call of
``write``, while the others wait for their result, and the oldest of those who arrived
meanwhile writes the next batch. A caller alone writes at once, alone: no wait is added to wait
for company.

What each caller sees is what a call of its own would have given:

- ``write`` is all or none. If a batch of several fails for a reason of the store as a whole
  (``StoreUnavailableError``, ``StoreWriteRefusedError``), every caller gets that error, as each
  would have (and nothing is written twice: a failed commit's outcome is unknown, retrying it
  could store a job twice). Any other error (one item's, such as an idempotency key reused for
  another submission) is found again by writing each item of the batch alone, so only its own
  caller gets it and the others are stored.
- ``write`` keeps the order of its items (the store replays an idempotency key repeated within a
  batch as the job its first use made, as it would across two calls).

A caller on an event loop (``submit_async``: the API's ``POST /jobs``) holds no thread while it
waits: a writer thread of the GroupCommit leads in its place, and each batch's results reach
the loop in one callback. With a thread per request (AnyIO's pool of eight) the API spent
1.2-1.6 ms of CPU a create at 32 connections; now 0.74-0.83 ms (``bench/api.py``, W5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from onbeat.errors import StoreUnavailableError, StoreWriteRefusedError

log = logging.getLogger("onbeat.group_commit")
T = TypeVar("T")
R = TypeVar("R")

WHOLE_STORE_ERRORS = (StoreUnavailableError, StoreWriteRefusedError)
"""A batch failing with one of these fails for every item: no item is written alone again."""


class _Call(Generic[T, R]):
    """One caller's item, and its outcome once written."""

    __slots__ = ("done", "error", "future", "item", "leads", "result", "woken")

    def __init__(self, item: T, future: asyncio.Future[R] | None = None) -> None:
        self.item = item
        self.future = future
        """An async caller's (``submit_async``): it never leads, the writer thread does."""
        self.woken = threading.Event()
        self.done = False
        self.leads = False
        """Set when this caller is to write the next batch."""
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``submit(item)`` returns ``write([item, ...])``'s result for ``item``, sharing the call of
    ``write`` with the items other threads submit at the same time (at most ``most``)."""

    def __init__(self, write: Callable[[Sequence[T]], Sequence[R]], most: int = 64) -> None:
        self._write = write
        self._most = most
        self._lock = threading.Lock()
        self._waiting: deque[_Call[T, R]] = deque()
        self._writing = False
        """A caller is writing a batch; whoever arrives waits to be written or to lead."""
        self._writer: threading.Thread | None = None
        self._writer_leads = threading.Event()
        """Set when the writer thread is to write the next batch (for an async caller)."""

    def submit(self, item: T) -> R:
        call: _Call[T, R] = _Call(item)
        with self._lock:
            self._waiting.append(call)
            call.leads = not self._writing
            self._writing = True
        while not call.done:
            if not call.leads:
                call.woken.wait()
                call.woken.clear()
                continue
            call.leads = False
            self._write_next()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    async def submit_async(self, item: T) -> R:
        """``submit`` for a caller on an event loop, which waits without holding a thread."""
        call: _Call[T, R] = _Call(item, asyncio.get_running_loop().create_future())
        with self._lock:
            self._waiting.append(call)
            if not self._writing:
                self._writing = True
                self._lead_in_writer()
        assert call.future is not None
        return await call.future

    def _lead_in_writer(self) -> None:
        """Hand the next batch to the writer thread (started at its first use); under the lock."""
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_for_async, name="onbeat-group-commit", daemon=True
            )
            self._writer.start()
        self._writer_leads.set()

    def _write_for_async(self) -> None:
        while True:
            self._writer_leads.wait()
            self._writer_leads.clear()
            try:
                self._write_next()
            except BaseException:  # its callers have it; the writer goes on for the others
                log.exception("a group commit failed")

    def _write_next(self) -> None:
        """Write the oldest waiting items (this caller's among them), then hand the lead to
        the oldest caller still waiting, or end the writing."""
        with self._lock:
            batch = [self._waiting.popleft() for _ in range(min(self._most, len(self._waiting)))]
        try:
            self._write_batch(batch)
        finally:
            with self._lock:
                if not self._waiting:
                    self._writing = False
                elif self._waiting[0].future is not None:
                    self._lead_in_writer()
                else:
                    self._waiting[0].leads = True
                    self._waiting[0].woken.set()
            by_loop: dict[asyncio.AbstractEventLoop, list[_Call[T, R]]] = {}
            for call in batch:
                call.done = True
                if call.future is None:
                    call.woken.set()
                else:
                    by_loop.setdefault(call.future.get_loop(), []).append(call)
            for loop, calls in by_loop.items():
                with contextlib.suppress(RuntimeError):  # the loop closed: no one waits
                    loop.call_soon_threadsafe(_answer, calls)

    def _write_batch(self, batch: list[_Call[T, R]]) -> None:
        try:
            results = self._write([call.item for call in batch])
        except WHOLE_STORE_ERRORS as error:
            for call in batch:
                call.error = error
            return
        except Exception as error:
            if len(batch) == 1:
                batch[0].error = error
                return
            for call in batch:  # rolled back: find whose error it is
                try:
                    [call.result] = self._write([call.item])
                except Exception as own:
                    call.error = own
            return
        except BaseException as error:  # KeyboardInterrupt, SystemExit: every caller hears it
            for call in batch:
                call.error = error
            raise
        for call, result in zip(batch, results, strict=True):
            call.result = result


def _answer(calls: list[_Call[T, R]]) -> None:
    """On their loop: each async caller's result or error (unless it stopped waiting)."""
    for call in calls:
        assert call.future is not None
        if call.future.done():  # cancelled: its request went away
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.result)  # type: ignore[arg-type]
