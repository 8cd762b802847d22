"""``Store.execution_heartbeat`` contract: a worker extends the leases of the runs it names.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

from onbeat.model import ExecutionStatus
from onbeat.store.base import Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    FAST_RETRY,
    OTHER_WORKER,
    RUN_TTL,
    WORKER,
    _at,
    _claim,
    _get,
    _held,
    _ids,
    _new,
    _ok,
    _reap,
    _start,
)

__all__ = ["HeartbeatContract"]


class HeartbeatContract:
    def test_execution_heartbeat__extends_only_the_named_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A run its worker claimed but lost track of (not named) is not kept alive: the reaper
        frees it while the worker heartbeats the runs it does run."""
        r1, r2, forgotten = _start(store), _start(store), _start(store)
        other = _start(store, owner=OTHER_WORKER)
        clock.advance(5)
        assert store.execution_heartbeat(WORKER, _held(r1, r2), 20.0) == _held(r1, r2)
        for run in (r1, r2):
            assert _get(store, run.execution.id).lease_expires_at == _at(clock, 20.0)
        for run in (forgotten, other):
            assert _get(store, run.execution.id).lease_expires_at == run.execution.lease_expires_at
        clock.advance(RUN_TTL)
        assert _ids(_reap(store)) == {forgotten.execution.id, other.execution.id}
        assert store.execution_heartbeat(WORKER, _held(r1, r2), 20.0) == _held(r1, r2)

    def test_execution_heartbeat__finished_run_is_no_longer_held(
        self, store: Store, clock: FakeClock
    ) -> None:
        r1, r2 = _start(store), _start(store)
        assert store.execution_finish_many([_ok(r1)]) == [r1.execution.id]
        assert store.execution_heartbeat(WORKER, _held(r1, r2), 20.0) == _held(r2)
        assert _get(store, r1.execution.id).status is ExecutionStatus.SUCCEEDED

    def test_execution_heartbeat__stale_token_is_not_extended(
        self, store: Store, clock: FakeClock
    ) -> None:
        """The same worker claimed the run again after losing it: only the new token is held."""
        first = _start(store, _new(retry=FAST_RETRY))
        clock.advance(RUN_TTL + 1)
        assert _ids(_reap(store)) == {first.execution.id}
        clock.advance(FAST_RETRY.backoff_cap + 1)  # the reaped run is queued again, then due
        again = _claim(store, first.execution.id)
        clock.advance(1)
        assert store.execution_heartbeat(WORKER, _held(first), 20.0) == {}
        assert _get(store, first.execution.id).lease_expires_at == again.execution.lease_expires_at
        assert store.execution_heartbeat(WORKER, _held(again), 20.0) == _held(again)
        assert _get(store, first.execution.id).lease_expires_at == _at(clock, 20.0)

    def test_execution_heartbeat__another_owners_run_is_not_extended(
        self, store: Store, clock: FakeClock
    ) -> None:
        theirs = _start(store, owner=OTHER_WORKER)
        clock.advance(1)
        assert store.execution_heartbeat(WORKER, _held(theirs), 20.0) == {}
        assert (
            _get(store, theirs.execution.id).lease_expires_at == theirs.execution.lease_expires_at
        )

    def test_execution_heartbeat__nothing_named_is_nothing_held(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        assert store.execution_heartbeat(WORKER, {}, 20.0) == {}
        assert store.execution_heartbeat(WORKER, {"no-such-execution": 1}, 20.0) == {}
        assert _get(store, run.execution.id).lease_expires_at == run.execution.lease_expires_at
