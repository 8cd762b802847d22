"""The ``Store`` contract for recovering lost work: reading the sweep's backlog a bounded page at
a time.

Mixed into a backend's contract test class next to ``StoreContract``, with the same fixtures::

    class TestStore(StoreContract, RecoveryContract):
        pass
"""

from __future__ import annotations

from onbeat.queue.base import QueueItem
from onbeat.store.base import Store, SweepCursor
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    _claim,
    _dispatch,
    _ids,
    _leases,
    _new,
    _only_run,
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
    """Sweep behaviour every ``Store`` backend owes; see the module docstring."""

    # -- execution_sweep: pages -----------------------------------------------------------------

    def test_execution_sweep__pages_cover_the_backlog_once_in_order(
        self, store: Store, clock: FakeClock
    ) -> None:
        # Runs due at the same instant: only their ids tell them apart in the order.
        queued = [_only_run(store, store.job_create(_new()).id) for _ in range(11)]
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
        queued = [_only_run(store, store.job_create(_new()).id) for _ in range(6)]
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
