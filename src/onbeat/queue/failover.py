"""A delay queue that keeps runs starting while its primary (Redis) is down.

``FailoverDelayQueue`` pairs a primary queue (``RedisDelayQueue``) with a fallback
``TableDelayQueue`` in the store's PostgreSQL database. The fleet uses it when ``queue_url`` is
``redis://`` and ``database_url`` is ``postgresql://`` (``queue_failover``, on by default).

- **Enqueue** goes to the primary; if the primary fails or takes longer than
  ``PRIMARY_TIMEOUT``, the batch goes to the fallback instead. After a failure the primary is
  skipped for ``PRIMARY_RETRY`` seconds, so a dead Redis costs one failed call per second per
  process, not one per batch, and each of those retries waits at most ``RETRY_TIMEOUT``.
- **Claim** takes from the fallback whenever it may hold a due item, then from the primary. The
  fallback is not read on every claim: its LISTEN connection reports every batch any process
  enqueues (``TableDelayQueue.observe``), so this object knows the fallback's earliest due time
  and an idle fleet sends PostgreSQL no polling queries (one look every ``FALLBACK_RECHECK``).
- **missing** is "held by neither", so the sweep re-enqueues only what both lack; **remove**
  removes from both. A run may end up in both (enqueued to the fallback while Redis was down,
  then again to a Redis that kept its data): the second copy a worker claims is a stale copy,
  which the store's conditional claim drops (it is no longer ``queued``).
- **Primary lost or back**: listeners registered with ``on_primary_change`` are called on every
  change. The scheduler registers one that checks every queued run of its shards against the
  queue at once: while Redis is down that moves the runs Redis held into the fallback (they
  start on time instead of after ``sweep_overdue``); once it is back, it refills an empty Redis.
  With listeners, the queue also probes the primary every ``PROBE_INTERVAL``, so a scheduler
  with nothing to dispatch still notices.
- **Primary lost its data while up** (``FLUSHALL``, or a restart too quick for any call to fail):
  the probe asks a primary that can tell (``lost_data()``, as ``RedisDelayQueue`` does) and, if
  it did, calls the listeners with ``up=True`` as after an outage: the scheduler refills it
  within ``PROBE_INTERVAL`` + one check of its queued runs, not after ``sweep_overdue``.

Order across the two queues is approximate: each keeps its own priority order, and fallback
items (older, from an outage) are handed out first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from onbeat.clock import Clock
from onbeat.errors import QueueUnavailableError, ValidationError
from onbeat.queue.base import DelayQueue, QueueItem, horizon
from onbeat.queue.table import TableDelayQueue

__all__ = ["FailoverDelayQueue"]

log = logging.getLogger("onbeat.queue")

PRIMARY_TIMEOUT = 1.0
"""Seconds (real time) a primary call may take before the fallback is used instead, plus
``PER_ITEM_TIMEOUT`` per id the call carries (a big batch is slow, not a failure)."""
PER_ITEM_TIMEOUT = 50e-6
"""Seconds per id added to ``PRIMARY_TIMEOUT``: 5,000 ids (the dispatch batch) get 1.25 s."""
PRIMARY_RETRY = 1.0
"""Seconds (clock) between attempts on a primary that failed."""
RETRY_TIMEOUT = 0.25
"""Seconds (real time) an attempt on a primary that failed may take, plus ``PER_ITEM_TIMEOUT``
per id: a primary that is back answers in milliseconds. With ``PRIMARY_TIMEOUT`` each retry of
a frozen Redis (``kill -STOP``) held the claim or the enqueue that made it for a second, every
``PRIMARY_RETRY``: a run enqueued while the scheduler's retry waited, then claimed while a
worker's did, started 2 s late (the fault suite's S5, ``redis_down_start_delay_p99``)."""
PROBE_INTERVAL = 0.5
"""Seconds (clock) between a watched queue's probes of its primary: an idle primary is pinged,
one that can tell is asked whether it lost its data (a pipeline of three cheap commands). Half a
second keeps a flushed Redis refilled within the sweep interval + 1 s (issue 8) on a busy box."""
UNHEARD_POLL = 0.5
"""Seconds (clock) between looks at the fallback while its enqueues cannot be followed."""
FALLBACK_RECHECK = 30.0
"""Seconds (clock) after which the fallback's earliest due time is read again without news."""

T = TypeVar("T")


@runtime_checkable
class ForgetfulQueue(Protocol):
    """A primary that can tell whether it lost items since it was last asked."""

    async def lost_data(self) -> bool: ...


