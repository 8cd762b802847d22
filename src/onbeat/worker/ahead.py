"""Runs a worker claimed ahead of their due time (``claim_ahead``): held, not started, until it,
then confirmed in one store call, and those confirmed handed to the worker to start, so that a
burst starts at the pace of one write instead of the claims' (``Store.execution_claim``,
``Store.execution_confirm``).

A held run's lease is not heartbeated: it ends shortly after its due time
(``AHEAD_LEASE_GRACE``), so that the runs of a worker that died, or whose loop is blocked at their
instant, are freed then. What the store refuses to confirm (cancelled, edited away, paused, lost
before its time) is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from onbeat.clock import Clock
from onbeat.scheduler import sleep_or_wake
from onbeat.settings import Settings
from onbeat.store.base import ClaimedRun, Store
from onbeat.worker.held import Held
from onbeat.worker.outage import FailureStreak

__all__ = ["ClaimsAhead", "HeldAhead"]

REFUSED_MARGIN = 0.05
"""Seconds after the first run a refused claim held falls due before claiming ahead again: the
time for that run to end, so the next run of its job is no longer refused."""

log = logging.getLogger("onbeat.worker")


@dataclass(frozen=True, slots=True)
class HeldAhead:
    """A run claimed ahead of its due time, and the run it becomes once confirmed, built when
    it is claimed: at the instant of a burst every microsecond of Python a run costs delays the
    last start (``bench/burst_start.py``)."""

    claimed: ClaimedRun
    confirmed: Held
    """The run as the confirm makes it: the next fencing token and attempt (the confirm's
    statement sets exactly these). Its ``started_at`` is its due time, which only marks it as
    started here; the store records the confirm's own time."""

    @staticmethod
    def of(run: ClaimedRun) -> HeldAhead:
        ex = run.execution
        confirmed = dataclasses.replace(
            ex, fencing_token=ex.fencing_token + 1, attempt=ex.attempt + 1, started_at=ex.due_at
        )
        return HeldAhead(run, Held(dataclasses.replace(run, execution=confirmed)))

    @property
    def id(self) -> str:
        return self.claimed.execution.id

    @property
    def token(self) -> int:
        return self.claimed.execution.fencing_token

    @property
    def due_at(self) -> datetime:
        return self.claimed.execution.due_at


