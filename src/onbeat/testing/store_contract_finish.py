"""Store contract, how a run's lease ends: an outcome (success, retry, dead letter) accepted
only with the current fencing token, a reaped lost attempt, a swept queued run and a release.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import dataclasses

from onbeat.model import AttemptOutcome, ExecutionStatus, JobStatus, RetryPolicy
from onbeat.queue.base import QueueItem
from onbeat.store.base import Completion, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_SECOND,
    FAST_RETRY,
    OTHER_WORKER,
    RUN_TTL,
    WORKER,
    _at,
    _attempt_of,
    _claim,
    _cron,
    _dispatch,
    _failed,
    _get,
    _held,
    _ids,
    _job,
    _leases,
    _new,
    _ok,
    _once,
    _only_run,
    _reap,
    _runs,
    _start,
)

__all__ = ["FinishContract"]


class FinishContract:
    """``execution_finish_many``, ``execution_reap``, ``execution_sweep``, ``execution_requeue``,
    ``execution_release``."""

    # -- execution_finish_many -----------------------------------------------------------------

    def test_execution_finish_many__success(self, store: Store, clock: FakeClock) -> None:
        run = _start(store)
        clock.advance(2)
        assert store.execution_finish_many([_ok(run, {"answer": 42})]) == [run.execution.id]
        done = _get(store, run.execution.id)
        assert done.status is ExecutionStatus.SUCCEEDED
        assert done.result == {"answer": 42}
        assert done.finished_at == clock.now()
        [attempt] = done.attempts
        assert attempt.outcome is AttemptOutcome.SUCCEEDED
        assert attempt.finished_at == clock.now()
        assert store.execution_heartbeat(WORKER, _held(run), RUN_TTL) == {}

    def test_execution_finish_many__failure_with_retry_in_is_retried(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        assert store.execution_finish_many([_failed(run, "boom", retry_in=30.0)]) == [
            run.execution.id
        ]
        waiting = _get(store, run.execution.id)
        assert waiting.status is ExecutionStatus.SCHEDULED
        assert waiting.due_at == _at(clock, 30.0)
        assert waiting.last_error == "boom"
        assert waiting.attempt == 1
        assert _attempt_of(waiting, run.execution.fencing_token) is AttemptOutcome.FAILED
        assert waiting.attempts[0].error == "boom"
        clock.advance(20)
        assert _dispatch(store, window=5) == []
        clock.advance(10)
        assert run.execution.id in _ids(_dispatch(store))
        again = _claim(store, run.execution.id)
        assert again.execution.attempt == 2
        assert again.execution.fencing_token > run.execution.fencing_token
        assert len(_get(store, run.execution.id).attempts) == 2

    def test_execution_finish_many__timeout_is_recorded(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        timed_out = dataclasses.replace(_failed(run, "timed out", retry_in=5.0), timed_out=True)
        assert store.execution_finish_many([timed_out]) == [run.execution.id]
        stored = _get(store, run.execution.id)
        assert _attempt_of(stored, run.execution.fencing_token) is AttemptOutcome.TIMED_OUT
        assert stored.status is ExecutionStatus.SCHEDULED

    def test_execution_finish_many__failure_without_retry_dead_letters(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(task="tasks.fragile", params={"k": 1}, tenant="acme"))
        assert store.execution_finish_many([_failed(run, "kaput")]) == [run.execution.id]
        failed = _get(store, run.execution.id)
        assert failed.status is ExecutionStatus.FAILED
        assert failed.last_error == "kaput"
        assert failed.finished_at == clock.now()
        [letter] = store.dead_letter_list()
        assert letter.execution_id == run.execution.id
        assert letter.job_id == run.execution.job_id
        assert (letter.task, letter.params) == ("tasks.fragile", {"k": 1})
        assert letter.attempts == 1
        assert letter.last_error == "kaput"
        assert store.dead_letter_list(tenant="acme") == [letter]
        assert store.dead_letter_list(tenant="other") == []

    def test_execution_finish_many__stale_token_is_rejected(
        self, store: Store, clock: FakeClock
    ) -> None:
        old = _start(store, _new(retry=FAST_RETRY))
        clock.advance(RUN_TTL + 1)
        assert _ids(_reap(store)) == {old.execution.id}
        clock.advance(FAST_RETRY.backoff_cap + 1)
        _dispatch(store)
        new = _claim(store, old.execution.id, OTHER_WORKER)
        assert new.execution.fencing_token > old.execution.fencing_token
        before = _get(store, old.execution.id)
        assert store.execution_finish_many([_ok(old, "stale")]) == []
        assert store.execution_finish_many([_failed(old, "stale")]) == []
        assert _get(store, old.execution.id) == before, "a stale completion changed the run"
        assert store.dead_letter_list() == []
        assert store.execution_finish_many([_ok(new, "fresh")]) == [new.execution.id]
        assert _get(store, old.execution.id).result == "fresh"

    def test_execution_finish_many__batch_mixes_accepted_and_rejected(
        self, store: Store, clock: FakeClock
    ) -> None:
        r1, r2, r3 = (_start(store) for _ in range(3))
        wrong = dataclasses.replace(_ok(r2), fencing_token=r2.execution.fencing_token + 1)
        unknown = Completion("no-such-execution", 1, succeeded=True)
        accepted = store.execution_finish_many([_ok(r1), wrong, unknown, _failed(r3, retry_in=9.0)])
        assert sorted(accepted) == sorted([r1.execution.id, r3.execution.id])
        assert _get(store, r1.execution.id).status is ExecutionStatus.SUCCEEDED
        assert _get(store, r2.execution.id).status is ExecutionStatus.RUNNING
        assert _get(store, r3.execution.id).status is ExecutionStatus.SCHEDULED

    def test_execution_finish_many__duplicate_completion_in_batch_applies_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        accepted = store.execution_finish_many([_ok(run, "done"), _failed(run, "late")])
        assert accepted == [run.execution.id]
        stored = _get(store, run.execution.id)
        assert stored.status is ExecutionStatus.SUCCEEDED
        assert _attempt_of(stored, run.execution.fencing_token) is AttemptOutcome.SUCCEEDED
        assert store.dead_letter_list() == [], "a succeeded run was dead-lettered"

    def test_execution_finish_many__final_run_completes_one_shot_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        cron_job = store.job_create(_cron(EVERY_SECOND)).job
        clock.advance(1)
        ok = _start(store)
        dead = _start(store, _once(clock.now()))
        cron = _claim(store, _runs(store, cron_job.id)[-1].id)
        assert cron.execution.scheduled_for == clock.now()
        assert _job(store, ok.execution.job_id).status is JobStatus.ACTIVE
        store.execution_finish_many([_ok(ok), _failed(dead), _ok(cron)])
        assert _job(store, ok.execution.job_id).status is JobStatus.COMPLETED
        assert _job(store, dead.execution.job_id).status is JobStatus.COMPLETED
        assert _job(store, cron.execution.job_id).status is JobStatus.ACTIVE

    def test_execution_finish_many__retry_keeps_one_shot_job_active(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        store.execution_finish_many([_failed(run, retry_in=5.0)])
        assert _job(store, run.execution.job_id).status is JobStatus.ACTIVE

    # -- execution_reap ------------------------------------------------------------------------

    def test_execution_reap__expired_lease_is_retried_and_counts(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=FAST_RETRY))
        clock.advance(RUN_TTL + 1)
        [reaped] = _reap(store)
        assert reaped.id == run.execution.id
        assert reaped.status is ExecutionStatus.QUEUED
        assert reaped.due_at <= _at(clock, FAST_RETRY.backoff_cap)
        assert reaped.attempt == 1
        assert reaped.lease_owner is None
        assert _attempt_of(reaped, run.execution.fencing_token) is AttemptOutcome.LOST
        assert _get(store, run.execution.id) == reaped
        assert store.execution_heartbeat(WORKER, _held(run), RUN_TTL) == {}
        assert store.execution_finish_many([_ok(run)]) == []
        assert _reap(store) == []
        clock.advance(FAST_RETRY.backoff_cap + 1)
        again = _claim(store, run.execution.id, OTHER_WORKER)
        assert again.execution.attempt == 2
        assert store.execution_finish_many([_ok(run)]) == []
        assert store.execution_finish_many([_ok(again)]) == [run.execution.id]

    def test_execution_reap__last_attempt_is_dead_lettered(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        clock.advance(RUN_TTL + 1)
        [reaped] = _reap(store)
        assert reaped.status is ExecutionStatus.FAILED
        assert _attempt_of(reaped, run.execution.fencing_token) is AttemptOutcome.LOST
        assert [d.execution_id for d in store.dead_letter_list()] == [run.execution.id]
        assert _job(store, run.execution.job_id).status is JobStatus.COMPLETED

    def test_execution_reap__heartbeated_lease_is_kept(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        for _ in range(3):
            clock.advance(RUN_TTL * 0.8)
            assert store.execution_heartbeat(WORKER, _held(run), RUN_TTL) == _held(run)
        assert _reap(store) == []
        assert _get(store, run.execution.id).status is ExecutionStatus.RUNNING
        clock.advance(RUN_TTL + 1)
        assert _ids(_reap(store)) == {run.execution.id}

    # -- execution_sweep -----------------------------------------------------------------------

    def test_execution_sweep__returns_queued_runs_never_started(
        self, store: Store, clock: FakeClock
    ) -> None:
        t0 = clock.now()
        lost = _only_run(store, store.job_create(_new(priority=4)).job.id)
        running = _start(store)
        assert _get(store, lost.id).status is ExecutionStatus.QUEUED
        clock.advance(120)
        store.execution_heartbeat(WORKER, _held(running), RUN_TTL)
        upcoming = _only_run(store, store.job_create(_once(_at(clock, 5))).job.id)
        assert _ids(_dispatch(store)) == {upcoming.id}
        leases = _leases(store)
        every = list(range(store.shard_count))
        assert store.execution_sweep(leases, every, 60.0, 100).items == [
            QueueItem(lost.id, t0, 4, lost.shard)
        ], "a queued run is swept with its due time, priority and shard"
        assert store.execution_sweep(leases, every, 300.0, 100).items == []
        swept = store.execution_sweep(leases, every, None, 100).items
        assert _ids(swept) == {lost.id, upcoming.id}
        assert running.execution.id not in _ids(swept)
        assert store.execution_sweep(leases, [], None, 100).items == []
        assert _get(store, lost.id).status is ExecutionStatus.QUEUED

    # -- execution_requeue ---------------------------------------------------------------------

    def test_execution_requeue__queued_runs_are_dispatched_again_others_untouched(
        self, store: Store, clock: FakeClock
    ) -> None:
        later = store.job_create(_once(_at(clock, 5))).job
        now = store.job_create(_new()).job
        pending_id, queued_id = _only_run(store, later.id).id, _only_run(store, now.id).id
        assert {pending_id, queued_id} <= _ids(_dispatch(store))
        running = _start(store)
        assert store.execution_requeue([]) == 0
        assert store.execution_requeue([queued_id, running.execution.id, "no-such-run"]) == 1
        requeued = _get(store, queued_id)
        assert (requeued.status, requeued.attempt) == (ExecutionStatus.SCHEDULED, 0)
        assert requeued.due_at == _only_run(store, now.id).scheduled_for  # due as it was
        assert _get(store, running.execution.id).status is ExecutionStatus.RUNNING
        assert _get(store, pending_id).status is ExecutionStatus.QUEUED
        assert _ids(_dispatch(store)) == {queued_id}
        assert store.execution_requeue([queued_id]) == 1  # queued again: requeued again
        assert _claim(store, _ids(_dispatch(store)).pop()).execution.attempt == 1

    # -- execution_release ---------------------------------------------------------------------

    def test_execution_release__run_is_due_again_without_using_an_attempt(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        other = _start(store)
        clock.advance(3)
        wrong = {other.execution.id: other.execution.fencing_token + 1}
        assert store.execution_release(WORKER, wrong) == 0
        assert _get(store, other.execution.id).status is ExecutionStatus.RUNNING
        assert store.execution_release(WORKER, {run.execution.id: run.execution.fencing_token}) == 1
        released = _get(store, run.execution.id)
        assert released.status is ExecutionStatus.SCHEDULED
        assert released.due_at == clock.now()
        assert released.lease_owner is None
        assert _attempt_of(released, run.execution.fencing_token) is AttemptOutcome.RELEASED
        assert store.execution_heartbeat(WORKER, _held(run, other), RUN_TTL) == _held(other)
        assert store.execution_finish_many([_ok(run)]) == []
        assert run.execution.id in _ids(_dispatch(store))
        again = _claim(store, run.execution.id, OTHER_WORKER)
        assert again.execution.attempt == 1, "a released attempt was counted"
        assert again.execution.fencing_token > run.execution.fencing_token
        assert store.execution_finish_many([_ok(run)]) == []
        assert store.execution_finish_many([_ok(again)]) == [run.execution.id]