class FailoverDelayQueue:
    """A ``DelayQueue`` over a primary and a fallback queue; see the module docstring."""

    def __init__(
        self,
        primary: DelayQueue,
        fallback: TableDelayQueue,
        clock: Clock,
        *,
        primary_url: str,
        log_changes: bool = True,
    ) -> None:
        """``log_changes``: log each move to the fallback and back (False for a process's second
        connection, whose moves its first one logs: a worker's claim thread)."""
        self._primary = primary
        self._log_changes = log_changes
        self._fallback = fallback
        self._clock = clock
        self._primary_url = primary_url
        self._primary_up = True
        self._primary_retry_at = -math.inf
        self._primary_last_ok = -math.inf
        self._listeners: list[Callable[[bool], None]] = []
        self._probe: asyncio.Task[None] | None = None
        # What this object knows about the fallback's content:
        self._fallback_known = False
        """True while ``_fallback_due`` is the fallback's earliest due time."""
        self._fallback_due: datetime | None = None
        self._fallback_read_at = -math.inf
        self._fallback_retry_at = -math.inf
        """While the fallback fails: when to try it again (monotonic)."""
        self._news = 0
        """Notifications heard; a read during which this changed is not trusted."""
        self._observing = False
        self._observe_lock = asyncio.Lock()
        self._wakers: dict[asyncio.Event, datetime] = {}
        self._closed = False

    @property
    def primary_up(self) -> bool:
        """False from a failed primary call until one succeeds again."""
        return self._primary_up

    def on_primary_change(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(up)`` each time the primary is found down or back up, or (``up``
        True) to have lost its data. Also makes the queue probe the primary every
        ``PROBE_INTERVAL`` (from its next call on)."""
        self._listeners.append(listener)

    # -- DelayQueue ------------------------------------------------------------------------

    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        await self._start()
        if self._primary_usable():
            done, _ = await self._on_primary(lambda: self._primary.enqueue(items), len(items))
            if done:
                if items:
                    self._wake_waiters(min(item.due_at for item in items))
                return
        await self._fallback.enqueue(items)  # its notification wakes the waiters (_heard)

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        if limit < 0:
            raise ValidationError("limit", f"must be >= 0, got {limit}")
        early = horizon(ahead)
        await self._start()
        if limit == 0:
            return []
        claimed: list[str] = []
        fallback_error: QueueUnavailableError | None = None
        if self._fallback_may_be_due(early):
            try:
                claimed = await self._claim_fallback(limit, ahead)
            except QueueUnavailableError as error:
                fallback_error = error
        if len(claimed) >= limit:
            return claimed
        if self._primary_usable():
            done, ids = await self._on_primary(
                lambda: self._primary.claim_due(limit - len(claimed), ahead), limit
            )
            if done:
                return claimed + (ids or [])
        if fallback_error is not None and not claimed:
            raise fallback_error  # neither queue answered: the worker backs off
        return claimed

    async def remove(self, execution_ids: Sequence[str]) -> None:
        await self._start()
        if not execution_ids:
            return
        if self._primary_usable():
            await self._on_primary(lambda: self._primary.remove(execution_ids), len(execution_ids))
        await self._fallback.remove(execution_ids)

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        await self._start()
        if not execution_ids:
            return []
        lacking: list[str] | None = None
        if self._primary_usable():
            _, lacking = await self._on_primary(
                lambda: self._primary.missing(execution_ids), len(execution_ids)
            )
        if lacking is None:  # the primary cannot say: only what the fallback holds counts
            lacking = list(execution_ids)
        return await self._fallback.missing(lacking) if lacking else []

    async def next_due_at(self) -> datetime | None:
        await self._start()
        dues = [await self._fallback.next_due_at()]
        if self._primary_usable():
            _, due = await self._on_primary(self._primary.next_due_at)
            dues.append(due)
        known = [due for due in dues if due is not None]
        return min(known) if known else None

    async def size(self) -> int:
        await self._start()
        total = await self._fallback.size()
        if self._primary_usable():
            _, held = await self._on_primary(self._primary.size)
            total += held or 0
        return total

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        early = horizon(ahead)
        if self._closed:
            return
        start = self._clock.monotonic()  # before any I/O: time spent reading counts
        woken = asyncio.Event()
        # Registered before any await: every later enqueue (or change of the primary) wakes it.
        # Kept as a due time: an arrival due before the timeout's end + ahead wakes it.
        end = self._clock.now() + timedelta(seconds=min(max(timeout, 0.0), 1e7))
        self._wakers[woken] = end + early
        try:
            try:
                await self._start()
                # Even if "known": what this object knows is stale once it is time to look (the
                # fallback's recheck or poll), and claims made through another object (a
                # worker's claim thread) do not refresh it. Not reading then returned at once,
                # every call: an idle worker spun at 80 % of a core.
                if self._fallback_may_be_due(early):
                    await self._read_fallback()
            except QueueUnavailableError:
                pass  # the fallback's retry time says when to look again
            except Exception:
                if self._closed:  # closed under our feet: that releases waiters
                    return
                raise
            now = self._clock.monotonic()
            span = min(max(timeout, 0.0) - (now - start), self._fallback_look_at(early) - now)
            if span <= 0 or woken.is_set():
                await asyncio.sleep(0)  # something may be due: still yield, so a caller cannot spin
                return
            deadline = now + span
            while (left := deadline - self._clock.monotonic()) > 0 and not woken.is_set():
                if self._primary_usable():
                    # Bounded on the clock too: a primary stuck in I/O must not hold a worker
                    # (and the fallback's runs) past its span.
                    limit = self._clock.sleep(left + PRIMARY_TIMEOUT)
                    error = await _race(self._primary.wait(left, ahead), woken, limit)
                    if not isinstance(error, QueueUnavailableError):
                        if error is not None:
                            raise error
                        return
                    # Its wake-up subscription is down (Redis down, or reconnecting after an
                    # outage): the claims, not this, say whether the primary works. Sleep a
                    # little, then try its wait again.
                    pause = PRIMARY_RETRY
                else:
                    pause = self._primary_retry_at - self._clock.monotonic()
                pause = min(pause, deadline - self._clock.monotonic())
                if pause > 0:
                    error = await _race(self._clock.sleep(pause), woken)
                    if error is not None:  # a broken clock must not pass for a timeout
                        raise error
        finally:
            self._wakers.pop(woken, None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for woken in self._wakers:
            woken.set()
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        try:
            await self._primary.close()
        finally:
            await self._fallback.close()

    # -- the primary -----------------------------------------------------------------------

    def _primary_usable(self) -> bool:
        return self._primary_up or self._clock.monotonic() >= self._primary_retry_at

    async def _on_primary(
        self, call: Callable[[], Awaitable[T]], ids: int = 0
    ) -> tuple[bool, T | None]:
        """Run ``call`` (carrying ``ids`` ids) on the primary with a short timeout. Returns
        (True, its result), or (False, None) if the primary is unavailable (recorded).

        A call cut off by the timeout may have done its work all the same: an enqueue then
        leaves copies in both queues (the store starts the run once), a claim loses its ids
        until the sweep re-enqueues them (as when a worker dies right after claiming)."""
        timeout = (PRIMARY_TIMEOUT if self._primary_up else RETRY_TIMEOUT) + ids * PER_ITEM_TIMEOUT
        try:
            try:
                result = await asyncio.wait_for(call(), timeout)
            except QueueUnavailableError:
                # Once more at once: a pooled connection Redis closed while it was down fails
                # on its first use after Redis is back (the failover flapped to the fallback and
                # back within a millisecond); an outage fails twice, fast (refused).
                result = await asyncio.wait_for(call(), timeout)
        except (QueueUnavailableError, TimeoutError) as error:
            self._primary_failed(error)
            return False, None
        self._primary_worked()
        return True, result

    def _primary_failed(self, error: BaseException) -> None:
        self._primary_retry_at = self._clock.monotonic() + PRIMARY_RETRY
        if not self._primary_up:
            return
        self._primary_up = False
        reason = str(error) or f"no answer within {PRIMARY_TIMEOUT} s"
        if self._log_changes:
            log.warning(
                "delay queue %s unavailable (%s); using the fallback queue in the store's database",
                self._primary_url,
                reason,
            )
        self._tell(up=False)

    def _primary_worked(self) -> None:
        self._primary_last_ok = self._clock.monotonic()
        if self._primary_up:
            return
        self._primary_up = True
        if self._log_changes:
            log.warning("delay queue %s is back; enqueueing to it again", self._primary_url)
        self._tell(up=True)

    def _tell(self, *, up: bool) -> None:
        for listener in self._listeners:
            try:
                listener(up)
            except Exception:
                log.exception("a listener of the delay queue's failover failed")
        for woken in self._wakers:  # a waiter parked on the primary looks again
            woken.set()

    async def _probe_loop(self) -> None:
        """Probe the primary, so listeners hear of an outage even when nothing is queued, and
        of a primary that lost its data while up."""
        while True:
            await self._clock.sleep(PROBE_INTERVAL)
            if not self._primary_usable():
                continue
            if isinstance(self._primary, ForgetfulQueue):
                done, lost = await self._on_primary(self._primary.lost_data)
                if done and lost:
                    log.warning(
                        "delay queue %s lost its data (restarted or flushed); checking every"
                        " queued run against it",
                        self._primary_url,
                    )
                    self._tell(up=True)
                continue
            now = self._clock.monotonic()
            if self._primary_up and now - self._primary_last_ok < PROBE_INTERVAL:
                continue  # traffic has just shown it works
            await self._on_primary(self._primary.next_due_at)

    # -- the fallback ----------------------------------------------------------------------

    async def _start(self) -> None:
        """Start following the fallback's enqueues (once; again after a failure), and the
        probe if anyone listens to the failover. Raises only ``RuntimeError`` (closed)."""
        if self._closed:
            raise RuntimeError("FailoverDelayQueue is closed")
        if self._listeners and self._probe is None:
            self._probe = asyncio.create_task(self._probe_loop(), name="onbeat-queue-probe")
        if self._observing or self._clock.monotonic() < self._fallback_retry_at:
            return
        async with self._observe_lock:
            if self._observing:
                return
            try:
                await self._fallback.observe(self._heard)
            except QueueUnavailableError as error:
                # Not fatal: Redis may work. Until the fallback answers, it is tried once per
                # PRIMARY_RETRY and its content is unknown.
                log.warning("the fallback queue cannot be reached: %s", error)
                self._fallback_failed()
                return
            self._observing = True

    def _heard(self, due: datetime | None) -> None:
        """A batch was enqueued to the fallback (by any process) with this earliest due time."""
        self._news += 1
        if due is None:
            self._fallback_known = False
        elif self._fallback_known and (self._fallback_due is None or due < self._fallback_due):
            self._fallback_due = due
        self._wake_waiters(due)

    def _wake_waiters(self, due: datetime | None) -> None:
        """Wake the waiters that would sleep past ``due`` (None: all); each waiter's deadline
        is a due time (its timeout's end plus its ``ahead``), compared as is."""
        for woken, deadline in self._wakers.items():
            if due is None or due < deadline:
                woken.set()

    def _fallback_look_at(self, early: timedelta) -> float:
        """When (monotonic) the fallback should next be looked at, by a caller that takes ids
        ``early`` before they are due."""
        now = self._clock.monotonic()
        if now < self._fallback_retry_at:
            return self._fallback_retry_at
        if not self._observing:  # no news of other processes' enqueues: poll
            return self._fallback_read_at + UNHEARD_POLL
        if not self._fallback_known:
            return now
        recheck = self._fallback_read_at + FALLBACK_RECHECK
        if self._fallback_due is None:
            return recheck
        until_due = (self._fallback_due - early - self._clock.now()).total_seconds()
        return min(recheck, now + until_due)

    def _fallback_may_be_due(self, early: timedelta) -> bool:
        return self._fallback_look_at(early) <= self._clock.monotonic()

    async def _claim_fallback(self, limit: int, ahead: float) -> list[str]:
        """Claim from the fallback; if it had fewer than ``limit`` due, learn when its next
        item is due, so that it is not read again before then (or before news)."""
        try:
            claimed = await self._fallback.claim_due(limit, ahead)
        except QueueUnavailableError:
            self._fallback_failed()
            raise
        if len(claimed) == limit:
            self._fallback_known = False  # more may be due
        else:
            with contextlib.suppress(QueueUnavailableError):  # the ids are claimed: hand them out
                await self._read_fallback()
        return claimed

    async def _read_fallback(self) -> None:
        """Read the fallback's earliest due time."""
        news = self._news
        try:
            due = await self._fallback.next_due_at()
        except QueueUnavailableError:
            self._fallback_failed()
            raise
        self._fallback_retry_at = -math.inf
        self._fallback_read_at = self._clock.monotonic()
        # An enqueue heard during the read may or may not be in it: look again next time.
        self._fallback_known = news == self._news
        self._fallback_due = due

    def _fallback_failed(self) -> None:
        self._fallback_known = False
        self._fallback_retry_at = self._clock.monotonic() + PRIMARY_RETRY


async def _race(
    sleep: Awaitable[None], woken: asyncio.Event, limit: Awaitable[None] | None = None
) -> BaseException | None:
    """Await ``sleep`` until it ends, ``woken`` is set or ``limit`` ends; returns what ``sleep``
    raised."""
    inner = asyncio.ensure_future(sleep)
    others: list[asyncio.Future[Any]] = [asyncio.ensure_future(woken.wait())]
    if limit is not None:
        others.append(asyncio.ensure_future(limit))
    try:
        await asyncio.wait((inner, *others), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (inner, *others):
            task.cancel()
        await asyncio.gather(inner, *others, return_exceptions=True)
    return None if inner.cancelled() or not inner.done() else inner.exception()
