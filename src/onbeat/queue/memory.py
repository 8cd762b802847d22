"""In-process delay queue for the embedded node: one binary heap per priority tier.

Every waiting id has one ``_Entry`` in ``_entries`` (the version map). Each tier's heap is
ordered by (due_at, seq) and never searched: a heap tuple whose ``seq`` no longer matches the
map is stale (its id was claimed, removed or re-enqueued) and is dropped when it reaches the top
(lazy deletion). So enqueue, claim and remove cost O(log n) per id, plus O(tiers) per
``claim_due``/``next_due_at`` call to look at each tier's head; priorities are meant to be a
handful of tiers. Per-tier heaps, rather than one global due-time heap, let a claim pick the
most urgent due item without first sorting every due item: a 100,000-item burst due in the same
second costs each ``claim_due(1000)`` about 1,000 pops, not one long stall.

No method awaits in the middle, so on one event loop each call is atomic: concurrent
``claim_due`` callers can never be handed the same id.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from onbeat.clock import Clock
from onbeat.errors import ValidationError
from onbeat.queue.base import QueueItem, horizon

__all__ = ["MemoryDelayQueue"]

_Key = tuple[datetime, int, str]  # (due_at, seq, execution_id); seq breaks ties FIFO

# Stale heap tuples are tolerated up to this many (or the live count, if larger) before the
# heaps are rebuilt: O(n) at most once per n stale-making operations, so O(1) amortised.
_COMPACT_MIN_STALE = 1024


@dataclass(slots=True)
class _Entry:
    seq: int
    due_at: datetime
    priority: int


class MemoryDelayQueue:
    """A ``DelayQueue`` held in this process; lost on exit, which the store's sweep repairs.

    Among due items: highest priority first, then earliest ``due_at``, then first enqueued.
    Re-enqueueing an id with the same ``due_at`` and priority keeps its place in line; with new
    values, the newest values win and it joins the back of its (priority, due_at) group.
    After ``close()``, ``wait()`` returns at once and mutating calls raise ``RuntimeError``.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._tiers: dict[int, list[_Key]] = {}
        self._tier_order: list[int] = []  # the keys of _tiers, highest priority first, negated
        self._held = 0  # tuples across all tier heaps, live or stale
        self._seq = itertools.count()
        # Replaced on every wake-up, so a waiter only sees arrivals after it started waiting
        # and nobody has to clear() it (clearing races with waiters not yet scheduled).
        self._arrived = asyncio.Event()
        self._closed = False

    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        self._check_open()
        for item in items:  # validate the whole batch first: all or nothing
            if item.due_at.utcoffset() is None:
                raise ValidationError(
                    "due_at", f"{item.execution_id}: needs a timezone-aware datetime"
                )
        fresh: dict[int, list[_Key]] = {}
        for item in items:
            old = self._entries.get(item.execution_id)
            if old is not None and old.due_at == item.due_at and old.priority == item.priority:
                continue  # a pure repeat (e.g. the scheduler's sweep): keep its place
            seq = next(self._seq)  # any older tuple of this id is stale from now on
            self._entries[item.execution_id] = _Entry(seq, item.due_at, item.priority)
            fresh.setdefault(item.priority, []).append((item.due_at, seq, item.execution_id))
        if not fresh:
            return
        for priority, keys in fresh.items():
            heap = self._tier(priority)
            if len(keys) > len(heap):  # a burst: one O(n) heapify beats k pushes
                heap.extend(keys)
                heapq.heapify(heap)
            else:
                for key in keys:
                    heapq.heappush(heap, key)
            self._held += len(keys)
        self._maybe_compact()
        self._wake()

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        self._check_open()
        if limit < 0:
            raise ValidationError("limit", f"must be >= 0, got {limit}")
        until = self._clock.now() + horizon(ahead)  # due: due_at <= until
        claimed: list[str] = []
        emptied: list[int] = []
        for neg_priority in self._tier_order:
            if len(claimed) >= limit:
                break
            heap = self._tiers[-neg_priority]
            while heap and len(claimed) < limit:
                due_at, seq, eid = heap[0]
                if self._is_live(seq, eid):
                    if due_at > until:
                        break
                    del self._entries[eid]
                    claimed.append(eid)
                heapq.heappop(heap)
                self._held -= 1
            if not heap:
                emptied.append(-neg_priority)
        for priority in emptied:
            self._drop_tier(priority)
        return claimed

    async def remove(self, execution_ids: Sequence[str]) -> None:
        self._check_open()
        for eid in execution_ids:
            self._entries.pop(eid, None)  # its heap tuple is now stale
        self._maybe_compact()

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        entries = self._entries
        return [eid for eid in execution_ids if eid not in entries]

    async def next_due_at(self) -> datetime | None:
        return self._earliest_due()

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        early = horizon(ahead)
        if self._closed:
            return
        arrived = self._arrived  # taken before reading state, so no arrival slips between
        delay = timeout
        due = self._earliest_due()
        if due is not None:  # wake when claim_due(ahead=ahead) would first return it
            delay = min(delay, (due - early - self._clock.now()).total_seconds())
        if delay <= 0:
            # Due already (or no time to wait): still yield, so a caller looping on
            # wait()/claim_due() without free capacity cannot starve the event loop.
            await asyncio.sleep(0)
            return
        # clock.sleep, not a loop timer, so a FakeClock drives this in tests. With the
        # SystemClock a wall-clock jump makes us wake early or late; callers re-check anyway.
        sleeper = asyncio.ensure_future(self._clock.sleep(delay))
        waker = asyncio.ensure_future(arrived.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)
        error = None if sleeper.cancelled() else sleeper.exception()
        if error is not None:  # a broken clock must not pass for a timeout
            raise error

    async def size(self) -> int:
        return len(self._entries)

    async def close(self) -> None:
        self._closed = True
        self._wake()

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MemoryDelayQueue is closed")

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = asyncio.Event()

    def _is_live(self, seq: int, eid: str) -> bool:
        entry = self._entries.get(eid)
        return entry is not None and entry.seq == seq

    def _tier(self, priority: int) -> list[_Key]:
        heap = self._tiers.get(priority)
        if heap is None:
            heap = self._tiers[priority] = []
            bisect.insort(self._tier_order, -priority)
        return heap

    def _drop_tier(self, priority: int) -> None:
        del self._tiers[priority]
        del self._tier_order[bisect.bisect_left(self._tier_order, -priority)]

    def _earliest_due(self) -> datetime | None:
        best: datetime | None = None
        for heap in self._tiers.values():
            while heap and not self._is_live(heap[0][1], heap[0][2]):
                heapq.heappop(heap)
                self._held -= 1
            if heap and (best is None or heap[0][0] < best):
                best = heap[0][0]
        return best

    def _maybe_compact(self) -> None:
        """Rebuild the heaps from the map once stale tuples outnumber live ones."""
        live = len(self._entries)
        if self._held - live <= max(_COMPACT_MIN_STALE, live):
            return
        tiers: dict[int, list[_Key]] = {}
        for eid, entry in self._entries.items():
            tiers.setdefault(entry.priority, []).append((entry.due_at, entry.seq, eid))
        for heap in tiers.values():
            heapq.heapify(heap)
        self._tiers = tiers
        self._tier_order = sorted(-priority for priority in tiers)
        self._held = live
