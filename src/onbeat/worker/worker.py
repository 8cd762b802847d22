"""The worker: claims due runs from the delay queue, runs them, heartbeats, records outcomes.

A run is started only after the store flips it from queued to running with a lease and a new
fencing token; every later write names that token, so a worker that lost its lease (stalled,
partitioned) cannot overwrite the outcome of the run's next attempt. Outcomes and heartbeats are
batched: one store call per batch, not per run.

Task code cannot stop, starve or strand the worker: it runs in an executor (``executors.py``),
and whatever it raises becomes a failed attempt (``attempt.py``); the heartbeat renews leases
from its own thread (``heartbeat.py``), so a task blocking the event loop does not get healthy
runs rescued; while a task blocks it, the runs claimed that the loop cannot start are handed
back to the store (released) from the watchdog's thread, to start elsewhere; and every run the
store started is tracked (heartbeated, then finished or released) from the moment the claim
returns, even when the worker is stopping.

With ``claim_ahead``, an idle worker also claims runs due within that many seconds; it holds
them until their due time, confirms them then and starts those confirmed (``ahead.py``). A run
confirmed while every slot is busy waits in ``_ready``, as does a run claimed beyond the free
slots while runs end quickly (``claim_prefetch``, ``pace.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

from onbeat.clock import Clock
from onbeat.limits import NO_LIMITS, LimitDefaults
from onbeat.logs import run_fields
from onbeat.metrics import Metrics
from onbeat.queue.base import DelayQueue, QueueItem
from onbeat.scheduler import process_name, sleep_or_wake
from onbeat.settings import Settings
from onbeat.store.base import ClaimedRun, ClaimResult, Completion, Store
from onbeat.task import Pool, Task, TaskRegistry
from onbeat.worker.ahead import ClaimsAhead, HeldAhead
from onbeat.worker.attempt import run_attempt
from onbeat.worker.claim_thread import ClaimThread
from onbeat.worker.executors import AsyncExecutor, Executor, ThreadExecutor
from onbeat.worker.heartbeat import Heartbeat, HeldLeases
from onbeat.worker.held import Held
from onbeat.worker.instruments import TaskInstruments
from onbeat.worker.outage import FailureStreak
from onbeat.worker.outcomes import report_outcomes
from onbeat.worker.pace import RecentEnds
from onbeat.worker.processes import ProcessExecutor
from onbeat.worker.watchdog import RUN_TASK_PREFIX, LoopWatchdog

log = logging.getLogger("onbeat.worker")

BURST_FLUSH_DELAY = 1.0
"""Longest time outcomes wait while runs confirmed at one instant still wait for a slot: the
outcome writes would take the CPU the starts need (the store's and this process's)."""
CLAIM_GATHER = 0.005
"""Longest time (real seconds) the claim loop waits, while the queue has more due and few slots
are free, for half a claim batch of slots to free (``_gather_free_slots``)."""
ARRIVAL_GATHER = 0.010
"""Seconds (real) the claim loop waits before it claims again after a claim that took more than
one run and every run the queue had due (a stream of runs arriving, not a backlog), so that the
next claim carries more: a claim cycle costs its worker, the queue and their PostgreSQL
backends the same however few runs it carries, and single creates each run at once (W5) were
claimed 17 a claim. A run that arrives alone (the last claim took one) is claimed at once, and
a backlog (the claim took all it asked for) as soon as slots free."""
RESTART_BACKOFF = 1.0
"""Seconds a worker loop that failed again within this long waits before its next restart."""
OUTCOMES_PER_WRITE = 1_000
"""Most outcomes one store call writes. Outcomes gather without bound while a write is slow or
failing (thousands of runs ending together, a store outage), and one statement of all of them
has a cost no plan bounds: the store joins the batch with its runs, and PostgreSQL can plan that
join as a nested loop over both (docs/architecture.md, the confirm)."""
OUTCOME_GATHER = 0.010
"""Seconds the outcome writer waits after the first outcome of a write, so that outcomes ending
together share it. A write costs about 1.6 ms of CPU (worker and PostgreSQL) however few it
carries; a run stays ``running`` in the store this much longer after it ended."""


@dataclass
class WorkerStats:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    fenced: int = 0
    """Runs stopped, or outcomes refused, because the run's lease had been taken away."""
    released: int = 0
    handed_back: int = 0
    """Runs claimed but not yet started, released while a task blocked the event loop."""
    threads_abandoned: int = 0
    """Sync runs that timed out or were cancelled while their thread ran on (it cannot be stopped)."""
    loop_restarts: int = 0
    """Times a background loop of the worker failed and was restarted."""
    loop_stalls: int = 0
    """Times the event loop did not answer for ``loop_stall_warning`` seconds (see watchdog.py)."""


