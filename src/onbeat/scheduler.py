"""The scheduler: turns planned executions into delay-queue entries, for the shards it leases.

Any number of schedulers run at once; each takes a fair share of the shards by lease and works only
those, so there is no leader and a dead scheduler's shards are taken over once its leases expire.
Each pass is a range read on the store's (shard, status, due_at) index:

- dispatch: executions due within ``window`` → queued (+ the next execution of each cron job),
  every ``poll_interval``, and at once when ``wake()`` is called;
- sweep: queued executions long overdue that no worker started (the queue lost them) → enqueued again;
- reap: running executions whose lease expired (the worker died or stalled) → retry or dead letter;
- reconcile: every active cron job must have its next run planned; any without one is repaired,
  logged and counted, whatever the cause.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

from onbeat.clock import Clock
from onbeat.queue.base import DelayQueue
from onbeat.settings import Settings
from onbeat.store.base import DispatchParams, ShardLeases, Store

log = logging.getLogger("onbeat.scheduler")


def process_name(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


@dataclass
class SchedulerStats:
    dispatched: int = 0
    swept: int = 0
    reaped: int = 0
    repaired: int = 0
    """Active cron jobs found without their next planned run, and given one."""
    shards_taken: int = 0
    errors: int = 0


class Scheduler:
    def __init__(
        self,
        store: Store,
        queue: DelayQueue,
        settings: Settings,
        clock: Clock,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self.clock = clock
        self.owner = owner or process_name("scheduler")
        self.leases = ShardLeases(self.owner, {}, frozenset())
        self.stats = SchedulerStats()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.started = asyncio.Event()
        """Set once the first shard leases are held (tests and the node wait on it)."""

    def wake(self) -> None:
        """Dispatch now rather than at the next poll: new work was just submitted in this process.
        Safe to call from any thread (the API runs App calls in a thread pool)."""
        loop = self._loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if loop is None or on_loop:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def renew_shards(self) -> None:
        self.leases = await asyncio.to_thread(
            self.store.shard_acquire, self.owner, self.settings.shard_lease_ttl
        )
        if self.leases.acquired:
            self.stats.shards_taken += len(self.leases.acquired)
            log.info("%s took shards %s", self.owner, sorted(self.leases.acquired))
            # A shard's previous owner may have queued runs into a queue that has since lost them
            # (an in-process queue dies with its process): hand all of them to the queue again.
            await self.sweep(sorted(self.leases.acquired), overdue_by=None)

    async def dispatch(self) -> int:
        """Queue everything due within the window; returns how many runs were enqueued."""
        params = DispatchParams(
            self.leases,
            self.settings.window,
            self.settings.misfire_grace,
            self.settings.dispatch_batch,
        )
        total = 0
        while self.leases.epochs:
            items = await asyncio.to_thread(self.store.execution_dispatch, params)
            if items:
                await self.queue.enqueue(items)
                total += len(items)
            if len(items) < params.limit:
                break
        self.stats.dispatched += total
        return total

    async def sweep(self, shards: list[int], overdue_by: float | None) -> int:
        """Re-enqueue queued runs of ``shards`` overdue by ``overdue_by`` seconds (None: all)."""
        total, limit = 0, 10_000
        while shards:
            items = await asyncio.to_thread(
                self.store.execution_sweep, self.leases, shards, overdue_by, limit
            )
            if items:
                await self.queue.enqueue(items)
                total += len(items)
            if len(items) < limit:
                break
        if total:
            log.info("re-enqueued %d queued runs the delay queue did not hold", total)
        self.stats.swept += total
        return total

    async def reap(self) -> int:
        reaped = await asyncio.to_thread(self.store.execution_reap, self.leases, 1000)
        for execution in reaped:
            log.warning(
                "lease of execution %s expired (attempt %d): now %s",
                execution.id,
                execution.attempt,
                execution.status.value,
            )
        self.stats.reaped += len(reaped)
        return len(reaped)

    async def reconcile(self) -> int:
        """Repair every active cron job of the held shards that has no planned next run, a page
        of jobs per store call; returns how many were repaired."""
        repaired, cursor = 0, ""
        while self.leases.epochs:
            fixed, next_cursor = await asyncio.to_thread(
                self.store.job_repair_next_runs, self.leases, cursor, 1000
            )
            for job_id in fixed:
                log.error("job %s had no planned next run; planned it (reconciler)", job_id)
            repaired += len(fixed)
            if next_cursor is None:
                break
            cursor = next_cursor
        self.stats.repaired += repaired
        return repaired

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then give the shards back so another scheduler takes them at once."""
        s = self.settings
        self._loop = asyncio.get_running_loop()
        next_renew = next_sweep = next_reap = self.clock.monotonic()
        next_reconcile = next_renew + s.reconcile_interval
        try:
            while not stop.is_set():
                now = self.clock.monotonic()
                try:
                    if now >= next_renew:
                        await self.renew_shards()
                        next_renew = now + s.shard_renew_interval
                        self.started.set()
                    await self.dispatch()
                    if now >= next_reap:
                        await self.reap()
                        next_reap = now + s.reap_interval
                    if now >= next_sweep:
                        await self.sweep(sorted(self.leases.epochs), s.sweep_overdue)
                        next_sweep = now + s.sweep_interval
                    if now >= next_reconcile:
                        await self.reconcile()
                        next_reconcile = now + s.reconcile_interval
                except Exception:
                    # The store or queue is unreachable: keep trying; nothing is lost, only delayed.
                    self.stats.errors += 1
                    log.exception("scheduler pass failed; retrying")
                await sleep_or_wake(self.clock, s.poll_interval, self._wake, stop)
                self._wake.clear()
        finally:
            await asyncio.to_thread(self.store.shard_release, self.owner)


async def sleep_or_wake(clock: Clock, seconds: float, *events: asyncio.Event) -> None:
    """Sleep ``seconds`` on ``clock``, or less if any event is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait([sleeper, *waiters], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in [sleeper, *waiters]:
            f.cancel()