class ClaimsAhead:
    """The runs one worker holds ahead. ``runs`` belongs to the event loop; ``leases`` (id -> the
    claim's token) is shared with the claim's thread, which adds, and the watchdog's, which hands
    back, under the worker's ``lock``. A confirmed run moves from ``leases`` to the worker's
    ``held`` under that lock, so the heartbeat and the watchdog find every run in one of them."""

    def __init__(
        self,
        store: Store,
        owner: str,
        settings: Settings,
        clock: Clock,
        lock: threading.Lock,
        held: dict[str, Held],
        start: Callable[[list[Held]], None],
    ) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings
        self.clock = clock
        self._lock = lock
        self._held = held
        self._start = start
        self.runs: dict[str, HeldAhead] = {}
        """Claimed ahead, not confirmed yet. Event loop only."""
        self._by_due: dict[datetime, list[str]] = {}
        """The ids of ``runs`` by due time, and ``_due_times`` those times as a heap: the loop
        finds the next due time, and the runs due, without reading every run held (up to
        ``claim_ahead_max``, 50,000 in W3 at 100,000 cron jobs, which share one due time)."""
        self._due_times: list[datetime] = []
        self.leases: dict[str, int] = {}
        """id -> token of the runs claimed ahead and not confirmed, under the worker's lock."""
        self._refused_until = -math.inf
        """Monotonic time until which the worker claims nothing ahead (``refuse``)."""
        self._added = asyncio.Event()
        self._confirms = FailureStreak("confirming runs claimed ahead", log)

    def room(self) -> int:
        """How many more runs the worker may claim ahead of their due time now."""
        if self.settings.claim_ahead <= 0 or self.clock.monotonic() < self._refused_until:
            return 0
        return max(0, self.settings.claim_ahead_max - len(self.runs))

    def refuse(self, first_held: datetime | None) -> None:
        """The store refused most of a claim ahead (their job's earlier run is pending, a limit
        applies): those runs stay refused until what held them back ends, and the queue hands
        them out first (they are due first), so claiming ahead again at each poll only took
        them out and put them back (two workers and 100 every-second cron jobs: 4,100 runs a
        second each). Claim nothing ahead until just after the first run this claim did hold
        falls due (once it ends, the next run of its job can be held: every-second jobs keep
        their runs held ahead), or for a quarter of ``claim_ahead`` if it held none; what can
        be held behind the refused runs is still claimed with most of the horizon to go."""
        wait = self.settings.claim_ahead / 4
        if first_held is not None:
            until_due = (first_held - self.clock.now()).total_seconds()
            wait = min(wait, max(0.0, until_due) + REFUSED_MARGIN)
        self._refused_until = self.clock.monotonic() + wait

    def hold(self, runs: Sequence[HeldAhead]) -> None:
        """Keep runs claimed ahead (their leases already in ``leases``) until their due time."""
        if runs:
            for run in runs:
                self.runs[run.id] = run
                if (ids := self._by_due.get(run.due_at)) is not None:
                    ids.append(run.id)
                else:
                    self._by_due[run.due_at] = [run.id]
                    heapq.heappush(self._due_times, run.due_at)
            self._added.set()

    async def loop(self, stopping: asyncio.Event) -> None:
        """At each due time of the runs held, confirm those due and start them."""
        while not stopping.is_set():
            self._added.clear()
            if not self._due_times:
                await sleep_or_wake(self.clock, 1.0, self._added, stopping)
                continue
            wait = (self._due_times[0] - self.clock.now()).total_seconds()
            if wait > 0:
                await sleep_or_wake(self.clock, wait, self._added, stopping)
                continue
            if not await self.confirm_due():
                await sleep_or_wake(self.clock, self._confirms.backoff, stopping)

    async def confirm_due(self) -> bool:
        """Confirm the runs held that are due, start those confirmed (as slots free) and release
        the others; False if the store failed (they stay held, to try again)."""
        now = self.clock.now()
        due: list[HeldAhead] = []
        while self._due_times and self._due_times[0] <= now:
            for eid in self._by_due.pop(heapq.heappop(self._due_times)):
                run = self.runs.get(eid)
                if run is not None and run.due_at <= now:  # else gone, or held again for later
                    del self.runs[eid]
                    due.append(run)
        with self._lock:  # the watchdog may have handed some back meanwhile
            held = {run.id: run.token for run in due if self.leases.get(run.id) == run.token}
        if not held:
            return True
        granted_at = self.clock.monotonic()  # before the confirm's commit, which leases them
        confirming = asyncio.ensure_future(
            asyncio.to_thread(
                self.store.execution_confirm, self.owner, held, self.settings.lease_ttl
            )
        )
        try:
            tokens = await asyncio.shield(confirming)
        except asyncio.CancelledError:  # stopping: the confirm commits all the same
            while not confirming.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([confirming])
            confirmed = {} if confirming.exception() else confirming.result()
            # held, not started: shutdown releases them
            self._track_confirmed(due, confirmed, granted_at)
            self.hold([run for run in due if run.id not in confirmed])
            raise
        except Exception:
            self._confirms.failed(f"{len(held)} runs kept for the next try")
            self.hold([run for run in due if run.id in held])
            return False
        self._confirms.succeeded()
        self._start(self._track_confirmed(due, tokens, granted_at))
        refused = {eid: token for eid, token in held.items() if eid not in tokens}
        if refused:  # cancelled, edited away, paused or lost before their time
            with self._lock:
                for eid in refused:
                    self.leases.pop(eid, None)
            try:
                await asyncio.to_thread(self.store.execution_release, self.owner, refused)
            except Exception as exc:
                log.warning("releasing %d runs not confirmed failed (%s)", len(refused), exc)
        return True

    def _track_confirmed(
        self, due: Sequence[HeldAhead], tokens: dict[str, int], granted_at: float
    ) -> list[Held]:
        """Move the runs the store confirmed into the worker's ``held``, under their new tokens
        and leases granted from ``granted_at`` (the heartbeat renews them from now on, as any
        started run's); returns them. Every one of them: one the watchdog handed back while the
        confirm ran (a task blocking the loop) is this worker's all the same, since the store
        refused that release, made under the token before the confirm; untracked, it would stay
        running with no holder until its lease ran out."""
        confirmed = []
        with self._lock:
            for run in due:
                token = tokens.get(run.id)
                if token is not None:
                    self.leases.pop(run.id, None)
                    held = run.confirmed
                    if held.token != token:  # not the confirm this worker knows: its token wins
                        execution = dataclasses.replace(held.run.execution, fencing_token=token)
                        held = Held(dataclasses.replace(held.run, execution=execution))
                    held.renewed_at = granted_at
                    self._held[run.id] = held
                    confirmed.append(held)
        return confirmed

    def take_all(self) -> dict[str, int]:
        """Stop holding every run not confirmed (the worker is stopping); returns the leases it
        still has of them (id -> token), for the worker to release. Call under the lock."""
        taken = {
            eid: token
            for eid, run in self.runs.items()
            if (token := self.leases.pop(eid, None)) == run.token
        }
        self.runs.clear()
        self._by_due.clear()
        self._due_times.clear()
        return taken
