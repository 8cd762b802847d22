"""Store contract, the whole run protocol as a deterministic simulation with crashes
(:class:`ProtocolSimulationMachine`, RELIABILITY.md "Complementary fast layer").

Two schedulers (acquire shards, dispatch, sweep, reap) and two workers (pop the delay queue, claim,
heartbeat, finish, release) drive cron jobs on a real store and a real ``MemoryDelayQueue`` while
Hypothesis interleaves their steps with faults: a worker crash (it forgets what it popped and
holds), claims ahead of the due time confirmed (or refused) at it, a lost delay queue (Redis
flushed), a scheduler crash (its leases lapse and the other
takes over; its stale dispatch must be fenced), zombie writes with old tokens, and clock jumps past
the run and shard lease TTLs. The FakeClock is the only time source, so a failure replays from
Hypothesis's seed. Invariants after every step: one live fencing token per run, no stale write
accepted, one record per fire time; at teardown, after a drain with healthy processes, every run
due by then is final.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import Coroutine, Iterable
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from onbeat.model import (
    AttemptOutcome,
    Execution,
    ExecutionStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
)
from onbeat.queue.base import QueueItem
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.store.base import Completion, DispatchParams, ShardLeases
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    GRACE,
    OTHER_SCHEDULER,
    OTHER_WORKER,
    RUN_TTL,
    SCHEDULER,
    SHARD_TTL,
    WINDOW,
    WORKER,
    StoreFactory,
    _attempt_of,
    _cron,
    _ids,
)

__all__ = ["ProtocolSimulationContract", "ProtocolSimulationMachine"]

_T = TypeVar("_T")


def _leased(e: Execution) -> bool:
    """Under a worker's lease: running, or held ahead (it reads queued and names its holder)."""
    return e.status is ExecutionStatus.RUNNING or (
        e.status is ExecutionStatus.QUEUED and e.lease_owner is not None
    )


class ProtocolSimulationContract:
    """The protocol simulation, run on fresh stores of the backend."""

    @pytest.mark.timeout(300)  # 60 examples of 50 steps: 100-160 s on PostgreSQL on a busy box
    def test_protocol__simulation_with_crashes(self, store_factory: StoreFactory) -> None:
        class Machine(ProtocolSimulationMachine):
            open_store = store_factory

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=60,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


_SCHEDULERS = (SCHEDULER, OTHER_SCHEDULER)
_WORKERS = (WORKER, OTHER_WORKER)
_EVERY_2S = "*/2 * * * * *"
_JOBS = 2
_RETRY = RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_cap=1.0)
_POP = 4
"""Ids a worker takes from the queue at a time."""
_AHEAD = 2.0
"""Seconds ahead of their due time that ``worker_claim_ahead`` claims runs."""
_ADVANCES = [0.5, 2.0, 5.0, RUN_TTL + 1.0, SHARD_TTL + 1.0, GRACE + 5.0]
"""Clock jumps: within a lease, past a run lease, past a shard lease, past the misfire grace."""


