"""Store contract, dead letters: listed, replayed with a fresh set of attempts, or dropped.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import pytest

from onbeat.errors import NotFoundError
from onbeat.model import ExecutionStatus, MisfirePolicy, RetryPolicy
from onbeat.store.base import Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    GRACE,
    _claim,
    _dispatch,
    _failed,
    _get,
    _ids,
    _new,
    _ok,
    _start,
)

__all__ = ["DeadLetterContract"]


class DeadLetterContract:
    """``dead_letter_list``, ``dead_letter_replay`` and ``dead_letter_drop``."""

    # -- dead letters --------------------------------------------------------------------------

    def test_dead_letter_replay__runs_again_with_fresh_attempts(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        store.execution_finish_many([_failed(run, "nope")])
        clock.advance(5)
        replayed = store.dead_letter_replay(run.execution.id)
        assert replayed.id == run.execution.id
        assert replayed.status is ExecutionStatus.SCHEDULED
        assert replayed.due_at == clock.now()
        assert replayed.attempt == 0
        assert store.dead_letter_list() == []
        with pytest.raises(NotFoundError):
            store.dead_letter_replay(run.execution.id)
        assert _ids(_dispatch(store)) == {run.execution.id}
        again = _claim(store, run.execution.id)
        assert again.execution.attempt == 1
        assert store.execution_finish_many([_ok(run)]) == []
        assert store.execution_finish_many([_ok(again)]) == [run.execution.id]

    def test_dead_letter_replay__old_run_is_not_misfire_skipped(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(misfire=MisfirePolicy.SKIP, retry=RetryPolicy(max_attempts=1)))
        store.execution_finish_many([_failed(run)])
        clock.advance(GRACE * 10)
        store.dead_letter_replay(run.execution.id)
        assert _ids(_dispatch(store)) == {run.execution.id}

    def test_dead_letter_drop__removes_letter_only(self, store: Store, clock: FakeClock) -> None:
        run = _start(store)
        store.execution_finish_many([_failed(run)])
        store.dead_letter_drop(run.execution.id)
        assert store.dead_letter_list() == []
        assert _get(store, run.execution.id).status is ExecutionStatus.FAILED
        with pytest.raises(NotFoundError):
            store.dead_letter_drop(run.execution.id)
        with pytest.raises(NotFoundError):
            store.dead_letter_replay(run.execution.id)

    def test_dead_letter__unknown_ids_raise_not_found(self, store: Store, clock: FakeClock) -> None:
        with pytest.raises(NotFoundError):
            store.dead_letter_replay("no-such-execution")
        with pytest.raises(NotFoundError):
            store.dead_letter_drop("no-such-execution")
        run = _start(store)  # a live run is not a dead letter
        with pytest.raises(NotFoundError):
            store.dead_letter_replay(run.execution.id)

    def test_dead_letter_list__keyset_pages(self, store: Store, clock: FakeClock) -> None:
        runs = [_start(store) for _ in range(3)]
        store.execution_finish_many([_failed(run) for run in runs])
        first = store.dead_letter_list(limit=2)
        rest = store.dead_letter_list(after_id=first[-1].execution_id, limit=2)
        listed = [d.execution_id for d in [*first, *rest]]
        assert [len(first), len(rest)] == [2, 1]
        assert sorted(listed) == sorted(_ids(runs))
        assert len(set(listed)) == 3
