"""The scheduler: turns planned executions into delay-queue entries, for the shards it leases.

Any number of schedulers run at once; each takes a fair share of the shards by lease and works only
those, so there is no leader and a dead scheduler's shards are taken over once its leases expire.
Each job below is its own asyncio task on its own timer, so none waits behind another: a long
dispatch or sweep pass under a backlog never delays the lease renewal, and a lease never lapses
because the node is busy.

- renew: the shard leases, every ``shard_renew_interval``;
- dispatch: executions due within ``window`` in held shards → queued (+ the next execution of each
  cron job), every ``poll_interval``, and at once when ``wake()`` is called;
- reap: running executions whose lease expired, in every shard (whoever held them) → queued again
  in this scheduler's queue, or dead-lettered; safe for any number of schedulers at once;
- sweep: queued executions the queue lost → enqueued again. Each pass reads one bounded page of the
  overdue ones, going on from where the last pass stopped, and re-enqueues only the ids the queue
  does not hold; shards just taken over get every queued run checked, page by page.
- reconcile: every active cron job of the held shards must have its next run planned; any
  without one is repaired, logged and counted, whatever the cause; every ``reconcile_interval``.
- end stalled sessions: database sessions frozen mid-pipeline inside a transaction (whose locks
  the server's idle timeout does not release) are ended, every ``reap_interval``
  (``Store.session_end_stalled``);
- measure: the queue depth by priority (runs due and not started) for ``/metrics``, every
  ``sweep_interval``;
- alerts: with a webhook configured, deliver the alert outbox (``onbeat.alerts``), every
  ``alert_interval``; safe for any number of schedulers at once.
- maintain history: day partitions created ahead and history past the retention dropped
  (``Store.history_maintain``), on start and every ``history_maintain_interval``; every
  scheduler runs it, and the store makes concurrent passes harmless.
- refresh statistics: the hot tables, once they outgrow their planner statistics, are analyzed
  (``Store.statistics_refresh``), every ``sweep_interval``, so the plans every process prepared
  while they were small are made again; one scheduler at a time does it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from onbeat.alerts import AlertSender
from onbeat.clock import Clock
from onbeat.errors import StoreUnavailableError
from onbeat.metrics import Metrics
from onbeat.model import ExecutionStatus
from onbeat.queue.base import DelayQueue, QueueItem
from onbeat.settings import Settings
from onbeat.store.base import DispatchParams, JobCursor, ShardLeases, Store, SweepCursor

log = logging.getLogger("onbeat.scheduler")

MAX_ERROR_BACKOFF = 5.0
"""Longest wait between two passes of a scheduler service while its passes keep failing."""

REAP_BATCH = 1000
"""Most expired leases one reap transaction handles; a pass goes on until it finds fewer."""


def shard_ranges(shards: Iterable[int]) -> str:
    """``0-511, 700, 702-703``: a set of shards as a log line can show it (a first scheduler
    takes all 1,024)."""
    spans: list[list[int]] = []
    for shard in sorted(shards):
        if spans and shard == spans[-1][1] + 1:
            spans[-1][1] = shard
        else:
            spans.append([shard, shard])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def process_name(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


@dataclass
class SchedulerStats:
    dispatched: int = 0
    swept: int = 0
    """Runs the sweep handed to the queue again because the queue did not hold them."""
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
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.metrics = metrics or Metrics()
        self.settings = settings
        self.clock = clock
        self.owner = owner or process_name("scheduler")
        self.leases = ShardLeases(self.owner, {}, frozenset())
        self.stats = SchedulerStats()
        self._wake = asyncio.Event()
        self._sweep_wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweep_cursor: SweepCursor | None = None
        """Where the periodic sweep goes on from (None: from the start)."""
        self._backlog_priorities: set[int] = set()
        """Priorities the queue-depth gauge has reported (so one that empties reads 0)."""
        self._store_failed_at = -math.inf
        """When (monotonic) a pass last found the store unavailable: see ``reap``."""
        self._store_back_at = -math.inf
        """When (monotonic) the store answered the reaper again: its first round trip after the
        last failure, or the end of a wait of half a lease TTL or more. No reap for a lease TTL
        after it (see ``reap``)."""
        self._hold_off_logged = -math.inf
        """The ``_store_back_at`` whose hold-off was logged: one line per hold-off."""
        self._taken_over: set[int] = set()
        """Shards taken over whose queued runs have not all been checked against the queue yet."""
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

    def recheck_queue(self, primary_up: bool = True) -> None:
        """The queue failed over to its fallback, or back (``FailoverDelayQueue``): check every
        queued run of the held shards against it now, as after a takeover. While Redis is down
        this moves the runs it held to the fallback, so they start on time; once Redis is back,
        it refills a Redis that lost its data. Call on the scheduler's event loop."""
        self._taken_over |= set(self.leases.epochs)
        self._sweep_wake.set()

    async def renew_shards(self) -> None:
        self.leases = await asyncio.to_thread(
            self.store.shard_acquire, self.owner, self.settings.shard_lease_ttl
        )
        self.started.set()
        self.metrics.shards_held.set(len(self.leases.epochs))
        if self.leases.acquired:
            self.stats.shards_taken += len(self.leases.acquired)
            self.metrics.shard_takeovers.inc(len(self.leases.acquired))
            log.info("%s took shards %s", self.owner, shard_ranges(self.leases.acquired))
            # A shard's previous owner may have queued runs into a queue that has since lost them
            # (an in-process queue dies with its process): the sweep loop checks all of them at
            # once. Not in this pass: renewing must not wait for a sweep of many shards, or the
            # leases lapse meanwhile and are taken away, and the next takeover sweeps again.
            self._taken_over |= self.leases.acquired
            self._sweep_wake.set()
            self._wake.set()

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

    async def sweep(self) -> int:
        """One sweep pass; returns how many runs were handed to the queue again.

        Shards just taken over first: every queued run in them, page by page. Then one page of at
        most ``sweep_batch`` runs queued and overdue by ``sweep_overdue`` in the held shards, from
        where the previous pass stopped (wrapping around at the end), so that a backlog of any
        size costs each pass the same."""
        taken_over = await self._sweep_taken_over()
        if taken_over:  # submitted while no scheduler held the shard, or by a process whose
            # memory queue is not this one (a script's app.schedule, before `onbeat up`)
            log.info(
                "enqueued %d queued runs of the shards just taken over that the delay queue"
                " did not hold",
                taken_over,
            )
        overdue, self._sweep_cursor = await self._sweep_page(
            sorted(self.leases.epochs), self.settings.sweep_overdue, self._sweep_cursor
        )
        if overdue:
            log.info(
                "re-enqueued %d runs queued over %gs ago that the delay queue did not hold",
                overdue,
                self.settings.sweep_overdue,
            )
        return taken_over + overdue

    async def _sweep_taken_over(self) -> int:
        """Every queued run of the shards just taken over, page by page (see ``sweep``)."""
        total = 0
        while self._taken_over:
            shards = sorted(self._taken_over)
            cursor: SweepCursor | None = None
            while True:
                added, cursor = await self._sweep_page(shards, None, cursor)
                total += added
                if cursor is None:
                    break
            self._taken_over.difference_update(shards)
        return total

    async def _sweep_page(
        self, shards: list[int], overdue_by: float | None, after: SweepCursor | None
    ) -> tuple[int, SweepCursor | None]:
        """Read one page of queued runs and enqueue those the queue lacks; returns how many, and
        where the next page starts."""
        page = await asyncio.to_thread(
            self.store.execution_sweep,
            self.leases,
            shards,
            overdue_by,
            self.settings.sweep_batch,
            after,
        )
        lacking = set(await self.queue.missing([item.execution_id for item in page.items]))
        if lacking:
            await self.queue.enqueue([item for item in page.items if item.execution_id in lacking])
        self.stats.swept += len(lacking)
        self.metrics.sweep_reenqueued.inc(len(lacking))
        return len(lacking), page.resume

    async def reap(self) -> int:
        """Take back runs whose lease expired, in every shard, and queue them here again: they run
        again within their lease TTL + ``reap_interval`` (+ retry backoff) of their worker's
        death, without waiting for a takeover of their shard. Returns how many were reaped.

        Nothing is reaped within a lease TTL of the first round trip that gets through after a
        pass found the store unavailable, or of the end of a reap pass (or of the round trip that
        opens one) the store kept waiting for half a lease TTL or more: while this scheduler could
        not get through, the workers most likely could not either, and a lease that ran out then
        belongs to a holder that could not renew it, not to a dead one (the store also holds off
        for a lease TTL after its server starts, for an outage no pass saw)."""
        # A pass that waited to get through (for a connection while the server restarted and
        # ran its crash recovery) would reap the moment it got in, beside workers reconnecting
        # at the same moment; so would the first pass after the store failed, though it did not
        # wait (a worker's pool may reconnect seconds after this scheduler's: N1 reaped the runs
        # of one 2 s before it got back). One round trip first tells; the holders then get a
        # lease TTL from the moment the store answered, not from the failure.
        began = self.clock.monotonic()
        await asyncio.to_thread(self.store.ping)
        got_through = self.clock.monotonic()
        waited = got_through - began >= self.settings.lease_ttl / 2
        if waited or self._store_failed_at > self._store_back_at:
            self._store_back_at = got_through
        if got_through - self._store_back_at < self.settings.lease_ttl:
            if self._hold_off_logged != self._store_back_at:
                self._hold_off_logged = self._store_back_at
                log.info(
                    "reaper holding off for %.1fs: the store was unavailable or kept a pass"
                    " waiting, so the workers get a lease TTL to renew before any lease is taken",
                    self._store_back_at + self.settings.lease_ttl - got_through,
                )
            return 0
        total = 0
        while True:
            began = self.clock.monotonic()
            reaped = await asyncio.to_thread(
                self.store.execution_reap, REAP_BATCH, self.settings.lease_ttl
            )
            if self.clock.monotonic() - began >= self.settings.lease_ttl / 2:
                # The store kept this pass waiting (a table lock, a stalled server): the holders'
                # heartbeats waited alike, and what it reaped may have been theirs. Nothing more
                # until they have had a lease TTL to get through.
                self._store_back_at = self.clock.monotonic()
            again = [
                QueueItem(e.id, e.due_at, e.priority, e.shard)
                for e in reaped
                if e.status is ExecutionStatus.QUEUED
            ]
            if again:
                await self.queue.enqueue(again)
            for execution in reaped:
                log.warning(
                    "lease of execution %s expired (attempt %d): now %s",
                    execution.id,
                    execution.attempt,
                    execution.status.value,
                    extra={
                        "execution_id": execution.id,
                        "job_id": execution.job_id,
                        "attempt": execution.attempt,
                        "fencing_token": execution.fencing_token,
                    },
                )
                if execution.status is ExecutionStatus.FAILED:
                    self.metrics.dead_letters.inc()
                    # Rare (a worker died on the last attempt): one read for the task label.
                    job = await asyncio.to_thread(self.store.job_get, execution.job_id)
                    task = job.task if job is not None else "unknown"
                    self.metrics.executions.labels(task, ExecutionStatus.FAILED.value).inc()
            self.metrics.lease_expiries.inc(len(reaped))
            total += len(reaped)
            if len(reaped) < REAP_BATCH:
                break
        self.stats.reaped += total
        return total

    async def end_stalled_sessions(self) -> int:
        """End the database sessions of frozen processes that hold locks mid-transaction; returns
        how many (see ``Store.session_end_stalled``)."""
        ended = await asyncio.to_thread(self.store.session_end_stalled)
        self.metrics.stalled_sessions_ended.inc(ended)
        if ended:
            log.warning(
                "ended %d database session(s) stalled inside a transaction (a frozen process's);"
                " their locks are released",
                ended,
            )
        return ended

    async def measure_backlog(self) -> int:
        """Set the queue-depth gauge (runs due and not started, by priority); returns the total.
        A priority that had runs and has none now reads 0, not its last value."""
        backlog = await asyncio.to_thread(self.store.execution_backlog)
        for priority in self._backlog_priorities - backlog.keys():
            self.metrics.queue_depth.labels(str(priority)).set(0)
        for priority, runs in backlog.items():
            self.metrics.queue_depth.labels(str(priority)).set(runs)
        self._backlog_priorities |= backlog.keys()
        return sum(backlog.values())

    async def reconcile(self) -> int:
        """Repair every active cron job of the held shards that has no planned next run, a page
        of jobs per store call; returns how many were repaired."""
        repaired = 0
        cursor: JobCursor | None = None
        while self.leases.epochs:
            fixed, cursor = await asyncio.to_thread(
                self.store.job_repair_next_runs, self.leases, cursor, 1000
            )
            for job_id in fixed:
                log.error(
                    "job %s had no planned next run; planned it (reconciler)",
                    job_id,
                    extra={"job_id": job_id},
                )
            repaired += len(fixed)
            self.metrics.reconciler_repairs.inc(len(fixed))
            if cursor is None:
                break
        self.stats.repaired += repaired
        return repaired

    async def maintain_history(self) -> None:
        """Partitions ahead and retention of the execution history (``Store.history_maintain``)."""
        s = self.settings
        upkeep = await asyncio.to_thread(
            self.store.history_maintain, s.execution_retention_days, s.partitions_ahead_days
        )
        if upkeep.dropped or upkeep.deleted:
            log.info(
                "history retention: %d partition(s) dropped, %d run(s) deleted",
                len(upkeep.dropped),
                upkeep.deleted,
            )

    async def refresh_statistics(self) -> None:
        """Tables that outgrew their planner statistics analyzed (``Store.statistics_refresh``)."""
        await asyncio.to_thread(self.store.statistics_refresh)

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then give the shards back so another scheduler takes them at once."""
        s = self.settings
        self._loop = asyncio.get_running_loop()
        loops = [
            asyncio.create_task(self._every(s.shard_renew_interval, self.renew_shards, stop)),
            asyncio.create_task(self._every(s.poll_interval, self.dispatch, stop, self._wake)),
            asyncio.create_task(self._every(s.reap_interval, self.reap, stop)),
            asyncio.create_task(self._every(s.reap_interval, self.end_stalled_sessions, stop)),
            asyncio.create_task(self._every(s.sweep_interval, self.sweep, stop, self._sweep_wake)),
            asyncio.create_task(self._every(s.reconcile_interval, self.reconcile, stop)),
            asyncio.create_task(self._every(s.sweep_interval, self.measure_backlog, stop)),
            asyncio.create_task(self._every(s.sweep_interval, self.refresh_statistics, stop)),
            asyncio.create_task(
                self._every(s.history_maintain_interval, self.maintain_history, stop)
            ),
        ]
        alerts = None
        if s.alert_webhook_url is not None:
            alerts = AlertSender(self.store, s, self.clock, self.metrics)
            loops.append(
                asyncio.create_task(self._every(s.alert_interval, alerts.deliver_due, stop))
            )
        try:
            await asyncio.gather(*loops)
        finally:
            for loop in loops:
                loop.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if alerts is not None:
                await alerts.close()
            await asyncio.to_thread(self.store.shard_release, self.owner)
            self.metrics.shards_held.set(0)

    async def _every(
        self,
        interval: float,
        work: Callable[[], Awaitable[object]],
        stop: asyncio.Event,
        wake: asyncio.Event | None = None,
    ) -> None:
        """Run ``work`` every ``interval`` seconds, counted from the start of one pass to the start
        of the next, and at once when ``wake`` is set, until ``stop`` is set. While passes fail
        (the store is unreachable or refuses writes), the next one waits longer, up to
        ``MAX_ERROR_BACKOFF``, and the failure is logged with its traceback once, not every pass."""
        events = (stop,) if wake is None else (stop, wake)
        failures = 0
        while not stop.is_set():
            started = self.clock.monotonic()
            if wake is not None:
                wake.clear()  # a wake-up during the pass makes the next pass start at once
            try:
                await work()
            except Exception as exc:
                # Nothing is lost, only delayed: keep trying.
                if isinstance(exc, StoreUnavailableError):
                    self._store_failed_at = self.clock.monotonic()
                self.stats.errors += 1
                failures += 1
                if failures == 1:
                    log.exception("scheduler %s pass failed; retrying", work.__name__)
                else:
                    log.warning(
                        "scheduler %s pass failed %d times: %s", work.__name__, failures, exc
                    )
            else:
                if failures:
                    log.info("scheduler %s pass works again", work.__name__)
                failures = 0
            pause = interval if not failures else min(interval * 2**failures, MAX_ERROR_BACKOFF)
            await sleep_or_wake(
                self.clock, started + max(pause, interval) - self.clock.monotonic(), *events
            )


async def sleep_or_wake(clock: Clock, seconds: float, *events: asyncio.Event) -> None:
    """Sleep ``seconds`` on ``clock``, or less if any event is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait([sleeper, *waiters], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in [sleeper, *waiters]:
            f.cancel()
