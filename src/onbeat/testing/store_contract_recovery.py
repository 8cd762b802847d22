"""The ``Store`` contract for recovering lost work: reaping expired leases in every shard, each
change conditional on the lease, and reading the sweep's backlog a bounded page at a time.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

from datetime import timedelta

from onbeat.model import AttemptOutcome, ExecutionStatus
from onbeat.queue.base import QueueItem
from onbeat.store.base import DispatchParams, Store, SweepCursor
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    FAST_RETRY,
    GRACE,
    RUN_TTL,
    SHARD_TTL,
    WINDOW,
    WORKER,
    _attempt_of,
    _claim,
    _dispatch,
    _get,
    _ids,
    _job_in_shards,
    _leases,
    _new,
    _ok,
    _only_run,
    _start,
    _two_schedulers,
)

__all__ = ["RecoveryContract"]


def _sweep_all(store: Store, limit: int, overdue_by: float | None = None) -> list[list[QueueItem]]:
    """Every page of a sweep over all shards, ``limit`` runs at a time, until the end."""
    leases = _leases(store)
    shards = list(range(store.shard_count))
    pages: list[list[QueueItem]] = []
    after: SweepCursor | None = None
    for _ in range(1000):
        page = store.execution_sweep(leases, shards, overdue_by, limit, after)
        assert len(page.items) <= limit
        pages.append(page.items)
        if page.resume is None:
            return pages
        after = page.resume
    raise AssertionError("the sweep never reached the end")


class RecoveryContract:
    """Reap and sweep behaviour every ``Store`` backend owes; see the module docstring."""

    # -- ping: the reaper's round trip after an outage ---------------------------------------------

    def test_ping__answers_and_changes_nothing(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_new()).job
        before = store.execution_list(job.id, limit=10)
        store.ping()
        assert store.execution_list(job.id, limit=10) == before

    # -- execution_reap: in every shard, conditional on the lease -------------------------------

    def test_execution_reap__in_shards_other_schedulers_hold(
        self, store: Store, clock: FakeClock
    ) -> None:
        a, b = _two_schedulers(store)
        runs = []
        for leases in (a, b):
            job = _job_in_shards(store, leases.epochs, _new(retry=FAST_RETRY))
            run = _only_run(store, job.id)
            assert _ids(store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 10))) == {
                run.id
            }
            runs.append(_claim(store, run.id))
        clock.advance(RUN_TTL + 1)  # both shard leases are still held, by a and by b
        reaped = store.execution_reap(100)
        assert _ids(reaped) == {r.execution.id for r in runs}
        assert all(e.status is ExecutionStatus.QUEUED for e in reaped)

    def test_execution_reap__in_shards_nobody_holds(self, store: Store, clock: FakeClock) -> None:
        run = _start(store, _new(retry=FAST_RETRY))
        clock.advance(SHARD_TTL + 1)  # the scheduler that dispatched it is gone too
        [reaped] = store.execution_reap(100)
        assert reaped.id == run.execution.id
        assert reaped.status is ExecutionStatus.QUEUED
        assert reaped.due_at <= clock.now() + timedelta(seconds=FAST_RETRY.backoff_cap)
        clock.advance(FAST_RETRY.backoff_cap)
        assert _claim(store, run.execution.id).execution.attempt == 2

    def test_execution_reap__heartbeat_committed_first_wins(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=FAST_RETRY))
        clock.advance(RUN_TTL + 1)  # expired, but its worker renews before anyone reaps it
        token = run.execution.fencing_token
        held = {run.execution.id: token}
        assert store.execution_heartbeat(WORKER, held, RUN_TTL) == held
        assert store.execution_reap(100) == []
        assert _get(store, run.execution.id).status is ExecutionStatus.RUNNING
        assert store.execution_finish_many([_ok(run)]) == [run.execution.id]

    def test_execution_reap__outcome_committed_first_wins(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=FAST_RETRY))
        clock.advance(RUN_TTL + 1)
        assert store.execution_finish_many([_ok(run, "late")]) == [run.execution.id]
        assert store.execution_reap(100) == []
        done = _get(store, run.execution.id)
        assert done.status is ExecutionStatus.SUCCEEDED
        assert [a.outcome for a in done.attempts] == [AttemptOutcome.SUCCEEDED]

    def test_execution_reap__each_run_once_longest_expired_first(
        self, store: Store, clock: FakeClock
    ) -> None:
        oldest = _start(store, _new(retry=FAST_RETRY))
        clock.advance(1)
        others = [_start(store, _new(retry=FAST_RETRY)) for _ in range(2)]
        clock.advance(RUN_TTL + 1)
        first = store.execution_reap(1)
        rest = store.execution_reap(100)
        assert _ids(first) == {oldest.execution.id}
        assert _ids(rest) == {r.execution.id for r in others}
        assert store.execution_reap(100) == []
        for run in [oldest, *others]:
            execution = _get(store, run.execution.id)
            assert _attempt_of(execution, run.execution.fencing_token) is AttemptOutcome.LOST
            assert len(execution.attempts) == 1

    # -- execution_sweep: pages -----------------------------------------------------------------

    def test_execution_sweep__pages_cover_the_backlog_once_in_order(
        self, store: Store, clock: FakeClock
    ) -> None:
        # Runs due at the same instant: only their ids tell them apart in the order.
        queued = [_only_run(store, store.job_create(_new()).job.id) for _ in range(11)]
        assert _ids(_dispatch(store)) == {e.id for e in queued}
        clock.advance(120)
        pages = _sweep_all(store, limit=4, overdue_by=60.0)
        assert [len(page) for page in pages] == [4, 4, 3]
        swept = [item.execution_id for page in pages for item in page]
        by_id = {e.id: e for e in queued}
        assert swept == sorted(by_id, key=lambda eid: (by_id[eid].shard, by_id[eid].due_at, eid))

    def test_execution_sweep__later_pages_skip_runs_started_meanwhile(
        self, store: Store, clock: FakeClock
    ) -> None:
        queued = [_only_run(store, store.job_create(_new()).job.id) for _ in range(6)]
        _dispatch(store)
        leases = _leases(store)
        shards = list(range(store.shard_count))
        first = store.execution_sweep(leases, shards, None, 3)
        assert first.resume is not None
        rest = {e.id for e in queued} - _ids(first.items)
        started = sorted(rest)[0]
        _claim(store, started)
        second = store.execution_sweep(leases, shards, None, 10, first.resume)
        assert _ids(second.items) == rest - {started}
        assert second.resume is None
