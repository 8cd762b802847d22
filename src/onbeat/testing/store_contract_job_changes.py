"""Store contract, changes to a job: pause and resume (with the fire times missed meanwhile),
cancel (pending runs tombstoned, running ones not retried) and edits.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import pytest

from onbeat.errors import ConflictError, NotFoundError
from onbeat.model import ExecutionStatus, JobStatus, MisfirePolicy, RetryPolicy, Trigger
from onbeat.schedule import Schedule
from onbeat.store.base import JobChanges, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    FAST_RETRY,
    GRACE,
    HOURLY,
    RUN_TTL,
    WORKER,
    _at,
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
    _reap,
    _runs,
    _start,
)

__all__ = ["JobChangesContract"]


class JobChangesContract:
    """``job_pause``, ``job_resume``, ``job_cancel`` and ``job_update``."""

    # -- job_pause / job_resume ----------------------------------------------------------------

    def test_job_pause__stops_dispatch_until_resume(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_new()).job
        run = _only_run(store, job.id)
        paused = store.job_pause(job.id)
        assert paused.status is JobStatus.PAUSED
        assert store.job_pause(job.id).status is JobStatus.PAUSED
        clock.advance(5)
        assert _dispatch(store) == []
        assert _get(store, run.id).status is ExecutionStatus.SCHEDULED
        resumed = store.job_resume(job.id, misfire_grace=GRACE)
        assert resumed.status is JobStatus.ACTIVE
        assert _ids(_dispatch(store)) == {run.id}

    def test_job_pause__running_run_finishes(self, store: Store, clock: FakeClock) -> None:
        run = _start(store)
        store.job_pause(run.execution.job_id)
        assert store.execution_heartbeat(WORKER, _held(run), RUN_TTL) == _held(run)
        assert store.execution_finish_many([_ok(run)]) == [run.execution.id]
        assert _get(store, run.execution.id).status is ExecutionStatus.SUCCEEDED

    def test_job_resume__cron_fire_missed_while_paused_is_skipped(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        missed = _only_run(store, job.id)
        store.job_pause(job.id)
        clock.set(clock.now().replace(hour=14, minute=30))
        resumed = store.job_resume(job.id, misfire_grace=GRACE)
        assert resumed.status is JobStatus.ACTIVE
        skipped = _get(store, missed.id)
        assert skipped.status is ExecutionStatus.SKIPPED
        assert skipped.reason
        [pending] = _pending(store, job.id)
        assert pending.status is ExecutionStatus.SCHEDULED
        assert pending.scheduled_for == clock.now().replace(hour=15, minute=0)
        assert resumed.next_fire_at == pending.scheduled_for
        assert _job(store, job.id).next_fire_at == pending.scheduled_for

    def test_job_resume__every_fire_missed_while_paused_is_recorded(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        store.job_pause(job.id)
        clock.set(clock.now().replace(hour=15, minute=30))
        store.job_resume(job.id, misfire_grace=GRACE)
        runs = _runs(store, job.id)
        skipped = sorted(r.scheduled_for.hour for r in runs if r.status is ExecutionStatus.SKIPPED)
        assert skipped == [13, 14, 15]

    def test_job_resume__cron_fire_within_grace_still_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        run = _only_run(store, job.id)
        store.job_pause(job.id)
        clock.set(clock.now().replace(hour=13, minute=0, second=30))
        store.job_resume(job.id, misfire_grace=GRACE)
        assert _get(store, run.id).status is ExecutionStatus.SCHEDULED
        assert run.id in _ids(_dispatch(store))

    def test_job_resume__pending_one_shot_runs(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_once(_at(clock, 60))).job
        run = _only_run(store, job.id)
        store.job_pause(job.id)
        clock.advance(3600)
        store.job_resume(job.id, misfire_grace=GRACE)
        assert run.id in _ids(_dispatch(store))
        assert _claim(store, run.id).execution.status is ExecutionStatus.RUNNING

    def test_job_resume__pending_one_shot_runs_despite_misfire_skip(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 60), misfire=MisfirePolicy.SKIP)).job
        run = _only_run(store, job.id)
        store.job_pause(job.id)
        clock.advance(3600)
        store.job_resume(job.id, misfire_grace=GRACE)
        assert run.id in _ids(_dispatch(store))

    # -- job_cancel ----------------------------------------------------------------------------

    def test_job_cancel__tombstones_pending_runs(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        clock.advance(55)
        _dispatch(store)  # 12:01 queued, 12:02 scheduled
        clock.advance(1)
        manual = store.job_run_now(job.id)
        pending = _pending(store, job.id)
        assert {r.status for r in pending} == {ExecutionStatus.QUEUED, ExecutionStatus.SCHEDULED}
        assert len(pending) == 3
        cancelled = store.job_cancel(job.id)
        assert cancelled.status is JobStatus.CANCELLED
        for run in pending:
            stored = _get(store, run.id)
            assert stored.status is ExecutionStatus.CANCELLED, run
            assert stored.reason
        assert _pending(store, job.id) == []
        assert store.execution_claim([r.id for r in pending], WORKER, RUN_TTL, GRACE).started == []
        clock.advance(120)
        assert _dispatch(store) == []
        assert _pending(store, job.id) == []
        assert _get(store, manual.id).status is ExecutionStatus.CANCELLED

    def test_job_cancel__running_run_continues_but_is_not_retried(
        self, store: Store, clock: FakeClock
    ) -> None:
        ok = _start(store)
        failing = _start(store)
        store.job_cancel(ok.execution.job_id)
        store.job_cancel(failing.execution.job_id)
        assert store.execution_heartbeat(WORKER, _held(ok, failing), RUN_TTL) == _held(ok, failing)
        accepted = store.execution_finish_many([_ok(ok), _failed(failing, retry_in=1.0)])
        assert sorted(accepted) == sorted([ok.execution.id, failing.execution.id])
        assert _get(store, ok.execution.id).status is ExecutionStatus.SUCCEEDED
        stopped = _get(store, failing.execution.id)
        assert stopped.status.is_final, "a cancelled job's run was retried"
        assert stopped.status is not ExecutionStatus.SUCCEEDED
        clock.advance(5)
        assert _dispatch(store) == []

    def test_job_cancel__reaped_run_is_not_retried(self, store: Store, clock: FakeClock) -> None:
        run = _start(store, _new(retry=FAST_RETRY))
        store.job_cancel(run.execution.job_id)
        clock.advance(RUN_TTL + 1)
        [reaped] = _reap(store)
        assert reaped.status.is_final
        assert reaped.status is not ExecutionStatus.SUCCEEDED

    def test_job_cancel__refuses_later_changes(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_new()).job
        store.job_cancel(job.id)
        with pytest.raises(ConflictError):
            store.job_update(job.id, JobChanges(params={"x": 1}))
        with pytest.raises(ConflictError):
            store.job_pause(job.id)
        with pytest.raises(ConflictError):
            store.job_resume(job.id, misfire_grace=GRACE)
        with pytest.raises(ConflictError):
            store.job_run_now(job.id)
        assert _job(store, job.id).status is JobStatus.CANCELLED
        assert _job(store, job.id).params == {}

    def test_job_methods__unknown_job_raises_not_found(
        self, store: Store, clock: FakeClock
    ) -> None:
        with pytest.raises(NotFoundError):
            store.job_update("no-such-job", JobChanges(params={}))
        with pytest.raises(NotFoundError):
            store.job_pause("no-such-job")
        with pytest.raises(NotFoundError):
            store.job_resume("no-such-job", misfire_grace=GRACE)
        with pytest.raises(NotFoundError):
            store.job_cancel("no-such-job")
        with pytest.raises(NotFoundError):
            store.job_run_now("no-such-job")

    # -- job_update ----------------------------------------------------------------------------

    def test_job_update__fields_apply_to_next_claim(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_new(params={"n": 1})).job
        retry = RetryPolicy(max_attempts=9, backoff_base=3.0, backoff_cap=40.0)
        updated = store.job_update(
            job.id, JobChanges(params={"n": 2}, retry=retry, timeout=7.0, priority=6)
        )
        assert (updated.params, updated.retry, updated.timeout, updated.priority) == (
            {"n": 2},
            retry,
            7.0,
            6,
        )
        assert updated.schedule == job.schedule
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SCHEDULED, "a non-schedule edit touched the run"
        assert [i.priority for i in _dispatch(store)] == [6]
        claimed = _claim(store, run.id)
        assert (claimed.params, claimed.retry, claimed.timeout) == ({"n": 2}, retry, 7.0)

    def test_job_update__params_of_running_run_apply_to_its_retry(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(params={"v": 1}))
        store.job_update(run.execution.job_id, JobChanges(params={"v": 2}))
        store.execution_finish_many([_failed(run, retry_in=1.0)])
        clock.advance(1)
        _dispatch(store)
        assert _claim(store, run.execution.id).params == {"v": 2}

    def test_job_update__new_schedule_replaces_pending_schedule_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        clock.advance(55)
        _dispatch(store)  # 12:01 queued, 12:02 scheduled
        clock.advance(1)
        manual = store.job_run_now(job.id)
        old = [r for r in _pending(store, job.id) if r.trigger is Trigger.SCHEDULE]
        assert len(old) == 2
        updated = store.job_update(job.id, JobChanges(schedule=Schedule.parse(cron="*/5 * * * *")))
        new_fire = clock.now().replace(minute=5, second=0)
        assert updated.schedule.expression == "*/5 * * * *"
        assert updated.next_fire_at == new_fire
        for run in old:  # fire times of the old schedule after the edit were never due
            assert store.execution_get(run.id) is None
        pending = _pending(store, job.id)
        assert {(r.trigger, r.scheduled_for) for r in pending} == {
            (Trigger.SCHEDULE, new_fire),
            (Trigger.MANUAL, manual.scheduled_for),
        }
        assert store.execution_claim(list(_ids(old)), WORKER, RUN_TTL, GRACE).started == []

    def test_job_update__new_schedule_with_same_first_fire_keeps_a_pending_run(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        fire = _only_run(store, job.id).scheduled_for
        updated = store.job_update(job.id, JobChanges(schedule=Schedule.parse(cron="0 13 * * *")))
        assert updated.next_fire_at == fire
        [pending] = _pending(store, job.id)
        assert pending.scheduled_for == fire
        clock.set(fire)
        assert pending.id in _ids(_dispatch(store))

    def test_job_update__new_schedule_on_completed_one_shot_plans_it(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store)
        store.execution_finish_many([_ok(run)])
        job_id = run.execution.job_id
        assert _job(store, job_id).status is JobStatus.COMPLETED
        at = _at(clock, 30)
        store.job_update(job_id, JobChanges(schedule=Schedule.parse(at=at)))
        [pending] = _pending(store, job_id)
        assert pending.scheduled_for == at
        clock.advance(30)
        assert pending.id in _ids(_dispatch(store))