class Worker:
    def __init__(
        self,
        store: Store,
        queue: DelayQueue,
        registry: TaskRegistry,
        settings: Settings,
        clock: Clock,
        owner: str | None = None,
        metrics: Metrics | None = None,
        claim_queue: Callable[[], DelayQueue] | None = None,
    ) -> None:
        """``claim_queue`` opens a second connection to ``queue`` for claims on a thread of
        their own while the worker runs (claim_thread.py); None: claims on the event loop (an
        in-process queue, which has no second connection)."""
        self.store = store
        self.queue = queue
        self._open_claim_queue = claim_queue
        self._claim_thread: ClaimThread | None = None
        self.registry = registry
        self.metrics = metrics or Metrics()
        self.settings = settings
        self._held_back = 0
        """Runs the last claim's limits handed back (see ``claim_once``)."""
        self._limits = LimitDefaults(
            settings.max_in_flight,
            settings.tenant_max_in_flight,
            settings.tenant_max_starts_per_second,
        )
        self.on_runs_woken: Callable[[], None] | None = None
        """Called after outcomes are written while runs wait for a predecessor (the embedded node
        wakes its scheduler, so a backlog drains at the pace of its runs, not of dispatch polls)."""
        self._waiting_jobs: set[str] = set()
        self.clock = clock
        self.owner = owner or process_name("worker")
        self.stats = WorkerStats()
        self._held: dict[str, Held] = {}
        """execution id -> the run, until its outcome is written. Changed on the event loop only,
        under ``_held_lock``, which the heartbeat thread takes to snapshot it."""
        self._held_lock = threading.Lock()
        self._claimed: dict[str, int] = {}
        """execution id -> fencing token of runs a claim committed that the event loop has not
        started yet (it may be blocked by a task): the heartbeat renews them too. Changed under
        ``_held_lock``, from the claim's thread and the loop."""
        self._in_hand: set[str] = set()
        """Ids the queue handed out whose claim has not reached the store yet (the loop may be
        blocked by a task before it does): the watchdog requeues them. Under ``_held_lock``."""
        self._ahead = ClaimsAhead(
            store, self.owner, settings, clock, self._held_lock, self._held, self._start_confirmed
        )
        self._ready: deque[Held] = deque()
        """Runs started in the store waiting for a free slot: confirmed at their due time, or
        claimed beyond the free slots (``claim_prefetch``)."""
        self._ready_empty = asyncio.Event()
        self._confirmed_waiting = False
        """Runs confirmed at their due time wait in ``_ready``: a burst is starting."""
        self._recent_ends = RecentEnds()
        self._filling = False
        """A ``_fill`` is scheduled for this loop pass."""
        self._executing = 0
        """Tasks still running: what concurrency bounds. A finished run waiting for its outcome
        to be written holds no slot, so claiming overlaps with writing outcomes."""
        self._finished: list[Completion] = []
        self._finished_ready = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._claims = FailureStreak("claiming", log)
        self._flushes = FailureStreak("recording outcomes", log)
        self._async_executor = AsyncExecutor(clock)
        self._default_pool: Pool = settings.pool
        self._processes = ProcessExecutor(settings.concurrency, clock, nice=settings.process_nice)
        """Warmed as the worker starts if a task runs there (``run``), else never started."""
        self._pools: dict[Pool, Executor] = {
            "threads": ThreadExecutor(clock, on_abandon=self._count_abandoned),
            "processes": self._processes,
        }
        self._heartbeat = Heartbeat(
            store,
            self.owner,
            settings.lease_ttl,
            settings.heartbeat_interval,
            clock,
            due=self._leases_due,
            on_lost=self._leases_lost,
            renewed=self._leases_renewed,
        )
        self._per_task = TaskInstruments(self.metrics)
        self._watchdog = LoopWatchdog(
            settings.loop_stall_warning,
            self._describe_run,
            self._count_stall,
            self._hand_back_unstarted,
        )

    def _executor(self, task: Task) -> Executor:
        """Async tasks run on the loop; sync ones in the task's pool, else ``settings.pool``."""
        if task.is_async:
            return self._async_executor
        return self._pools[task.pool or self._default_pool]

    def _count_abandoned(self) -> None:
        self.stats.threads_abandoned += 1

    def _count_stall(self) -> None:
        self.stats.loop_stalls += 1
        self.metrics.loop_stalls.inc()

    def _describe_run(self, execution_id: str) -> str:
        """For the watchdog's log; called from its thread."""
        with self._held_lock:
            held = self._held.get(execution_id)
        return f"run {execution_id} (task {held.run.task if held else 'unknown'})"

    @property
    def inflight(self) -> int:
        return len(self._held)

    # --- claiming ---------------------------------------------------------------------------
    async def claim_once(self) -> int:
        """Claim what is due now, up to free capacity, and start it; returns how many started."""
        return (await self._claim(ahead=False))[1]

    async def _claim(self, ahead: bool = True) -> tuple[int, int, bool]:
        """``claim_once``; returns how many ids left the queue for good, how many runs started,
        and whether the queue handed out fewer ids than asked for (it had no more due: the
        claim loop is keeping up with what arrives, not working through a backlog).

        An id the queue hands out leaves it for good unless the store finds its run not due yet
        (it goes back, due later): started, or not startable (no longer queued, deferred behind
        a running predecessor, skipped). Ids that left mean the queue had due work and may have
        more, so the claim loop claims again at once instead of waiting for the queue.
        ``ahead``: also claim runs due within ``claim_ahead`` (the claim loop, whose worker
        confirms them at their time; never in burst mode, which runs only what is due)."""
        free = self._free_slots()
        if free <= 0:
            return 0, 0, False
        # Runs the limits held back took no place: ask for as many more (the store starts at
        # most `free`), so a tenant's burst gets its slots in few claims even when few are free.
        ask = min(free + self._held_back, self.settings.claim_batch)
        room = self._ahead.room() if ahead else 0
        try:
            if self._claim_thread is None:
                ids = await self._take_from(self.queue, ask, room)
            else:
                ids = await self._claim_thread.run(partial(self._take_from, ask=ask, room=room))
        except Exception:
            self._claims.failed("retrying with backoff")
            return 0, 0, False
        if not ids:
            self._claims.succeeded()
            return 0, 0, True
        granted_at = self.clock.monotonic()  # before the claim's commit, which its leases run from
        claiming = asyncio.ensure_future(asyncio.to_thread(self._claim_leases, ids, free, room))
        try:
            claim = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            await self._hold_unstarted(claiming)
            raise
        except Exception:
            self._claims.failed(f"handing {len(ids)} runs back to the queue, retrying with backoff")
            await self._hand_back(ids)
            return 0, 0, False
        self._claims.succeeded()
        self.metrics.claim_size.observe(len(ids))
        self._held_back = claim.held_back
        # before any other await: every started run is tracked
        early = [HeldAhead.of(r) for r in claim.started if r.execution.started_at is None]
        self._start([r for r in claim.started if r.execution.started_at is not None], granted_at)
        self._ahead.hold(early)
        if room:  # runs handed back that are not due yet: refused ahead (not due-now limits)
            now = self.clock.now()
            if sum(item.due_at > now for item in claim.not_due) > len(early):
                self._ahead.refuse(min((run.due_at for run in early), default=None))
        self._waiting_jobs |= claim.waiting_jobs
        if claim.not_due:
            await self._give_back(claim.not_due)
        return len(ids) - len(claim.not_due), len(claim.started), len(ids) < ask

    async def _take_from(self, queue: DelayQueue, ask: int, room: int) -> list[str]:
        """The ids of one claim, put in hand as the queue hands them out: ``ask`` due now, and
        if fewer were, up to ``room`` due within ``claim_ahead``. Runs on the claim thread once
        the worker runs (claim_thread.py), else on the event loop."""
        ids = self._take_in_hand(await queue.claim_due(ask))
        if len(ids) < ask and room:  # nothing more due now: take what falls due next
            more = min(room, self.settings.claim_batch - len(ids))
            try:
                ids += self._take_in_hand(
                    await queue.claim_due(more, ahead=self.settings.claim_ahead)
                )
            except Exception:
                if not ids:
                    raise
                log.warning("claiming runs due ahead failed; claiming the %d due now", len(ids))
        return ids

    async def _give_back(self, not_due: list[QueueItem]) -> None:
        """Runs the store found not due yet (or not to hold ahead) back to the queue. They stay
        in hand until then (``_claim_leases`` put them there), so a task blocking the loop
        before this enqueue is sent gets them requeued by the watchdog instead of held; those
        it requeued meanwhile are not sent (the dispatch queues them)."""
        with self._held_lock:
            items = [item for item in not_due if item.execution_id in self._in_hand]
        try:
            if items:
                await self.queue.enqueue(items)
        except Exception:
            log.exception(
                "handing %d runs not yet due back to the queue failed; the sweep will", len(items)
            )
        finally:
            with self._held_lock:
                self._in_hand.difference_update(item.execution_id for item in not_due)

    def _take_in_hand(self, ids: list[str]) -> list[str]:
        """Note ids the queue just handed out (before any other await), so that the watchdog
        can requeue them if a task blocks the loop before they reach the store's claim."""
        with self._held_lock:
            self._in_hand.update(ids)
        return ids

    def _claim_leases(self, ids: list[str], free: int, room: int) -> ClaimResult:
        """The store's claim, in a thread, of the ids still in hand (not requeued by the
        watchdog meanwhile). The heartbeat knows the leases it took from the commit on: a task
        blocking the event loop (``time.sleep`` in an ``async def``) until the loop can start
        them must not let them expire and be rescued elsewhere."""
        with self._held_lock:
            ids = [eid for eid in ids if eid in self._in_hand]
            self._in_hand.difference_update(ids)
        if not ids:
            return ClaimResult([], [])
        claim = self.store.execution_claim(
            ids,
            self.owner,
            self.settings.lease_ttl,
            self.settings.misfire_grace,
            self._limits,
            free,
            ahead=self.settings.claim_ahead if room else 0.0,
            max_ahead=room,
        )
        with self._held_lock:
            for r in claim.started:
                leases = self._claimed if r.execution.started_at is not None else self._ahead.leases
                leases[r.execution.id] = r.execution.fencing_token
            self._in_hand.update(item.execution_id for item in claim.not_due)  # _give_back's
        return claim

    async def _hand_back(self, ids: Sequence[str]) -> None:
        """Runs the queue handed out but the store could not start (it is unreachable): back to
        the queue, due now (their priority tier is not known here: the default one), so an
        outage does not drain the queue; if that fails too, the sweep finds them."""
        now = self.clock.now()
        try:
            await self.queue.enqueue([QueueItem(eid, now) for eid in ids])
        except Exception as exc:
            log.warning("handing %d runs back failed (%s); the sweep will", len(ids), exc)

    def _start(self, runs: Sequence[ClaimedRun], granted_at: float) -> None:
        """Hold and begin the runs a claim started, their leases granted from ``granted_at``."""
        for run in runs:
            for victim in run.replaced:
                self._cancel_local(victim, "replaced by a newer run (overlap=replace)")
        runs = self._still_claimed(runs)
        started = []
        for run in runs:
            if run.execution.id in self._held:  # lost its lease, then claimed again by us
                self._cancel_local(run.execution.id, "claimed again with a newer fencing token")
            started.append(Held(run, renewed_at=granted_at))
        with self._held_lock:
            self._held.update((held.run.execution.id, held) for held in started)
        self._ready.extend(started)  # those beyond the free slots (prefetched) wait there
        self._fill()

    def _begin(self, started: Sequence[Held]) -> None:
        """Make the asyncio tasks of held runs, each taking a slot."""
        for held in started:
            held.task = asyncio.create_task(
                self._run(held), name=f"{RUN_TASK_PREFIX}{held.run.execution.id}"
            )
            held.task.add_done_callback(self._run_done)
        self._executing += len(started)
        self.stats.started += len(started)
        self.metrics.runs_in_flight.set(len(self._held))
        now = self.clock.now()
        observe = self.metrics.start_delay.observe
        logging_starts = log.isEnabledFor(logging.INFO)  # no fields built for a line not written
        for held in started:
            ex = held.run.execution
            observe(max(0.0, (now - ex.due_at).total_seconds()))
            if logging_starts:
                log.info("execution started", extra=run_fields(ex, task=held.run.task))

    # --- runs claimed ahead ------------------------------------------------------------------
    def _start_confirmed(self, confirmed: list[Held]) -> None:
        """Start runs the store confirmed at their due time, as slots free."""
        self._confirmed_waiting = True
        self._ready.extend(confirmed)
        self._fill()

    def _fill(self) -> None:
        """Start runs waiting in ``_ready`` while slots are free."""
        self._filling = False
        batch: list[Held] = []
        while self._ready and self._executing + len(batch) < self.settings.concurrency:
            held = self._ready.popleft()
            if self._held.get(held.run.execution.id) is held:  # not handed back or fenced
                batch.append(held)
        if not self._ready:
            self._confirmed_waiting = False
            self._ready_empty.set()
        if batch:
            self._begin(batch)

    async def _hold_unstarted(self, claiming: asyncio.Future[ClaimResult]) -> None:
        """The worker is stopping in the middle of a claim, which commits all the same: hold what
        it started, without starting it, so that shutdown releases it."""
        while not claiming.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([claiming])
        if claiming.cancelled() or claiming.exception() is not None:
            return
        started = claiming.result().started
        unstarted = self._still_claimed([r for r in started if r.execution.started_at is not None])
        with self._held_lock:
            for run in started:  # claimed ahead: released as they were (no attempt began)
                eid = run.execution.id
                if self._ahead.leases.pop(eid, None) == run.execution.fencing_token:
                    unstarted.append(run)
            self._held.update((run.execution.id, Held(run)) for run in unstarted)

    def _still_claimed(self, runs: Sequence[ClaimedRun]) -> list[ClaimedRun]:
        """The runs of a claim's answer the watchdog did not hand back while the answer waited
        for the loop; they leave ``_claimed`` (the caller holds them from here on)."""
        with self._held_lock:
            return [
                run
                for run in runs
                if self._claimed.pop(run.execution.id, None) == run.execution.fencing_token
            ]

    def _hand_back_unstarted(self) -> None:
        """While a task blocks the event loop (called from the watchdog's thread): release the
        runs claimed that the loop has not begun, so they start elsewhere now instead of when
        the task lets go (the loop, once free, skips them: ``_still_claimed``, ``_run``). If the
        store cannot take them, they are no longer heartbeated and the reaper frees them. Ids
        the queue handed out that the claim has not taken to the store yet are requeued there
        (the loop, once free, does not claim them: ``_claim_leases``); if that fails, the sweep
        finds them."""
        if requeued := self._requeue_in_hand():
            log.warning(
                "event loop blocked: requeued %d runs handed out before it blocked", requeued
            )
        with self._held_lock:
            unstarted = self._claimed | self._ahead.leases
            self._claimed.clear()
            self._ahead.leases.clear()
            # runs with a task not begun yet, and confirmed runs waiting for a slot (no task)
            not_begun = [eid for eid, h in self._held.items() if not h.began]
            counted = 0
            for eid in not_begun:
                held = self._held.pop(eid)
                unstarted[eid] = held.token
                counted += held.task is not None
            in_flight = len(self._held)
        if not unstarted:
            return
        self.stats.started -= counted  # counted when their tasks were made
        self.metrics.runs_in_flight.set(in_flight)
        try:
            released = self.store.execution_release(self.owner, unstarted)
        except Exception as exc:
            log.warning("handing back %d unstarted runs failed (%s)", len(unstarted), exc)
            return
        self.stats.handed_back += released
        log.warning(
            "event loop blocked: handed back %d claimed runs it could not start, to start elsewhere",
            released,
        )

    def _requeue_in_hand(self) -> int:
        """Ids the queue handed out that no claim took to the store (the loop is blocked, or
        the worker stopped mid-claim): back to the store's dispatch; returns how many."""
        with self._held_lock:
            in_hand = sorted(self._in_hand)
            self._in_hand.clear()
        if not in_hand:
            return 0
        try:
            requeued = self.store.execution_requeue(in_hand)
        except Exception as exc:
            log.warning("requeueing %d runs in hand failed (%s); the sweep will", len(in_hand), exc)
            return 0
        self.stats.handed_back += requeued
        return requeued

    def _cancel_local(self, execution_id: str, why: str) -> None:
        """Stop the local run of an execution whose lease this worker no longer holds. A run
        that already finished is only forgotten: writing its outcome tells whether it counts."""
        with self._held_lock:
            held = self._held.pop(execution_id, None)
        self.metrics.runs_in_flight.set(len(self._held))
        if held is None or held.task is None or held.task.done():
            return
        log.warning(
            "execution %s: stopping local run, %s",
            execution_id,
            why,
            extra=run_fields(held.run.execution),
        )
        self.stats.fenced += 1
        self.metrics.fenced.inc()
        held.task.cancel()

    def _run_done(self, _: asyncio.Task[None]) -> None:
        self._executing -= 1
        self._recent_ends.ended()
        if self._ready and not self._filling:  # once per loop pass for the runs ending in it
            self._filling = True
            asyncio.get_running_loop().call_soon(self._fill)
        self._slot_free.set()

    # --- running ----------------------------------------------------------------------------
    async def _run(self, held: Held) -> None:
        with self._held_lock:
            if self._held.get(held.run.execution.id) is not held:
                return  # handed back while a task blocked the loop, or fenced, before it began
            held.began = True
        try:
            completion = await run_attempt(
                held.run, self.registry, self._executor, self._per_task, self.clock
            )
        except asyncio.CancelledError:
            return  # fenced, replaced, or the worker is stopping (it releases the lease itself)
        if self._held.get(held.run.execution.id) is not held:
            return  # fenced while running: the result is stale and must not be written
        self._finished.append(completion)
        self._finished_ready.set()

    async def flush(self) -> bool:
        """Write the outcomes gathered so far, ``OUTCOMES_PER_WRITE`` to a store call. False if a
        write failed: its outcomes and those after them are kept for the next flush, and their
        runs stay held (heartbeated)."""
        batch, self._finished = self._finished, []
        self._finished_ready.clear()
        for first in range(0, len(batch), OUTCOMES_PER_WRITE):
            written = batch[first : first + OUTCOMES_PER_WRITE]
            try:
                accepted = set(await asyncio.to_thread(self.store.execution_finish_many, written))
            except Exception:
                self._finished = batch[first:] + self._finished
                self._finished_ready.set()
                self._flushes.failed(f"{len(batch) - first} outcomes kept for the next try")
                return False
            self._flushes.succeeded()
            self._written(written, accepted)
        return True

    def _written(self, batch: list[Completion], accepted: set[str]) -> None:
        """The outcomes of ``batch`` are stored (``accepted``) or refused: release their runs."""
        runs: dict[str, ClaimedRun] = {}
        with self._held_lock:  # written (or refused): no longer held, so no longer heartbeated
            for done in batch:
                held = self._held.get(done.execution_id)
                if held is not None and held.token == done.fencing_token:
                    runs[done.execution_id] = held.run
                    del self._held[done.execution_id]
        self.metrics.runs_in_flight.set(len(self._held))
        ended_jobs = {run.execution.job_id for run in runs.values()}
        if self._waiting_jobs & ended_jobs:
            # runs of these jobs waited for the runs just written, and are due now: dispatch them
            self._waiting_jobs -= ended_jobs
            if self.on_runs_woken is not None:
                self.on_runs_woken()
        report_outcomes(batch, runs, accepted, self.stats, self.metrics, self._per_task)

    # --- leases -----------------------------------------------------------------------------
    def _leases_due(self, renewed_before: float) -> HeldLeases:
        """The leases the heartbeat renews now: those granted or last renewed at or before
        ``renewed_before``, and those of runs a claim took that are not held yet (a moment,
        unless a task blocks the loop). Called from the heartbeat's thread."""
        with self._held_lock:
            due = {
                eid: held.token
                for eid, held in self._held.items()
                if held.renewed_at <= renewed_before
            }
            return due | self._claimed

    def _leases_renewed(self, kept: HeldLeases, at: float) -> None:
        """The heartbeat renewed these leases from ``at`` on (called from its thread)."""
        with self._held_lock:
            for eid, token in kept.items():
                held = self._held.get(eid)
                if held is not None and held.token == token:
                    held.renewed_at = at

    def _leases_lost(self, lost: HeldLeases) -> None:
        """Stop the runs whose lease the heartbeat found gone (on the event loop)."""
        for eid, token in lost.items():
            held = self._held.get(eid)
            if held is not None and held.token == token:
                self._cancel_local(eid, "its lease was taken away (fenced)")

    async def heartbeat(self) -> None:
        """Renew the leases that are due, in one store call, and stop the runs whose lease was
        lost. The heartbeat thread does this several times per heartbeat_interval."""
        self._leases_lost(await asyncio.to_thread(self._heartbeat.beat))

    # --- loops ------------------------------------------------------------------------------
    async def run_until_idle(self) -> None:
        """Burst mode: run everything due now (and the retries that become due meanwhile
        without the clock moving), then return. For tests and one-off drains."""
        while True:
            started = await self.claim_once()
            self._fill()  # runs claimed beyond the free slots, if their slots freed meanwhile
            running = [h.task for h in self._held.values() if h.task and not h.task.done()]
            if running:
                await asyncio.wait(running)
            await self.flush()
            if not started and not running and not self._ready:
                return

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run until ``stop`` is set, then drain (see ``shutdown``)."""
        self._stopping.clear()
        self._heartbeat.start(asyncio.get_running_loop())
        self._watchdog.start(asyncio.get_running_loop())
        if self._open_claim_queue is not None:
            self._claim_thread = ClaimThread(self._open_claim_queue)
            self._claim_thread.start()
        self._loops = [
            asyncio.create_task(self._supervised("claim", self._claim_loop), name="onbeat-claim"),
            asyncio.create_task(self._supervised("flush", self._flush_loop), name="onbeat-flush"),
            asyncio.create_task(
                self._supervised("ahead", partial(self._ahead.loop, self._stopping)),
                name="onbeat-ahead",
            ),
        ]
        if any(self._executor(task) is self._processes for task in self.registry):
            self._loops.append(asyncio.create_task(self._processes.warm(), name="onbeat-warm"))
        try:
            await stop.wait()
        finally:
            await self.shutdown()

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run one of the worker's loops until the worker stops. If it fails it is logged and
        restarted (at once; after RESTART_BACKOFF if it failed within that long before), so the
        worker is never left heartbeating with a dead loop."""
        last_failure = -math.inf
        while not self._stopping.is_set():
            try:
                await loop()
            except Exception:
                self.stats.loop_restarts += 1
                log.exception("worker %s loop failed; restarting it", name)
                now = self.clock.monotonic()
                if now - last_failure < RESTART_BACKOFF:
                    await sleep_or_wake(self.clock, RESTART_BACKOFF, self._stopping)
                last_failure = now

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            consumed, _, drained = await self._claim()
            if consumed:  # the queue had due work: it may have more, claim again soon
                await self._gather_free_slots()
                if drained and consumed > 1:  # runs arriving in a stream: let more arrive
                    await asyncio.sleep(ARRIVAL_GATHER)
                continue
            if self._claims.count:  # the queue or the store is failing
                await sleep_or_wake(self.clock, self._claims.backoff, self._stopping)
                continue
            if self._free_slots() <= 0:
                self._slot_free.clear()
                await sleep_or_wake(self.clock, 1.0, self._slot_free, self._stopping)
                await self._gather_free_slots()  # not a claim for the first slot that frees
            else:
                ahead = self.settings.claim_ahead if self._ahead.room() else 0.0
                await self.queue.wait(self.settings.poll_interval, ahead=ahead)

    def _capacity(self) -> int:
        """Runs this worker may hold started: its slots, and the runs they will likely free
        within ``claim_prefetch`` (at most a claim batch of them). None beyond its slots while
        a fleet limit may apply: its settings set one, or its last claim held runs back under
        one. A run waiting in this worker counts in flight, and would keep a worker with a free
        slot from starting a run under the same cap."""
        if self._held_back or self._limits != NO_LIMITS:
            return self.settings.concurrency
        return self.settings.concurrency + min(
            self._recent_ends.expected(self.settings.claim_prefetch), self.settings.claim_batch
        )

    def _free_slots(self) -> int:
        """Runs the next claim may start: the capacity left by the runs executing or waiting
        for a slot."""
        return self._capacity() - self._executing - len(self._ready)

    async def _gather_free_slots(self) -> None:
        """With more due in the queue and fewer than half a claim batch of slots free, wait until
        that many are (``CLAIM_GATHER`` at most) instead of claiming for each slot as it frees:
        a claim costs a queue round trip and a store transaction however few runs it takes, and
        a full worker with short runs claimed 34 runs per claim at concurrency 64 (W1 on Redis:
        335 us of fleet CPU per run; with this wait, 65 runs per claim and 250 us). A run
        waiting for a slot waits at most ``CLAIM_GATHER`` longer; a worker with half its slots
        free claims at once. Real time, not the injected clock: it only batches the claims."""
        want = max(1, min(self._capacity(), self.settings.claim_batch) // 2)
        if self._free_slots() >= want:
            return
        deadline = asyncio.get_running_loop().time() + CLAIM_GATHER
        while self._free_slots() < want and not self._stopping.is_set():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            self._slot_free.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_free.wait(), remaining)

    async def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            await sleep_or_wake(self.clock, 1.0, self._finished_ready, self._stopping)
            await asyncio.sleep(OUTCOME_GATHER)
            if self._confirmed_waiting:  # a burst is starting: its starts first, then outcomes
                self._ready_empty.clear()
                await sleep_or_wake(
                    self.clock, BURST_FLUSH_DELAY, self._ready_empty, self._stopping
                )
            if not await self.flush():  # the store is failing
                await sleep_or_wake(self.clock, self._flushes.backoff, self._stopping)

    async def shutdown(self) -> None:
        """Stop claiming (a claim in progress completes and what it started is held, unstarted);
        give in-flight runs ``shutdown_grace`` seconds, write their outcomes, then release the
        rest so they run again at once elsewhere instead of waiting for their leases to expire."""
        self._stopping.set()
        for loop_task in self._loops:
            if loop_task.get_name() in ("onbeat-claim", "onbeat-ahead", "onbeat-warm"):  # in I/O
                loop_task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self._claim_thread is not None:  # its claim under way ends first, its ids in hand
            await self._claim_thread.stop()
            self._claim_thread = None
        await asyncio.to_thread(self._requeue_in_hand)  # a claim stopped before the store's
        with self._held_lock:  # claimed ahead, never confirmed: released with the rest
            ahead = self._ahead.take_all()
        self._ready.clear()  # held (no task): released below
        running = [h.task for h in self._held.values() if h.task and not h.task.done()]
        if running:
            log.info("waiting up to %ss for %d runs", self.settings.shutdown_grace, len(running))
            await asyncio.wait(running, timeout=self.settings.shutdown_grace)
        await self.flush()
        with self._held_lock:
            leftover = dict(self._held)  # cleared, not replaced: the runs ahead share it
            self._held.clear()
        self.metrics.runs_in_flight.set(0)
        for held in leftover.values():
            if held.task is not None:
                held.task.cancel()
        if leftover or ahead:
            self.stats.released += await asyncio.to_thread(
                self.store.execution_release,
                self.owner,
                {eid: held.token for eid, held in leftover.items()} | ahead,
            )
            log.info("released %d unfinished runs", len(leftover) + len(ahead))
        await asyncio.to_thread(self._heartbeat.stop)
        self._watchdog.stop()
        await self._async_executor.close()
        for pool in self._pools.values():
            await pool.close()
