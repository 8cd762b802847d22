"""Store contract, the scheduler's side: shard leases (fair share, takeover, release), dispatch
of due runs from held shards fenced by epoch, and the misfire policies applied at dispatch.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import itertools
import math
from datetime import timedelta

from onbeat.model import ExecutionStatus, JobStatus, MisfirePolicy
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule
from onbeat.store.base import DispatchParams, ShardLeases, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    EVERY_SECOND,
    GRACE,
    OTHER_SCHEDULER,
    SCHEDULER,
    SHARD_TTL,
    WINDOW,
    _at,
    _cron,
    _dispatch,
    _get,
    _ids,
    _job,
    _leases,
    _misfired,
    _new,
    _once,
    _only_run,
    _pending,
    _runs,
    _two_schedulers,
)

__all__ = ["DispatchContract"]


class DispatchContract:
    """Shard leases and ``execution_dispatch``."""

    # -- shard_acquire / shard_release --------------------------------------------------------

    def test_shard_acquire__single_owner_takes_every_shard(
        self, store: Store, clock: FakeClock
    ) -> None:
        every = set(range(store.shard_count))
        first = _leases(store)
        assert first.owner == SCHEDULER
        assert set(first.epochs) == every
        assert first.acquired == every
        renewed = _leases(store)
        assert renewed.epochs == first.epochs
        assert renewed.acquired == frozenset()

    def test_shard_acquire__two_owners_converge_to_fair_share(
        self, store: Store, clock: FakeClock
    ) -> None:
        every = set(range(store.shard_count))
        a = _leases(store, SCHEDULER)
        assert set(a.epochs) == every
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs).isdisjoint(a.epochs), "a live owner's shard was taken"
        b_taken = set(b.acquired)
        for _ in range(3):
            a = _leases(store, SCHEDULER)
            assert len(a.epochs) <= math.ceil(store.shard_count / 2), (
                "the first owner kept its excess"
            )
            b = _leases(store, OTHER_SCHEDULER)
            b_taken |= b.acquired
        assert b.acquired == frozenset(), "still moving shards after convergence"
        assert set(a.epochs).isdisjoint(b.epochs)
        assert set(a.epochs) | set(b.epochs) == every
        assert sorted([len(a.epochs), len(b.epochs)]) == [
            store.shard_count // 2,
            math.ceil(store.shard_count / 2),
        ]
        assert b_taken == set(b.epochs)

    def test_shard_acquire__three_owners_leave_nobody_idle(
        self, store: Store, clock: FakeClock
    ) -> None:
        owners = ["scheduler-a", "scheduler-b", "scheduler-c"]
        held: dict[str, set[int]] = {}
        for _ in range(4):
            for owner in owners:
                held[owner] = set(_leases(store, owner).epochs)
        sizes = sorted(len(shards) for shards in held.values())
        base, extra = divmod(store.shard_count, len(owners))
        assert sizes == [base] * (len(owners) - extra) + [base + 1] * extra
        assert set().union(*held.values()) == set(range(store.shard_count))

    def test_shard_acquire__silent_owner_loses_shards_after_ttl(
        self, store: Store, clock: FakeClock
    ) -> None:
        a, b = _two_schedulers(store)
        clock.advance(SHARD_TTL / 2)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs).isdisjoint(a.epochs), "took shards before their lease expired"
        clock.advance(SHARD_TTL / 2 + 1)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs) == set(range(store.shard_count))
        assert b.acquired == frozenset(a.epochs)
        for shard, epoch in a.epochs.items():
            assert b.epochs[shard] > epoch, f"shard {shard} taken over without a new epoch"

    def test_shard_release__frees_shards_for_others(self, store: Store, clock: FakeClock) -> None:
        a = _leases(store, SCHEDULER)
        assert _leases(store, OTHER_SCHEDULER).epochs == {}
        store.shard_release(SCHEDULER)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs) == set(range(store.shard_count))
        assert b.acquired == frozenset(b.epochs)
        for shard, epoch in a.epochs.items():
            assert b.epochs[shard] > epoch

    # -- execution_dispatch --------------------------------------------------------------------

    def test_execution_dispatch__queues_runs_due_within_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        t0 = clock.now()
        now_run = _only_run(store, store.job_create(_new(priority=3)).job.id)
        soon_run = _only_run(store, store.job_create(_once(_at(clock, 5))).job.id)
        later_run = _only_run(store, store.job_create(_once(_at(clock, 60))).job.id)
        items = _dispatch(store)
        assert sorted(items, key=lambda i: i.due_at) == [
            QueueItem(now_run.id, t0, 3, now_run.shard),
            QueueItem(soon_run.id, t0 + timedelta(seconds=5), 0, soon_run.shard),
        ]
        assert _get(store, now_run.id).status is ExecutionStatus.QUEUED
        assert _get(store, soon_run.id).status is ExecutionStatus.QUEUED
        assert _get(store, later_run.id).status is ExecutionStatus.SCHEDULED
        assert _dispatch(store) == [], "a queued run was dispatched twice"
        clock.advance(50)
        assert _dispatch(store) == [
            QueueItem(later_run.id, t0 + timedelta(seconds=60), 0, later_run.shard)
        ]

    def test_execution_dispatch__respects_limit(self, store: Store, clock: FakeClock) -> None:
        for _ in range(3):
            store.job_create(_new())
        first = _dispatch(store, limit=2)
        assert len(first) == 2
        second = _dispatch(store, limit=2)
        assert len(second) == 1
        assert _ids(first).isdisjoint(_ids(second))

    def test_execution_dispatch__only_from_held_shards(
        self, store: Store, clock: FakeClock
    ) -> None:
        _leases(store, SCHEDULER)  # holds every shard
        run = _only_run(store, store.job_create(_new()).job.id)
        leases = _leases(store, OTHER_SCHEDULER)
        assert leases.epochs == {}
        assert store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 1000)) == []
        assert _get(store, run.id).status is ExecutionStatus.SCHEDULED

    def test_execution_dispatch__materialises_next_cron_fire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        first = _only_run(store, job.id)
        clock.advance(55)
        assert _dispatch(store) == [QueueItem(first.id, first.scheduled_for, 0, first.shard)]
        nxt = first.scheduled_for + timedelta(minutes=1)
        for _ in range(2):  # a repeated pass changes nothing
            pending = _pending(store, job.id)
            scheduled = [r for r in pending if r.status is ExecutionStatus.SCHEDULED]
            assert [r.scheduled_for for r in scheduled] == [nxt]
            assert scheduled[0].due_at == nxt
            assert _job(store, job.id).next_fire_at == nxt
            assert _dispatch(store) == []
        assert len(_runs(store, job.id)) == 2

    def test_execution_dispatch__a_page_of_jobs_plans_each_its_own_next_fire(
        self, store: Store, clock: FakeClock
    ) -> None:
        """One pass over many jobs writes their next runs and next fire times as a batch: each
        job gets its own, none another's. (Every schedule fires next at minute 1.)"""
        expressions = ["* * * * *", "1 * * * *", "1 12 * * *", "1,31 * * * *", "1-59/7 * * * *"]
        jobs = [store.job_create(_cron(e)).job for e in expressions]
        firsts = [_only_run(store, job.id) for job in jobs]
        assert len({run.scheduled_for for run in firsts}) == 1
        clock.advance((firsts[0].scheduled_for - clock.now()).total_seconds() - 5)
        assert _ids(_dispatch(store)) == _ids(firsts)
        for job, expression, first in zip(jobs, expressions, firsts, strict=True):
            head = Schedule.parse(cron=expression).next_fire_after(first.scheduled_for)
            scheduled = [
                r for r in _pending(store, job.id) if r.status is ExecutionStatus.SCHEDULED
            ]
            assert [r.scheduled_for for r in scheduled] == [head], expression
            assert _job(store, job.id).next_fire_at == head, expression

    def test_execution_dispatch__every_second_cron_fills_window_in_one_call(
        self, store: Store, clock: FakeClock
    ) -> None:
        t0 = clock.now()
        job = store.job_create(_cron(EVERY_SECOND)).job
        items = _dispatch(store, window=10)
        assert sorted(i.due_at for i in items) == [t0 + timedelta(seconds=s) for s in range(1, 11)]
        runs = _runs(store, job.id)
        assert _ids(items) == {r.id for r in runs if r.status is ExecutionStatus.QUEUED}
        scheduled = [r for r in runs if r.status is ExecutionStatus.SCHEDULED]
        assert [r.scheduled_for for r in scheduled] == [t0 + timedelta(seconds=11)]
        assert _job(store, job.id).next_fire_at == t0 + timedelta(seconds=11)

    def test_execution_dispatch__stale_lease_writes_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        stale = _leases(store, SCHEDULER)
        clock.advance(SHARD_TTL + 1)
        taker = _leases(store, OTHER_SCHEDULER)
        assert set(taker.epochs) == set(stale.epochs)
        job = store.job_create(_cron(EVERY_SECOND)).job
        run = _only_run(store, job.id)
        clock.advance(1)
        assert store.execution_dispatch(DispatchParams(stale, WINDOW, GRACE, 1000)) == []
        assert _runs(store, job.id) == [run], "a fenced scheduler wrote executions"
        assert _job(store, job.id).next_fire_at == run.scheduled_for
        items = store.execution_dispatch(DispatchParams(taker, WINDOW, GRACE, 1000))
        assert run.id in _ids(items)

    def test_execution_dispatch__takeovers_never_duplicate_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        owners = [SCHEDULER, OTHER_SCHEDULER]
        stale: list[ShardLeases] = []
        alive = 0
        for step in range(48):  # a pass every 15 s for 12 minutes, a takeover every 3
            clock.advance(15)
            if step % 12 == 11:
                stale.append(_leases(store, owners[alive]))
                alive = 1 - alive  # the live scheduler stalls; the other one takes over
            leases = _leases(store, owners[alive])
            store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 1000))
            for zombie in stale[-1:]:  # the stalled one wakes up with its old leases
                store.execution_dispatch(DispatchParams(zombie, WINDOW, GRACE, 1000))
        runs = _runs(store, job.id)
        keys = [(r.scheduled_for, r.trigger) for r in runs]
        assert len(keys) == len(set(keys)), "duplicate (job, scheduled_for, trigger)"
        fires = sorted(r.scheduled_for for r in runs)
        minute = timedelta(minutes=1)
        assert all(b - a == minute for a, b in itertools.pairwise(fires)), "a gap"
        assert fires[0] == clock.now().replace(hour=12, minute=1, second=0)
        assert fires[-1] > clock.now()
        scheduled = [r for r in runs if r.status is ExecutionStatus.SCHEDULED]
        assert [r.scheduled_for for r in scheduled] == [fires[-1]]
        assert all(r.status is ExecutionStatus.QUEUED for r in runs if r not in scheduled)
        assert _job(store, job.id).next_fire_at == fires[-1]

    # -- misfire -------------------------------------------------------------------------------

    def test_execution_dispatch__misfire_run_once(self, store: Store, clock: FakeClock) -> None:
        job = _misfired(store, clock, MisfirePolicy.RUN_ONCE)
        items = _dispatch(store, grace=GRACE)
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        assert len(items) == 1
        caught_up = _get(store, items[0].execution_id)
        assert caught_up.status is ExecutionStatus.QUEUED
        assert caught_up.scheduled_for.hour in range(13, 18)
        for hour in range(13, 18):
            if hour != caught_up.scheduled_for.hour:
                assert runs[hour].status is ExecutionStatus.SKIPPED, hour
                assert runs[hour].reason, hour
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for

    def test_execution_dispatch__misfire_run_all_within_catchup_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = _misfired(store, clock, MisfirePolicy.RUN_ALL, catchup_window=3 * 3600.0)
        items = _dispatch(store, grace=GRACE)  # catch-up line: 14:30
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        assert _ids(items) == {runs[h].id for h in (15, 16, 17)}
        for hour in (15, 16, 17):
            assert runs[hour].status is ExecutionStatus.QUEUED
        for hour in (13, 14):
            assert runs[hour].status is ExecutionStatus.SKIPPED
            assert runs[hour].reason
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for

    def test_execution_dispatch__misfire_skip(self, store: Store, clock: FakeClock) -> None:
        job = _misfired(store, clock, MisfirePolicy.SKIP)
        assert _dispatch(store, grace=GRACE) == []
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        for hour in range(13, 18):
            assert runs[hour].status is ExecutionStatus.SKIPPED
            assert "misfire" in (runs[hour].reason or "").lower(), runs[hour].reason
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert runs[18].scheduled_for > clock.now()
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for
        assert _job(store, job.id).status is JobStatus.ACTIVE

    def test_execution_dispatch__late_within_grace_is_no_misfire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new(misfire=MisfirePolicy.SKIP)).job
        clock.advance(GRACE / 2)
        assert _ids(_dispatch(store, grace=GRACE)) == {_only_run(store, job.id).id}

    def test_execution_dispatch__misfired_once_job_run_once_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 300), misfire=MisfirePolicy.RUN_ONCE)).job
        clock.advance(7200)
        run = _only_run(store, job.id)
        assert _ids(_dispatch(store, grace=GRACE)) == {run.id}
        assert _get(store, run.id).status is ExecutionStatus.QUEUED

    def test_execution_dispatch__misfired_once_job_skip_completes_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 300), misfire=MisfirePolicy.SKIP)).job
        clock.advance(7200)
        assert _dispatch(store, grace=GRACE) == []
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SKIPPED
        assert "misfire" in (run.reason or "").lower()
        assert _job(store, job.id).status is JobStatus.COMPLETED