class ProtocolSimulationMachine(RuleBasedStateMachine):
    """The claim / heartbeat / finish / reap / sweep / dispatch protocol under random crashes.

    Subclass it with ``open_store`` set to a :data:`StoreFactory`; each example gets a fresh store.
    What each process keeps in memory is modelled explicitly (and lost when it crashes); the store
    and the queue are the real ones.
    """

    open_store: ClassVar[StoreFactory]

    def __init__(self) -> None:
        super().__init__()
        self._exit = ExitStack()
        directory = Path(self._exit.enter_context(tempfile.TemporaryDirectory()))
        self.clock = FakeClock()
        self.store = self._exit.enter_context(type(self).open_store(directory, self.clock))()
        self.loop = asyncio.new_event_loop()
        self._exit.callback(self.loop.close)
        self.queue = MemoryDelayQueue(self.clock)
        self.started_at = self.clock.now()
        self.job_ids = [
            self.store.job_create(
                _cron(
                    _EVERY_2S,
                    retry=_RETRY,
                    overlap=OverlapPolicy.ALLOW,
                    misfire=MisfirePolicy.RUN_ALL,
                )
            ).job.id
            for _ in range(_JOBS)
        ]
        self.issued: dict[str, list[int]] = {}
        """Fencing tokens claims handed out, per run, in order."""
        self.leases: dict[str, ShardLeases | None] = dict.fromkeys(_SCHEDULERS)
        """What each scheduler believes it holds (possibly stale)."""
        self.holder: dict[int, tuple[str, int, datetime]] = {}
        """shard -> (owner, epoch, lease expiry) as the last acquires left it."""
        self.held: dict[str, dict[str, int]] = {w: {} for w in _WORKERS}
        """What each worker believes it runs (possibly stale)."""
        self.ahead: dict[str, dict[str, tuple[int, datetime]]] = {w: {} for w in _WORKERS}
        """What each worker believes it holds claimed ahead: id -> (token, due time)."""
        self.zombies: dict[str, dict[str, int]] = {w: {} for w in _WORKERS}
        """What crashed workers held when they went down, reported if they come back."""

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coroutine)

    def _enqueue(self, executions: Iterable[Execution | QueueItem]) -> None:
        items = [
            e if isinstance(e, QueueItem) else QueueItem(e.id, e.due_at, e.priority, e.shard)
            for e in executions
        ]
        if items:
            self._run(self.queue.enqueue(items))

    def _all(self) -> dict[str, Execution]:
        out: dict[str, Execution] = {}
        for job_id in self.job_ids:
            for e in self.store.execution_list(job_id, limit=10_000):
                out[e.id] = e
        return out

    def _some(self, ids: Iterable[str]) -> dict[str, Execution]:
        out: dict[str, Execution] = {}
        for eid in ids:
            e = self.store.execution_get(eid)
            if e is not None:
                out[eid] = e
        return out

    def _valid_shards(self, owner: str, leases: ShardLeases) -> tuple[set[int], set[int]]:
        """(shards ``leases`` still hold, shards they surely lost): a lease at its exact expiry
        instant is in neither."""
        now = self.clock.now()
        valid: set[int] = set()
        lost: set[int] = set()
        for shard, epoch in leases.epochs.items():
            holder = self.holder.get(shard)
            if holder is None or holder[:2] != (owner, epoch) or holder[2] < now:
                lost.add(shard)
            elif holder[2] > now:
                valid.add(shard)
        return valid, lost

    # -- schedulers -------------------------------------------------------------------------

    @initialize()
    def first_scheduler_starts(self) -> None:
        self.scheduler_tick(SCHEDULER)

    @rule(owner=st.sampled_from(_SCHEDULERS))
    def scheduler_tick(self, owner: str) -> None:
        """Renew or take shards, sweep every shard just taken over, dispatch."""
        now = self.clock.now()
        leases = self.store.shard_acquire(owner, SHARD_TTL)
        for shard, epoch in leases.epochs.items():
            was = self.holder.get(shard)
            if was is not None and was[0] != owner:
                assert was[2] <= now, f"shard {shard} taken from a live lease"
                assert epoch > was[1], f"shard {shard} taken without a new epoch"
            self.holder[shard] = (owner, epoch, now + timedelta(seconds=SHARD_TTL))
        for shard in [s for s, h in self.holder.items() if h[0] == owner]:
            if shard not in leases.epochs:
                del self.holder[shard]  # given up above its fair share
        self.leases[owner] = leases
        if leases.acquired:
            self._sweep(owner, leases, sorted(leases.acquired), None)
        self._dispatch(owner, leases)

    @rule(owner=st.sampled_from(_SCHEDULERS))
    def scheduler_stale_dispatch(self, owner: str) -> None:
        """A scheduler that was paused or lost its shards dispatches with the leases it last had."""
        leases = self.leases[owner]
        if leases is not None:
            self._dispatch(owner, leases)

    def _dispatch(self, owner: str, leases: ShardLeases) -> None:
        valid, lost = self._valid_shards(owner, leases)
        before = self._all()
        horizon = self.clock.now() + timedelta(seconds=WINDOW)
        items = self.store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 1000))
        after = self._all()
        assert {i.shard for i in items} <= set(leases.epochs) - lost, "a fenced dispatch queued"
        for eid, e in after.items():
            if e.shard in lost:
                assert before.get(eid) == e, "a fenced dispatch wrote"
        for eid, e in before.items():
            if e.shard in valid and e.status is ExecutionStatus.SCHEDULED and e.due_at <= horizon:
                assert after[eid].status is not ExecutionStatus.SCHEDULED, "a due run not queued"
        self._enqueue(items)

    @rule(owner=st.sampled_from(_SCHEDULERS))
    def scheduler_repair(self, owner: str) -> None:
        """The reconciler with the leases it last had: every cron job always has its next run
        planned, so it finds nothing to repair, and with stale leases it writes nothing."""
        leases = self.leases[owner]
        if leases is None:
            return
        _, lost = self._valid_shards(owner, leases)
        before = self._all()
        repaired, _ = self.store.job_repair_next_runs(leases, None, 100)
        assert repaired == [], f"cron jobs without their next run planned: {repaired}"
        after = self._all()
        for eid, e in after.items():
            if e.shard in lost:
                assert before.get(eid) == e, "a fenced repair wrote"

    @rule(owner=st.sampled_from(_SCHEDULERS), overdue_by=st.sampled_from([None, 0.0, 5.0]))
    def scheduler_sweep(self, owner: str, overdue_by: float | None) -> None:
        leases = self.leases[owner]
        if leases is not None:
            self._sweep(owner, leases, sorted(leases.epochs), overdue_by)

    def _sweep(
        self, owner: str, leases: ShardLeases, shards: list[int], overdue_by: float | None
    ) -> None:
        """Re-enqueue the queued runs the queue lacks; then the queue holds every such run."""
        valid, _ = self._valid_shards(owner, leases)
        page = self.store.execution_sweep(leases, shards, overdue_by, 10_000)
        assert page.resume is None
        now = self.clock.now()
        for item in page.items:
            e = self.store.execution_get(item.execution_id)
            assert e is not None and e.status is ExecutionStatus.QUEUED, item
            assert item.shard in shards
        lacking = set(self._run(self.queue.missing([i.execution_id for i in page.items])))
        self._enqueue(i for i in page.items if i.execution_id in lacking)
        cutoff = None if overdue_by is None else now - timedelta(seconds=overdue_by)
        overdue = [
            eid
            for eid, e in self._all().items()
            if e.status is ExecutionStatus.QUEUED
            and e.lease_owner is None  # not held ahead by a worker
            and e.shard in valid
            and e.shard in shards
            and (cutoff is None or e.due_at < cutoff)
        ]
        assert self._run(self.queue.missing(overdue)) == [], "the sweep left a queued run out"

    @rule(limit=st.sampled_from([1, 1000]))
    def reap(self, limit: int = 1000) -> None:
        """Any scheduler reaps expired leases (a page of ``limit``) and enqueues what comes back."""
        before = self._all()
        now = self.clock.now()
        reaped = self.store.execution_reap(limit)
        running = {eid: e for eid, e in before.items() if _leased(e)}
        expired = {
            eid
            for eid, e in running.items()
            if e.lease_expires_at is not None and e.lease_expires_at < now
        }
        due = {
            eid
            for eid, e in running.items()
            if e.lease_expires_at is not None and e.lease_expires_at <= now
        }
        assert _ids(reaped) <= due, "reaped a live lease"
        assert len(reaped) == limit or expired <= _ids(reaped), "left an expired lease"
        for e in reaped:
            was = before[e.id]
            if was.started_at is None:  # held ahead, never begun: queued again, no attempt lost
                assert (e.status, e.attempt, e.attempts) == (
                    ExecutionStatus.QUEUED,
                    was.attempt,
                    was.attempts,
                )
                continue
            assert e.status in (ExecutionStatus.QUEUED, ExecutionStatus.FAILED)
            assert _attempt_of(e, was.fencing_token) is AttemptOutcome.LOST
        self._enqueue(e for e in reaped if e.status is ExecutionStatus.QUEUED)

    @rule(owner=st.sampled_from(_SCHEDULERS), graceful=st.booleans())
    def scheduler_down(self, owner: str, graceful: bool) -> None:
        """A stop releases its shards; a crash forgets its leases, which lapse after the TTL."""
        self.leases[owner] = None
        if graceful:
            self.store.shard_release(owner)
            for shard in [s for s, h in self.holder.items() if h[0] == owner]:
                del self.holder[shard]

    # -- workers ----------------------------------------------------------------------------

    @rule(worker=st.sampled_from(_WORKERS), crash=st.integers(0, 3))
    def worker_claim(self, worker: str, crash: int) -> None:
        """Pop due ids from the queue and claim them; re-enqueue what is not due. A crash between
        pop and claim (``crash == 3``) loses the popped ids from the queue: only the sweep brings
        them back."""
        ids = self._run(self.queue.claim_due(_POP))
        if crash == 3:
            self.worker_down(worker, graceful=False)
            return
        if ids:
            self._claim(worker, ids)

    @rule(worker=st.sampled_from(_WORKERS))
    def worker_claim_ahead(self, worker: str) -> None:
        """Pop ids due within ``_AHEAD`` and claim them, ahead where the store allows."""
        ids = self._run(self.queue.claim_due(_POP, ahead=_AHEAD))
        if ids:
            self._claim(worker, ids, ahead=_AHEAD)

    def _claim(self, worker: str, ids: list[str], ahead: float = 0.0) -> None:
        before = {eid: self.store.execution_get(eid) for eid in ids}
        now = self.clock.now()
        result = self.store.execution_claim(
            ids, worker, RUN_TTL, GRACE, ahead=ahead, max_ahead=_POP if ahead else 0
        )
        for run in result.started:
            eid, token = run.execution.id, run.execution.fencing_token
            was = before[eid]
            assert was is not None and was.status is ExecutionStatus.QUEUED
            if run.execution.started_at is None:  # claimed ahead: token kept until the confirm
                assert now < was.due_at <= now + timedelta(seconds=ahead)
                assert token == was.fencing_token
                self.ahead[worker][eid] = (token, was.due_at)
                continue
            assert was.due_at <= now
            assert all(token > old for old in self.issued.get(eid, [])), "a token was reused"
            self.issued.setdefault(eid, []).append(token)
            self.held[worker][eid] = token
        for item in result.not_due:
            was = before[item.execution_id]
            assert was is not None and was.status is ExecutionStatus.QUEUED
            assert was.due_at > now
        self._enqueue(result.not_due)

    @rule(worker=st.sampled_from(_WORKERS))
    def worker_confirm(self, worker: str) -> None:
        """At their due time, confirm the runs held ahead; release what the store refused."""
        now = self.clock.now()
        due = {eid: t for eid, (t, at) in self.ahead[worker].items() if at <= now}
        if not due:
            return
        before = self._some(due)
        tokens = self.store.execution_confirm(worker, due, RUN_TTL)
        for eid, token in due.items():
            del self.ahead[worker][eid]
            was = before.get(eid)
            holds = (
                was is not None
                and was.status is ExecutionStatus.QUEUED  # a run held ahead reads queued
                and was.started_at is None
                and was.lease_owner == worker
                and was.fencing_token == token
            )
            if eid in tokens:
                assert holds, "confirmed a run this worker did not hold ahead"
                assert all(tokens[eid] > old for old in self.issued.get(eid, []))
                self.issued.setdefault(eid, []).append(tokens[eid])
                self.held[worker][eid] = tokens[eid]
            elif holds:  # refused although held (a job paused): it gives it back
                self.store.execution_release(worker, {eid: token})

    def _held_pairs(self, worker: str) -> dict[str, int]:
        """Every lease the worker believes it holds, started or claimed ahead."""
        return self.held[worker] | {eid: t for eid, (t, _) in self.ahead[worker].items()}

    @rule(worker=st.sampled_from(_WORKERS))
    def worker_heartbeat(self, worker: str) -> None:
        answered = self._heartbeat(worker, self._held_pairs(worker))
        for eid in set(self.held[worker]) - set(answered):
            del self.held[worker][eid]  # fenced: it stops running it
        for eid in set(self.ahead[worker]) - set(answered):
            del self.ahead[worker][eid]  # lost before its time: never started here

    def _heartbeat(self, worker: str, sent: dict[str, int]) -> dict[str, int]:
        """Heartbeat ``sent`` (current or stale pairs); exactly the current ones may be kept."""
        before = self._some(sent)
        now = self.clock.now()
        answered = self.store.execution_heartbeat(worker, dict(sent), RUN_TTL)
        current = {
            eid
            for eid, token in sent.items()
            if eid in before
            and _leased(before[eid])
            and before[eid].lease_owner == worker
            and before[eid].fencing_token == token
        }
        assert answered.items() <= sent.items(), "heartbeat answered a pair it was not sent"
        assert set(answered) <= current, "a stale heartbeat was accepted"
        for eid in current:
            expiry = before[eid].lease_expires_at
            if expiry is not None and expiry > now:
                assert eid in answered, "a live lease was not extended"
        for eid, e in self._some(sent).items():
            if eid not in answered:
                assert e == before.get(eid), "a rejected heartbeat changed a run"
        return answered

    @rule(
        worker=st.sampled_from(_WORKERS),
        pick=st.integers(0, 7),
        succeeded=st.booleans(),
        retry_in=st.sampled_from([None, 0.0, 2.0]),
    )
    def worker_finish(
        self, worker: str, pick: int, succeeded: bool, retry_in: float | None
    ) -> None:
        held = self.held[worker]
        if held:
            eid = sorted(held)[pick % len(held)]
            self._finish(eid, held.pop(eid), succeeded, retry_in)

    @rule(worker=st.sampled_from(_WORKERS), graceful=st.booleans())
    def worker_down(self, worker: str, graceful: bool) -> None:
        """A graceful stop gives back what it runs (due at once); ``kill -9`` forgets it, with no
        finish and no release, and the process may come back later as a zombie."""
        belief = self._held_pairs(worker)
        self.held[worker].clear()
        self.ahead[worker].clear()
        if graceful:
            before = self._all()
            live = {
                eid
                for eid, token in belief.items()
                if _leased(before[eid])
                and before[eid].lease_owner == worker
                and before[eid].fencing_token == token
            }
            assert self.store.execution_release(worker, dict(belief)) == len(live)
            for eid, e in self._all().items():
                if eid in live:
                    assert e.status is ExecutionStatus.SCHEDULED
                else:
                    assert e == before.get(eid, e), "release touched a run it did not hold"
        else:
            self.zombies[worker].update(belief)

    @rule(worker=st.sampled_from(_WORKERS), finish=st.booleans(), succeeded=st.booleans())
    def zombie_wakes(self, worker: str, finish: bool, succeeded: bool) -> None:
        """A worker taken for dead (stalled, SIGSTOP) resumes and reports what it ran before."""
        old, self.zombies[worker] = self.zombies[worker], {}
        if finish:
            for eid, token in sorted(old.items()):
                self._finish(eid, token, succeeded, None)
        else:
            self._heartbeat(worker, old)

    @rule(pick=st.integers(0, 50), back=st.integers(0, 3), succeeded=st.booleans())
    def zombie_finish(self, pick: int, back: int, succeeded: bool) -> None:
        """Someone reports a run with a token that may be long superseded."""
        if self.issued:
            eid = sorted(self.issued)[pick % len(self.issued)]
            tokens = [0, *self.issued[eid]]
            self._finish(eid, tokens[-1 - back % len(tokens)], succeeded, None)

    def _finish(self, eid: str, token: int, succeeded: bool, retry_in: float | None) -> None:
        before = self.store.execution_get(eid)
        assert before is not None
        if before.attempt >= _RETRY.max_attempts:
            retry_in = None
        done = Completion(
            eid,
            token,
            succeeded=succeeded,
            result="ok" if succeeded else None,
            error=None if succeeded else "boom",
            retry_in=retry_in,
        )
        accepted = self.store.execution_finish_many([done])
        live = (
            before.status is ExecutionStatus.RUNNING
            and token == before.fencing_token  # a run held ahead reads queued: nothing to end
        )
        assert accepted == ([eid] if live else []), "acceptance is not exactly token == current"
        after = self.store.execution_get(eid)
        if not live:
            assert after == before, "a stale completion changed the run"
        else:
            assert token == self.issued[eid][-1], "accepted a token that is not the newest"

    # -- faults of the world ----------------------------------------------------------------

    @rule(lost=st.booleans())
    def queue_lost(self, lost: bool) -> None:
        """Redis restarted without persistence (or FLUSHALL): the sweep must rebuild it. (A
        no-op half the time: a rule without arguments is drawn far more often than the rest.)"""
        if not lost:
            return
        self._run(self.queue.close())
        self.queue = MemoryDelayQueue(self.clock)

    @rule(seconds=st.sampled_from(_ADVANCES))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def one_live_token_per_run(self) -> None:
        for eid, e in self._all().items():
            live = [a for a in e.attempts if a.outcome is AttemptOutcome.RUNNING]
            if e.status is ExecutionStatus.QUEUED and e.lease_owner is not None:  # held ahead
                assert live == [] and e.started_at is None, e.attempts
            elif e.status is ExecutionStatus.RUNNING:
                assert len(live) == 1, e.attempts
                assert live[0].fencing_token == e.fencing_token
                assert e.lease_owner is not None
            else:
                assert live == [], e.attempts
            tokens = [a.fencing_token for a in e.attempts]
            assert len(tokens) == len(set(tokens)), f"two attempts share a token: {e.attempts}"
            if self.issued.get(eid):
                assert e.fencing_token >= self.issued[eid][-1]
            assert e.attempt <= _RETRY.max_attempts

    @invariant()
    def one_record_per_fire_time(self) -> None:
        since = self.started_at - timedelta(days=1)
        until = self.clock.now() + timedelta(days=1)
        for job_id in self.job_ids:
            fires = Counter(t for t, _ in self.store.execution_fire_records(job_id, since, until))
            twice = [t for t, n in fires.items() if n > 1]
            assert not twice, f"job {job_id}: fire times recorded twice: {twice}"

    # -- teardown: a drain with healthy processes -------------------------------------------

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            self._exit.close()

    def _drain(self) -> None:
        """Every process is healthy from now on: every run due by now must become final. On the
        way, each run claimed again is first reported with all its older tokens (a zombie's
        heartbeat and completion), which must change nothing."""
        cutoff = self.clock.now()
        for worker in _WORKERS:
            self.worker_confirm(worker)
            ahead = {eid: t for eid, (t, _) in self.ahead[worker].items()}
            self.store.execution_release(worker, ahead)  # not due yet: handed back
            self.ahead[worker].clear()
            self.zombie_wakes(worker, finish=True, succeeded=True)
            for eid, token in sorted(self.held[worker].items()):
                self._finish(eid, token, True, None)
            self.held[worker].clear()
        pending: dict[str, ExecutionStatus] = {}
        for _ in range(12):
            for owner in _SCHEDULERS:
                self.scheduler_tick(owner)
                self.scheduler_sweep(owner, None)
            self.reap()
            while ids := self._run(self.queue.claim_due(100)):
                self._claim(WORKER, ids)
                for eid, token in sorted(self.held[WORKER].items()):
                    for old in [0, *self.issued[eid][:-1]]:
                        self._heartbeat(WORKER, {eid: old})
                        self._finish(eid, old, False, None)
                    self._finish(eid, token, True, None)
                self.held[WORKER].clear()
            pending = {
                eid: e.status
                for eid, e in self._all().items()
                if e.scheduled_for <= cutoff and not e.status.is_final
            }
            if not pending:
                return
            self.clock.advance(RUN_TTL + 1.0)
        raise AssertionError(f"runs due by {cutoff} never became final: {pending}")
