"""Store contract, history: final runs leave the hot state and stay readable; a fire time that
has a final record is never planned again; retention drops old history, never a day that holds an
unresolved dead letter or a run not final yet.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from onbeat.model import ExecutionStatus, RetryPolicy, Trigger
from onbeat.schedule import Schedule
from onbeat.store.base import HistoryUpkeep, JobChanges, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    StoreFactory,
    _claim,
    _cron,
    _dispatch,
    _failed,
    _get,
    _job,
    _new,
    _ok,
    _only_run,
    _runs,
    _start,
)

__all__ = ["HistoryContract"]

RETENTION_DAYS = 30
EVERY_TEN_SECONDS = "*/10 * * * * *"


class HistoryContract:
    """Runs moved to the history on their final state; ``history_maintain``."""

    def test_history__a_final_run_is_read_as_before(self, store: Store, clock: FakeClock) -> None:
        run = _start(store)
        store.execution_finish_many([_ok(run, {"answer": 42})])
        got = _get(store, run.execution.id)
        assert (got.status, got.result, got.attempt) == (
            ExecutionStatus.SUCCEEDED,
            {"answer": 42},
            1,
        )
        assert [a.outcome.value for a in got.attempts] == ["succeeded"]
        assert [e.id for e in _runs(store, run.execution.job_id)] == [run.execution.id]
        listed = store.execution_list(run.execution.job_id, status=ExecutionStatus.SUCCEEDED)
        assert [e.id for e in listed] == [run.execution.id]
        since = run.execution.scheduled_for - timedelta(seconds=1)
        assert store.execution_fire_records(run.execution.job_id, since, clock.now()) == [
            (run.execution.scheduled_for, ExecutionStatus.SUCCEEDED)
        ]
        assert store.execution_last_of_jobs([run.execution.job_id])[run.execution.job_id].id == (
            run.execution.id
        )

    def _ran_first_fire(self, store: Store, clock: FakeClock) -> tuple[str, str]:
        """A job every ten seconds whose first fire time (12:00:10) ran and succeeded: its record
        is in the history. Returns (job id, run id)."""
        job = store.job_create(_cron(EVERY_TEN_SECONDS)).job
        first = _only_run(store, job.id)
        clock.set(first.due_at)
        assert first.id in {i.execution_id for i in _dispatch(store)}
        store.execution_finish_many([_ok(_claim(store, first.id))])
        return job.id, first.id

    def _records_at(self, store: Store, job_id: str) -> dict[int, int]:
        """Second of the minute -> how many schedule runs of the job fire then."""
        counts: dict[int, int] = {}
        for run in _runs(store, job_id):
            if run.trigger is Trigger.SCHEDULE:
                counts[run.scheduled_for.second] = counts.get(run.scheduled_for.second, 0) + 1
        return counts

    def test_history__an_edit_never_plans_again_a_fire_time_that_ran(
        self, store: Store, clock: FakeClock
    ) -> None:
        """The clock stepped back (a stepped host clock, a failover) before an edit to the same
        schedule: its first fire time already has a final record, so the edit plans past it."""
        job_id, first = self._ran_first_fire(store, clock)
        ran_at = _get(store, first).scheduled_for
        clock.step_back((clock.now() - ran_at).total_seconds() + 9)
        edited = store.job_update(
            job_id, JobChanges(schedule=Schedule.parse(cron=EVERY_TEN_SECONDS))
        )
        assert edited.next_fire_at == ran_at + timedelta(seconds=10)
        assert self._records_at(store, job_id) == {10: 1, 20: 1}

    def test_history__materialisation_never_plans_again_a_fire_time_that_ran(
        self, store: Store, clock: FakeClock
    ) -> None:
        """The dispatcher's next fire time has a final record: it plans the one after instead."""
        job_id, first = self._ran_first_fire(store, clock)
        ran_at = _get(store, first).scheduled_for
        clock.step_back(
            (clock.now() - ran_at).total_seconds() + 9
        )  # 12:00:01: the next five-second fire is 12:00:05
        every_five = Schedule.parse(cron="*/5 * * * * *")
        assert store.job_update(job_id, JobChanges(schedule=every_five)).next_fire_at == (
            ran_at - timedelta(seconds=5)
        )
        clock.set(ran_at - timedelta(seconds=5))
        _dispatch(store, window=0)  # 12:00:05 queued; its next fire, 12:00:10, ran already
        assert _job(store, job_id).next_fire_at == ran_at + timedelta(seconds=5)
        assert self._records_at(store, job_id) == {5: 1, 10: 1, 15: 1}
        assert _get(store, first).status is ExecutionStatus.SUCCEEDED

    def test_history__retention_drops_old_days_and_keeps_dead_letters_and_live_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        old_ok = _start(store)  # day 0: succeeded, dropped by retention
        store.execution_finish_many([_ok(old_ok)])
        clock.advance(timedelta(days=1).total_seconds())
        dead = _start(store, _new(retry=RetryPolicy(max_attempts=1)))  # day 1: a dead letter
        store.execution_finish_many([_failed(dead)])
        clock.advance(timedelta(days=1).total_seconds())
        live = _only_run(store, store.job_create(_new()).job.id)  # day 2: never started
        clock.advance(timedelta(days=RETENTION_DAYS + 5).total_seconds())
        recent = _start(store)  # today: kept
        store.execution_finish_many([_ok(recent)])

        upkeep = store.history_maintain(RETENTION_DAYS, ahead_days=2)
        assert isinstance(upkeep, HistoryUpkeep)
        assert store.execution_get(old_ok.execution.id) is None
        kept = _get(store, dead.execution.id)
        assert (kept.status, len(kept.attempts)) == (ExecutionStatus.FAILED, 1)
        assert [d.execution_id for d in store.dead_letter_list()] == [dead.execution.id]
        assert not _get(store, live.id).status.is_final
        assert len(_get(store, recent.execution.id).attempts) == 1
        assert len(upkeep.kept) == 2  # day 1 (dead letter) and day 2 (a run not final)

        store.dead_letter_drop(dead.execution.id)  # a human decided
        store.history_maintain(RETENTION_DAYS, ahead_days=2)
        assert store.execution_get(dead.execution.id) is None
        assert not _get(store, live.id).status.is_final
        assert store.history_maintain(0, ahead_days=2).kept == []  # 0: keep forever
        assert _get(store, recent.execution.id).status is ExecutionStatus.SUCCEEDED

    def test_history__a_replayed_dead_letter_keeps_its_day_until_it_ended_a_retention_ago(
        self, store: Store, clock: FakeClock
    ) -> None:
        dead = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        store.execution_finish_many([_failed(dead)])
        clock.advance(timedelta(days=RETENTION_DAYS + 2).total_seconds())
        store.dead_letter_replay(dead.execution.id)  # back to the hot state, its old fire time
        store.history_maintain(RETENTION_DAYS, ahead_days=1)
        replayed = _get(store, dead.execution.id)
        assert replayed.status is ExecutionStatus.SCHEDULED
        assert len(replayed.attempts) == 1  # its day's attempts are kept with it
        again = _claim(store, next(iter({i.execution_id for i in _dispatch(store)})))
        assert store.execution_finish_many([_ok(again)]) == [dead.execution.id]
        assert _get(store, dead.execution.id).status is ExecutionStatus.SUCCEEDED
        store.history_maintain(RETENTION_DAYS, ahead_days=1)  # it ended within the retention
        assert _get(store, dead.execution.id).status is ExecutionStatus.SUCCEEDED

    def test_history__maintained_by_two_stores_at_once(
        self, store_factory: StoreFactory, tmp_path: Path, clock: FakeClock
    ) -> None:
        """Two schedulers' timers fire together: each partition is created (and each expired
        day dropped) once, neither pass fails, and the outcome is that of one pass."""
        with store_factory(tmp_path, clock) as open_another:
            stores = [open_another(), open_another()]
            old = _start(stores[0])
            stores[0].execution_finish_many([_ok(old)])
            stores[0].history_maintain(RETENTION_DAYS, ahead_days=3)  # that day's partitions
            clock.advance(timedelta(days=RETENTION_DAYS + 3).total_seconds())
            barrier = threading.Barrier(2)
            upkeeps: list[HistoryUpkeep] = []
            errors: list[BaseException] = []

            def maintain(store: Store) -> None:
                barrier.wait()
                try:
                    upkeeps.append(store.history_maintain(RETENTION_DAYS, ahead_days=3))
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=maintain, args=(s,)) for s in stores]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            created = [name for u in upkeeps for name in u.created]
            dropped = [name for u in upkeeps for name in u.dropped]
            assert len(created) == len(set(created)) and len(dropped) == len(set(dropped))
            assert stores[1].execution_get(old.execution.id) is None
            assert stores[1].history_maintain(RETENTION_DAYS, ahead_days=3).created == []
