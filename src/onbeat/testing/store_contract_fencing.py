"""Store contract, fencing as a property: a rule-based model of claim, heartbeat, reap, finish
and release by two workers with current and stale tokens (:class:`StoreFencingMachine`).

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from onbeat.model import AttemptOutcome, Execution, ExecutionStatus, OverlapPolicy, RetryPolicy
from onbeat.store.base import Completion
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    GRACE,
    OTHER_WORKER,
    RUN_TTL,
    WINDOW,
    WORKER,
    StoreFactory,
    _attempt_of,
    _dispatch,
    _get,
    _ids,
    _new,
    _only_run,
    _reap,
)

__all__ = ["FencingContract", "StoreFencingMachine"]


class FencingContract:
    """The fencing state machine, run on fresh stores of the backend."""

    def test_execution_lifecycle__fencing_state_machine(self, store_factory: StoreFactory) -> None:
        class Machine(StoreFencingMachine):
            open_store = store_factory

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=50,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


# -- the state machine ----------------------------------------------------------------------------

_MACHINE_RUNS = 3
_MACHINE_WORKERS = (WORKER, OTHER_WORKER)
_MACHINE_RETRY = RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_cap=1.0)


class StoreFencingMachine(RuleBasedStateMachine):
    """Workers claim, heartbeat, finish (with current or stale tokens) and release a few runs
    while time moves and a scheduler reaps and dispatches; checks that at most one fencing token
    per run is live, that a completion is accepted exactly when its token is the current one of
    a running run, and that every run reaches a final state once workers stop finishing.

    Subclass it with ``open_store`` set to a :data:`StoreFactory`; each example gets a fresh store
    in a temporary directory.
    """

    open_store: ClassVar[StoreFactory]

    def __init__(self) -> None:
        super().__init__()
        self._exit = ExitStack()
        directory = Path(self._exit.enter_context(tempfile.TemporaryDirectory()))
        self.clock = FakeClock()
        open_another = self._exit.enter_context(type(self).open_store(directory, self.clock))
        self.store = open_another()
        self.ids: list[str] = []
        for _ in range(_MACHINE_RUNS):
            job = self.store.job_create(_new(retry=_MACHINE_RETRY, overlap=OverlapPolicy.ALLOW)).job
            self.ids.append(_only_run(self.store, job.id).id)
        self.issued: dict[str, list[int]] = {eid: [] for eid in self.ids}
        """Fencing tokens claims handed out, per run, in order."""
        self.held: dict[str, dict[str, int]] = {w: {} for w in _MACHINE_WORKERS}
        """What each worker believes it holds (possibly stale)."""
        assert _ids(_dispatch(self.store)) == set(self.ids)

    def _all(self) -> dict[str, Execution]:
        return {eid: _get(self.store, eid) for eid in self.ids}

    @rule(run=st.integers(0, _MACHINE_RUNS - 1), worker=st.sampled_from(_MACHINE_WORKERS))
    def claim(self, run: int, worker: str) -> None:
        eid = self.ids[run]
        before = _get(self.store, eid)
        now = self.clock.now()
        result = self.store.execution_claim([eid], worker, RUN_TTL, GRACE)
        due = before.status is ExecutionStatus.QUEUED and before.due_at <= now
        assert _ids(result.started) == ({eid} if due else set())
        not_yet = before.status is ExecutionStatus.QUEUED and before.due_at > now
        assert _ids(result.not_due) == ({eid} if not_yet else set())
        if result.started:
            token = result.started[0].execution.fencing_token
            assert token > before.fencing_token
            assert all(token > old for old in self.issued[eid]), "a fencing token was reused"
            self.issued[eid].append(token)
            self.held[worker][eid] = token
        else:
            assert _get(self.store, eid).fencing_token == before.fencing_token

    @rule(worker=st.sampled_from(_MACHINE_WORKERS))
    def heartbeat(self, worker: str) -> None:
        now = self.clock.now()
        mine = {
            eid: e
            for eid, e in self._all().items()
            if e.status is ExecutionStatus.RUNNING and e.lease_owner == worker
        }
        belief = self.held[worker]
        held = self.store.execution_heartbeat(worker, dict(belief), RUN_TTL)
        assert set(held) <= set(mine), "heartbeat answered for a run the worker does not hold"
        assert held.items() <= belief.items(), "heartbeat answered a pair it was not sent"
        for eid, e in mine.items():
            assert e.lease_expires_at is not None
            if e.lease_expires_at > now:
                assert held.get(eid) == e.fencing_token, "a held lease was not extended"

    @rule(seconds=st.sampled_from([1.0, 3.0, 6.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def reap(self) -> None:
        before = self._all()
        now = self.clock.now()
        reaped = _reap(self.store)
        running = {eid: e for eid, e in before.items() if e.status is ExecutionStatus.RUNNING}
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
        assert expired <= _ids(reaped) <= due
        for e in reaped:
            assert e.status in (ExecutionStatus.QUEUED, ExecutionStatus.FAILED)
            assert _attempt_of(e, before[e.id].fencing_token) is AttemptOutcome.LOST

    @rule()
    def dispatch(self) -> None:
        horizon = self.clock.now() + timedelta(seconds=WINDOW)
        ready = {
            eid
            for eid, e in self._all().items()
            if e.status is ExecutionStatus.SCHEDULED and e.due_at <= horizon
        }
        items = _dispatch(self.store)
        assert _ids(items) == ready
        for eid in ready:
            assert _get(self.store, eid).status is ExecutionStatus.QUEUED

    @rule(
        run=st.integers(0, _MACHINE_RUNS - 1),
        pick=st.integers(0, 3),
        succeeded=st.booleans(),
        retry_in=st.sampled_from([None, 0.0, 2.0]),
    )
    def finish(self, run: int, pick: int, succeeded: bool, retry_in: float | None) -> None:
        eid = self.ids[run]
        tokens = [0, *self.issued[eid]]
        token = tokens[-1 - pick % len(tokens)]
        before = _get(self.store, eid)
        if before.attempt >= _MACHINE_RETRY.max_attempts:
            retry_in = None  # what a worker does after the last attempt
        done = Completion(
            eid,
            token,
            succeeded=succeeded,
            result="ok" if succeeded else None,
            error=None if succeeded else "boom",
            retry_in=retry_in,
        )
        accepted = self.store.execution_finish_many([done])
        live = before.status is ExecutionStatus.RUNNING and token == before.fencing_token
        assert accepted == ([eid] if live else [])
        after = _get(self.store, eid)
        if not live:
            assert after == before, "a rejected completion changed the run"
            return
        assert token == self.issued[eid][-1], "accepted a token that is not the newest"
        if succeeded:
            assert after.status is ExecutionStatus.SUCCEEDED
        elif retry_in is None:
            assert after.status is ExecutionStatus.FAILED
        else:
            assert after.status is ExecutionStatus.SCHEDULED

    @rule(worker=st.sampled_from(_MACHINE_WORKERS))
    def release(self, worker: str) -> None:
        belief = self.held[worker]
        before = self._all()
        live = {
            eid
            for eid, token in belief.items()
            if before[eid].status is ExecutionStatus.RUNNING and before[eid].fencing_token == token
        }
        assert self.store.execution_release(worker, dict(belief)) == len(live)
        for eid, e in self._all().items():
            if eid in live:
                assert e.status is ExecutionStatus.SCHEDULED
                assert e.due_at <= self.clock.now()
            else:
                assert e == before[eid], "release touched a run it did not hold"
        belief.clear()

    @invariant()
    def one_live_token_per_run(self) -> None:
        for eid, e in self._all().items():
            live = [a for a in e.attempts if a.outcome is AttemptOutcome.RUNNING]
            if e.status is ExecutionStatus.RUNNING:
                assert len(live) == 1, e.attempts
                assert live[0].fencing_token == e.fencing_token
                assert e.lease_owner is not None
            else:
                assert live == [], e.attempts
            if self.issued[eid]:
                assert e.fencing_token >= self.issued[eid][-1]
            assert e.attempt <= _MACHINE_RETRY.max_attempts

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            self._exit.close()

    def _drain(self) -> None:
        """Workers stop finishing: reaps alone must bring every run to a final state."""
        step = RUN_TTL + _MACHINE_RETRY.backoff_cap + 3.0
        for _ in range(4 * (_MACHINE_RETRY.max_attempts + 1)):
            if all(e.status.is_final for e in self._all().values()):
                break
            self.clock.advance(step)
            _reap(self.store)
            _dispatch(self.store)
            queued = [e.id for e in self._all().values() if e.status is ExecutionStatus.QUEUED]
            self.store.execution_claim(queued, "worker-doomed", RUN_TTL, GRACE)
        final = self._all()
        assert all(e.status.is_final for e in final.values()), {
            eid: e.status for eid, e in final.items()
        }
        letters = {d.execution_id for d in self.store.dead_letter_list(limit=1000)}
        failed = {eid for eid, e in final.items() if e.status is ExecutionStatus.FAILED}
        assert letters == failed
