"""Store contract, claims: a queued run starts once, with a lease and a new fencing token, as
the overlap and misfire policies allow; paused, cancelled or not yet due runs do not start.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import pytest

from onbeat.model import (
    PENDING_STATUSES,
    AttemptOutcome,
    Execution,
    ExecutionStatus,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.queue.base import QueueItem
from onbeat.store.base import ClaimedRun, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    GRACE,
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
    _new,
    _ok,
    _once,
    _only_run,
    _pending,
    _start,
)

__all__ = ["ClaimContract"]


class ClaimContract:
    """``execution_claim`` with the overlap and misfire policies."""

    # -- execution_claim -----------------------------------------------------------------------

    def test_execution_claim__starts_queued_run_with_lease(
        self, store: Store, clock: FakeClock
    ) -> None:
        retry = RetryPolicy(max_attempts=5, backoff_base=2.0, backoff_cap=30.0)
        job = store.job_create(
            _new(task="tasks.mail", params={"to": "a@b.c"}, timeout=4.5, retry=retry)
        ).job
        before = _only_run(store, job.id)
        _dispatch(store)
        result = store.execution_claim([before.id], WORKER, 25.0, GRACE)
        assert result.not_due == []
        [run] = result.started
        assert (run.task, run.params, run.timeout, run.retry) == (
            "tasks.mail",
            {"to": "a@b.c"},
            4.5,
            retry,
        )
        assert run.replaced == ()
        for execution in (run.execution, _get(store, before.id)):
            assert execution.id == before.id
            assert execution.status is ExecutionStatus.RUNNING
            assert execution.lease_owner == WORKER
            assert execution.lease_expires_at == _at(clock, 25.0)
            assert execution.attempt == 1
            assert execution.fencing_token > before.fencing_token
        stored = _get(store, before.id)
        assert stored.fencing_token == run.execution.fencing_token
        assert stored.started_at == clock.now()
        [attempt] = stored.attempts
        assert attempt.attempt == 1
        assert attempt.worker == WORKER
        assert attempt.fencing_token == run.execution.fencing_token
        assert attempt.started_at == clock.now()
        assert attempt.finished_at is None
        assert attempt.outcome is AttemptOutcome.RUNNING

    def test_execution_claim__batch_starts_each_due_run(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = [_only_run(store, store.job_create(_new()).job.id).id for _ in range(3)]
        _dispatch(store)
        result = store.execution_claim([*ids, "no-such-execution"], WORKER, RUN_TTL, GRACE)
        assert _ids(result.started) == set(ids)
        tokens = {r.execution.id: r.execution.fencing_token for r in result.started}
        assert store.execution_heartbeat(WORKER, tokens, RUN_TTL) == tokens

    def test_execution_claim__running_run_is_not_started_again(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        for owner in (WORKER, OTHER_WORKER):
            result = store.execution_claim([run.execution.id], owner, RUN_TTL, GRACE)
            assert result.started == []
            assert result.not_due == []
        stored = _get(store, run.execution.id)
        assert stored.lease_owner == WORKER
        assert stored.fencing_token == run.execution.fencing_token
        assert len(stored.attempts) == 1

    def test_execution_claim__run_not_dispatched_is_not_started(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _only_run(store, store.job_create(_new()).job.id)
        result = store.execution_claim([run.id], WORKER, RUN_TTL, GRACE)
        assert result.started == []
        assert _get(store, run.id).status is ExecutionStatus.SCHEDULED

    def test_execution_claim__not_due_by_store_clock_is_handed_back(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 5), priority=2)).job
        run = _only_run(store, job.id)
        assert _ids(_dispatch(store)) == {run.id}
        result = store.execution_claim([run.id], WORKER, RUN_TTL, GRACE)
        assert result.started == []
        assert result.not_due == [QueueItem(run.id, run.due_at, 2, run.shard)]
        assert _get(store, run.id).status is ExecutionStatus.QUEUED
        clock.advance(5)
        assert _claim(store, run.id).execution.status is ExecutionStatus.RUNNING

    def test_execution_claim__paused_job_run_waits_for_resume(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new()).job
        run = _only_run(store, job.id)
        _dispatch(store)
        store.job_pause(job.id)
        assert store.execution_claim([run.id], WORKER, RUN_TTL, GRACE).started == []
        assert _get(store, run.id).status in PENDING_STATUSES
        assert _get(store, run.id).attempts == ()
        clock.advance(1)
        assert run.id not in _ids(_dispatch(store)), "dispatched a paused job's run"
        store.job_resume(job.id, misfire_grace=GRACE)
        clock.advance(1)
        if _get(store, run.id).status is ExecutionStatus.SCHEDULED:
            assert run.id in _ids(_dispatch(store))
        assert _claim(store, run.id).execution.attempt == 1

    def test_execution_claim__cancelled_job_run_is_not_started(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new()).job
        run = _only_run(store, job.id)
        _dispatch(store)
        store.job_cancel(job.id)
        assert store.execution_claim([run.id], WORKER, RUN_TTL, GRACE).started == []
        stored = _get(store, run.id)
        assert stored.status is ExecutionStatus.CANCELLED
        assert stored.reason
        assert stored.attempts == ()

    # -- overlap policies ----------------------------------------------------------------------

    @staticmethod
    def _overlap(
        store: Store, clock: FakeClock, overlap: OverlapPolicy
    ) -> tuple[ClaimedRun, Execution, list[ClaimedRun]]:
        """A job with a run still running, and a second (manual) run of it claimed."""
        first = _start(store, _new(overlap=overlap))
        clock.advance(1)
        second = store.job_run_now(first.execution.job_id)
        assert second.id in _ids(_dispatch(store))
        started = store.execution_claim([second.id], OTHER_WORKER, RUN_TTL, GRACE).started
        return first, second, started

    def test_execution_claim__overlap_skip_records_skip(
        self, store: Store, clock: FakeClock
    ) -> None:
        first, second, started = self._overlap(store, clock, OverlapPolicy.SKIP)
        assert started == []
        stored = _get(store, second.id)
        assert stored.status is ExecutionStatus.SKIPPED
        assert stored.reason
        assert stored.attempts == ()
        assert _get(store, first.execution.id).status is ExecutionStatus.RUNNING

    def test_execution_claim__overlap_queue_waits_for_predecessor(
        self, store: Store, clock: FakeClock
    ) -> None:
        first, second, started = self._overlap(store, clock, OverlapPolicy.QUEUE)
        assert started == []
        waiting = _get(store, second.id)
        assert waiting.status is ExecutionStatus.SCHEDULED
        assert waiting.due_at > clock.now()
        assert waiting.attempts == ()
        assert _get(store, first.execution.id).status is ExecutionStatus.RUNNING
        assert store.execution_finish_many([_ok(first)]) == [first.execution.id]
        clock.advance(1)
        assert second.id in _ids(_dispatch(store))
        run = _claim(store, second.id, OTHER_WORKER)
        assert run.execution.attempt == 1

    @pytest.mark.parametrize("final", [True, False], ids=["final", "retried"])
    def test_execution_claim__predecessors_outcome_wakes_the_waiting_run(
        self, store: Store, clock: FakeClock, final: bool
    ) -> None:
        """The run waiting for a predecessor is due the moment the predecessor's outcome is
        written (not at its recheck), whether the predecessor ends or is retried."""
        first, second, _ = self._overlap(store, clock, OverlapPolicy.QUEUE)
        assert _get(store, second.id).due_at > clock.now()
        outcome = _ok(first) if final else _failed(first, "boom", retry_in=30.0)
        assert store.execution_finish_many([outcome]) == [first.execution.id]
        assert _get(store, second.id).due_at == clock.now()

    def test_execution_claim__overlap_allow_runs_both(self, store: Store, clock: FakeClock) -> None:
        first, second, started = self._overlap(store, clock, OverlapPolicy.ALLOW)
        assert _ids(started) == {second.id}
        assert _get(store, first.execution.id).status is ExecutionStatus.RUNNING
        assert _get(store, second.id).status is ExecutionStatus.RUNNING
        assert started[0].replaced == ()

    def test_execution_claim__overlap_replace_cancels_and_fences_old_run(
        self, store: Store, clock: FakeClock
    ) -> None:
        first, second, started = self._overlap(store, clock, OverlapPolicy.REPLACE)
        [run] = started
        assert run.execution.id == second.id
        assert run.replaced == (first.execution.id,)
        old = _get(store, first.execution.id)
        assert old.status is ExecutionStatus.CANCELLED
        assert old.reason
        assert _attempt_of(old, first.execution.fencing_token) is AttemptOutcome.CANCELLED
        assert store.execution_finish_many([_ok(first)]) == []
        assert _get(store, first.execution.id).status is ExecutionStatus.CANCELLED
        assert store.execution_heartbeat(WORKER, _held(first), RUN_TTL) == {}
        assert _get(store, second.id).status is ExecutionStatus.RUNNING

    # -- misfire applied to runs a scheduler already saw (bugs) --------------------------------

    def test_execution_release__old_run_is_not_misfire_skipped(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(misfire=MisfirePolicy.SKIP))
        clock.advance(GRACE * 2)
        store.execution_heartbeat(WORKER, _held(run), RUN_TTL)
        store.execution_release(WORKER, {run.execution.id: run.execution.fencing_token})
        assert _ids(_dispatch(store)) == {run.execution.id}

    def test_execution_claim__overlap_queue_long_wait_is_not_misfire_skipped(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(
            _cron(EVERY_MINUTE, overlap=OverlapPolicy.QUEUE, misfire=MisfirePolicy.SKIP)
        ).job
        first_run = _only_run(store, job.id)
        clock.set(first_run.scheduled_for)
        _dispatch(store)
        first = _claim(store, first_run.id)
        clock.advance(60)
        _dispatch(store)
        [second] = [r for r in _pending(store, job.id) if r.scheduled_for == clock.now()]
        assert store.execution_claim([second.id], OTHER_WORKER, RUN_TTL, GRACE).started == []
        for _ in range(int(GRACE * 2 / 5)):  # the predecessor runs on for two more minutes
            clock.advance(5)
            store.execution_heartbeat(WORKER, _held(first), RUN_TTL)
            waiting = [i.execution_id for i in _dispatch(store)]
            assert store.execution_claim(waiting, OTHER_WORKER, RUN_TTL, GRACE).started == []
        assert store.execution_finish_many([_ok(first)]) == [first.execution.id]
        clock.advance(1)
        _dispatch(store)
        assert _get(store, second.id).status is not ExecutionStatus.SKIPPED
        assert _claim(store, second.id, OTHER_WORKER).execution.attempt == 1

    def test_execution_claim__overlap_skip_of_one_shot_run_completes_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 60))).job
        manual = store.job_run_now(job.id)
        _dispatch(store)
        _claim(store, manual.id)
        clock.advance(60)
        [scheduled] = [r for r in _pending(store, job.id) if r.trigger is Trigger.SCHEDULE]
        assert scheduled.id in _ids(_dispatch(store))
        assert store.execution_claim([scheduled.id], OTHER_WORKER, RUN_TTL, GRACE).started == []
        assert _get(store, scheduled.id).status is ExecutionStatus.SKIPPED
        assert _job(store, job.id).status is JobStatus.COMPLETED
