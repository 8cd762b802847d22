"""Group commit: single writes from many threads at once share one store transaction.

A single job's create costs the store a transaction of four statements, about 0.7-0.9 ms of the
calling process's CPU on PostgreSQL (most of it per round trip); eight jobs in one transaction
cost about 0.15 ms each (``bench/README.md``, "Group commit"). The REST API serves ``POST /jobs``
on eight threads, so under load several creates are always under way at once: ``GroupCommit``
lets the first caller write everything waiting, in one call of ``write``, while the others
wait for their result, and the oldest of those who arrived meanwhile writes the next batch.
A caller alone writes at once, alone: no wait is added to wait for company.

What each caller sees is what a call of its own would have given:

- ``write`` is all or none. If a batch of several fails for a reason of the store as a whole
  (``StoreUnavailableError``, ``StoreWriteRefusedError``), every caller gets that error, as each
  would have (and nothing is written twice: a failed commit's outcome is unknown, retrying it
  could store a job twice). Any other error (one item's, such as an idempotency key reused for
  another submission) is found again by writing each item of the batch alone, so only its own
  caller gets it and the others are stored.
- ``write`` keeps the order of its items (the store replays an idempotency key repeated within a
  batch as the job its first use made, as it would across two calls).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from onbeat.errors import StoreUnavailableError, StoreWriteRefusedError

T = TypeVar("T")
R = TypeVar("R")

WHOLE_STORE_ERRORS = (StoreUnavailableError, StoreWriteRefusedError)
"""A batch failing with one of these fails for every item: no item is written alone again."""


class _Call(Generic[T, R]):
    """One caller's item, and its outcome once written."""

    __slots__ = ("done", "error", "item", "leads", "result", "woken")

    def __init__(self, item: T) -> None:
        self.item = item
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

    def _write_next(self) -> None:
        """Write the oldest waiting items (this caller's among them), then hand the lead to
        the oldest caller still waiting, or end the writing."""
        with self._lock:
            batch = [self._waiting.popleft() for _ in range(min(self._most, len(self._waiting)))]
        try:
            self._write_batch(batch)
        finally:
            with self._lock:
                if self._waiting:
                    self._waiting[0].leads = True
                    self._waiting[0].woken.set()
                else:
                    self._writing = False
            for call in batch:
                call.done = True
                call.woken.set()

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
