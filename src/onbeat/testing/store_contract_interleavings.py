"""Store contract, forced interleavings: one of two stores on one database (two connections,
as two processes would have) is held at a chosen point of its call, inside its transaction, while
the other makes a conflicting call; then it goes on. A race (``store_contract_concurrency``) finds
an interleaving by chance; this makes the one a lock or a re-check exists for happen every time,
and the invariant is asserted whichever call commits first.

The other call gets ``CONFIRM_CHANCE`` to commit while the first is held: one that waits on the
held transaction's locks waits all of it, and one that does not wait commits inside it. (The
held transaction stays well under the PostgreSQL sessions' idle-in-transaction timeout.)

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest

from onbeat.model import ExecutionStatus, JobEventKind, OverlapPolicy
from onbeat.schedule import Schedule
from onbeat.store.base import JobChanges, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    GRACE,
    OTHER_WORKER,
    RUN_TTL,
    WORKER,
    _at,
    _cron,
    _dispatch,
    _get,
    _held,
    _ids,
    _leases,
    _new,
    _ok,
    _once,
    _only_run,
    _start,
)
from onbeat.testing.store_contract_concurrency import BARRIER_TIMEOUT, _assert_one_chain

__all__ = ["InterleavingContract", "held_after"]

CONFIRM_CHANCE = 0.5
"""Seconds a forced interleaving lets a call that is not blocked commit (it takes milliseconds)."""


@dataclass
class Hold:
    reached: threading.Event = field(default_factory=threading.Event)
    """Set when the held call is at the hold."""
    release: threading.Event = field(default_factory=threading.Event)
    """Set by the test to let it go on."""


@contextmanager
def held_after(store: Store, method: str) -> Iterator[Hold]:
    """The first call of ``store.<method>`` answers as usual, then waits at the hold until the
    test releases it: the call that made it is held there, inside its transaction if it is in
    one. Released (and unwrapped) on exit whatever happens, so a failed test does not leave a
    thread waiting: enter it inside the executor that makes the call."""
    original: Callable[..., Any] = getattr(store, method)
    hold = Hold()

    def then_hold(*args: Any, **kwargs: Any) -> Any:
        answer = original(*args, **kwargs)
        setattr(store, method, original)  # only the first call is held
        hold.reached.set()
        assert hold.release.wait(BARRIER_TIMEOUT), "never released"
        return answer

    setattr(store, method, then_hold)
    try:
        yield hold
    finally:
        setattr(store, method, original)
        hold.release.set()


class InterleavingContract:
    """Forced interleavings between two stores on one database; see the module docstring.
    Uses ``ConcurrencyContract``'s ``store_pair``."""

    @pytest.mark.parametrize("decision", ["cancel", "pause", "reschedule"])
    def test_execution_confirm__between_a_decisions_instant_and_its_commit_starts_nothing_later(
        self, store_pair: tuple[Store, Store], clock: FakeClock, decision: str
    ) -> None:
        """Forced interleaving: a cancel, pause or edit of the schedule has read its instant and
        is held there; the clock moves on, the held-ahead run falls due and its worker confirms
        it. Whichever commits first, a run that started did so no later than the decision's
        instant (the fault suite's oracle, and the audit, take a run due after a cancel that
        still ran for a lost cancel). The confirm gets ``CONFIRM_CHANCE`` to commit before the
        decision goes on; one that waits on the decision's locks waits all of it."""
        a, b = store_pair
        job = a.job_create(_once(_at(clock, 1))).job
        run = _only_run(a, job.id)
        assert run.id in _ids(_dispatch(a))
        [held] = a.execution_claim(
            [run.id], WORKER, RUN_TTL, GRACE, max_starts=1, ahead=2.0, max_ahead=1
        ).started
        decide: dict[str, Callable[[], object]] = {
            "cancel": partial(b.job_cancel, job.id),
            "pause": partial(b.job_pause, job.id),
            "reschedule": partial(
                b.job_update, job.id, JobChanges(schedule=Schedule.parse(cron=EVERY_MINUTE))
            ),
        }
        with ThreadPoolExecutor(2) as pool, held_after(b, "now") as hold:
            deciding = pool.submit(decide[decision])
            assert hold.reached.wait(BARRIER_TIMEOUT)
            clock.advance(1)
            confirming = pool.submit(a.execution_confirm, WORKER, _held(held), RUN_TTL)
            wait([confirming], timeout=CONFIRM_CHANCE)
            hold.release.set()
            deciding.result()
            confirmed = confirming.result()
        [event] = [e for e in b.job_events(job.id) if e.kind is not JobEventKind.CREATED]
        stored = a.execution_get(run.id)  # an edit of the schedule deletes it unstarted
        if confirmed:
            assert stored is not None
            [attempt] = stored.attempts
            assert attempt.started_at <= event.at, "started after the decision's instant"
        else:
            assert stored is None or (stored.attempts, stored.started_at) == ((), None)

    @pytest.mark.parametrize("held", ["claim", "outcome"])
    def test_execution_claim__overlap_queue_beside_the_predecessors_outcome_never_strands(
        self, store_pair: tuple[Store, Store], clock: FakeClock, held: str
    ) -> None:
        """A worker claims the next run of an overlap=queue job while another writes the outcome
        of the run before it. Held: the claim after it read that the predecessor runs, before
        it defers the run to wait; or the outcome after its writes (the predecessor deleted from
        the running, its job's waiting runs woken), before its commit. Whichever commits first,
        the next run ends started or due at once, never waiting (until the recheck) for a
        predecessor that has ended: the job's lock, taken first by both, puts them in turn."""
        a, b = store_pair
        first = _start(a, _new(overlap=OverlapPolicy.QUEUE))
        clock.advance(1)
        second = a.job_run_now(first.execution.job_id)
        assert second.id in _ids(_dispatch(a))
        claim = partial(
            (b if held == "claim" else a).execution_claim, [second.id], OTHER_WORKER, RUN_TTL, GRACE
        )
        outcome = partial((a if held == "claim" else b).execution_finish_many, [_ok(first)])
        held_call, other_call = (claim, outcome) if held == "claim" else (outcome, claim)
        hook = "_first_pending" if held == "claim" else "_finish_final"
        with ThreadPoolExecutor(2) as pool, held_after(b, hook) as hold:
            holding = pool.submit(held_call)
            assert hold.reached.wait(BARRIER_TIMEOUT)
            other = pool.submit(other_call)
            wait([other], timeout=CONFIRM_CHANCE)
            hold.release.set()
            holding.result()
            other.result()
        assert _get(a, first.execution.id).status is ExecutionStatus.SUCCEEDED
        stored = _get(a, second.id)
        if stored.status is not ExecutionStatus.RUNNING:
            assert stored.status is ExecutionStatus.SCHEDULED
            assert stored.due_at <= clock.now(), "left waiting for a predecessor that has ended"

    @pytest.mark.parametrize("meanwhile", ["edit", "another reconciler"])
    def test_job_repair_next_runs__a_suspect_repaired_meanwhile_is_repaired_once(
        self, store_pair: tuple[Store, Store], clock: FakeClock, meanwhile: str
    ) -> None:
        """The reconciler reads its page without a lock, so a job it found without its next run
        may have one by the time it writes. Held: the reconciler after that read, inside its
        write transaction, before it locks the job. Meanwhile an edit of the schedule plans the
        job's next run, or another reconciler repairs it. Whichever commits first, the job ends
        with one chain (one planned run, at its next fire time) and at most one repair."""
        a, b = store_pair
        job = a.job_create(_cron("*/5 * * * * *")).job
        with a._tx() as c:  # type: ignore[attr-defined]  # the chain broken behind onbeat's back
            c.execute("DELETE FROM runs")
        leases = _leases(a)

        def repair_meanwhile() -> list[str]:
            if meanwhile == "edit":
                a.job_update(job.id, JobChanges(schedule=Schedule.parse(cron=EVERY_MINUTE)))
                return []
            return a.job_repair_next_runs(leases, None, 1000)[0]

        with ThreadPoolExecutor(2) as pool, held_after(b, "_fenced_shards") as hold:
            reconciling = pool.submit(b.job_repair_next_runs, leases, None, 1000)
            assert hold.reached.wait(BARRIER_TIMEOUT)
            other = pool.submit(repair_meanwhile)
            wait([other], timeout=CONFIRM_CHANCE)
            hold.release.set()
            repaired, _ = reconciling.result()
            repaired_meanwhile = other.result()
        assert len(repaired + repaired_meanwhile) <= 1, "repaired twice"
        _assert_one_chain(a, clock, job.id)
