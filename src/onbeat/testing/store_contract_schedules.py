"""Store contract, schedule chains: an edit, a pause, a stall or a lost queue never ends a job's
schedule, every fire time gets exactly one record, and the misfire policy picks which missed ones run.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
``Simulated`` plays a healthy scheduler and worker through the Store protocol alone, so each
test states only its scenario.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from onbeat.audit import audit, expected_fire_times
from onbeat.model import ExecutionStatus, Job, JobStatus, MisfirePolicy, OverlapPolicy, Trigger
from onbeat.plan import MAX_FIRES_PER_DISPATCH
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.base import Completion, JobChanges, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    EVERY_SECOND,
    GRACE,
    HOURLY,
    RUN_TTL,
    WORKER,
    StoreFactory,
    _cron,
    _dispatch,
    _get,
    _job,
    _leases,
    _runs,
)


@dataclass
class Simulated:
    """A healthy scheduler and worker: each ``tick`` dispatches, then starts and finishes every
    run that is due. ``queue`` is the delay queue; clearing it is a queue lost in an outage."""

    store: Store
    clock: FakeClock
    queue: dict[str, QueueItem] = field(default_factory=dict)

    def tick(self, *, run: bool = True) -> None:
        for item in _dispatch(self.store):
            self.queue[item.execution_id] = item
        if not run:
            return
        now = self.clock.now()
        due = [i for i in self.queue.values() if i.due_at <= now]
        while due:
            for item in due:
                del self.queue[item.execution_id]
            claim = self.store.execution_claim(
                [i.execution_id for i in due], WORKER, RUN_TTL, GRACE
            )
            for item in claim.not_due:
                self.queue[item.execution_id] = item
            self.store.execution_finish_many(
                [
                    Completion(r.execution.id, r.execution.fencing_token, succeeded=True)
                    for r in claim.started
                ]
            )
            # runs deferred behind a backlog are planned again; hand them back at once
            for item in _dispatch(self.store):
                self.queue[item.execution_id] = item
            self.clock.advance(0.5)
            now = self.clock.now()
            due = [i for i in self.queue.values() if i.due_at <= now]

    def run_for(self, seconds: float, step: float) -> None:
        end = self.clock.now() + timedelta(seconds=seconds)
        while self.clock.now() < end:
            self.clock.advance(step)
            self.tick()


def assert_chain_intact(store: Store, job_id: str) -> None:
    """An active cron job has exactly one planned (scheduled) schedule run, at its next fire."""
    job = _job(store, job_id)
    if job.status is not JobStatus.ACTIVE or job.schedule.kind is not ScheduleKind.CRON:
        return
    planned = [
        r
        for r in _runs(store, job_id)
        if r.trigger is Trigger.SCHEDULE
        and r.status is ExecutionStatus.SCHEDULED
        and r.attempt == 0
    ]
    heads = [r for r in planned if r.scheduled_for == job.next_fire_at]
    assert len(heads) == 1, (job.next_fire_at, [(r.scheduled_for, r.status) for r in planned])


def fires_between(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    fires, fire = [], schedule.next_fire_after(after)
    while fire is not None and fire <= until:
        fires.append(fire)
        fire = schedule.next_fire_after(fire)
    return fires


def statuses_by_fire(store: Store, job_id: str) -> dict[datetime, ExecutionStatus]:
    runs = [r for r in store.execution_list(job_id, limit=100_000) if r.trigger is Trigger.SCHEDULE]
    assert len({r.scheduled_for for r in runs}) == len(runs), "a fire time has two records"
    return {r.scheduled_for: r.status for r in runs}


def _today(clock: FakeClock, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return clock.now().replace(hour=hour, minute=minute, second=second, microsecond=0)


def _stall(store: Store, clock: FakeClock, job: Job, hours: float) -> None:
    """The scheduler stops for ``hours``; the job's chain head is left in the past."""
    clock.advance(hours * 3600)
    assert _job(store, job.id).next_fire_at is not None


class ScheduleChainContract:
    # -- edits (bug: an edit could end a job for good) ------------------------------------------

    def test_job_update__adding_a_fire_time_keeps_the_schedule_going(
        self, store: Store, clock: FakeClock
    ) -> None:
        """0 * * * * edited to 0,30 * * * * at 12:10: 12:30 ran, then nothing ever again."""
        sim = Simulated(store, clock)
        job = store.job_create(_cron(HOURLY)).job
        sim.run_for(600, step=5)  # 12:10
        store.job_update(job.id, JobChanges(schedule=Schedule.parse(cron="0,30 * * * *")))
        assert_chain_intact(store, job.id)
        sim.run_for(3 * 3600, step=5)
        recorded = statuses_by_fire(store, job.id)
        edited_at = clock.now() - timedelta(hours=3)
        expected = fires_between(Schedule.parse(cron="0,30 * * * *"), edited_at, clock.now())
        assert len(expected) == 6
        assert all(recorded.get(f) is ExecutionStatus.SUCCEEDED for f in expected), recorded
        assert_chain_intact(store, job.id)

    @pytest.mark.parametrize("seconds_before", [1, 5, 9])
    def test_job_update__near_a_shared_fire_time_keeps_the_schedule_going(
        self, store: Store, clock: FakeClock, seconds_before: int
    ) -> None:
        """An edit within the dispatch window of a fire time both schedules share: that fire
        time is already queued, so the new schedule's chain must go on after it."""
        sim = Simulated(store, clock)
        job = store.job_create(_cron("*/5 * * * *")).job
        sim.run_for(300 - seconds_before, step=1)  # the 12:05 run is queued, not yet due
        assert any(r.status is ExecutionStatus.QUEUED for r in _runs(store, job.id))
        store.job_update(
            job.id,
            JobChanges(schedule=Schedule.parse(cron="*/5 * * * *", timezone="Europe/Berlin")),
        )
        assert_chain_intact(store, job.id)
        sim.run_for(1800, step=5)
        recorded = statuses_by_fire(store, job.id)
        start = clock.now().replace(minute=0)
        for fire in fires_between(Schedule.parse(cron="*/5 * * * *"), start, clock.now()):
            assert recorded.get(fire) is ExecutionStatus.SUCCEEDED, (fire, recorded)
        assert_chain_intact(store, job.id)

    def test_job_update__after_a_stall_the_old_schedules_fire_times_get_records(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY, misfire=MisfirePolicy.SKIP)).job
        _stall(store, clock, job, hours=3.5)  # 13:00, 14:00, 15:00 never planned
        store.job_update(job.id, JobChanges(schedule=Schedule.parse(cron="15 * * * *")))
        Simulated(store, clock).run_for(3600, step=10)
        recorded = statuses_by_fire(store, job.id)
        for hour in (13, 14, 15):
            assert recorded.get(_today(clock, hour)) is ExecutionStatus.SKIPPED, recorded
        assert recorded.get(_today(clock, 16, 15)) is ExecutionStatus.SUCCEEDED
        assert_chain_intact(store, job.id)

    def test_job_cancel__after_a_stall_every_fire_time_has_a_record(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        _stall(store, clock, job, hours=3.5)
        store.job_cancel(job.id)
        recorded = statuses_by_fire(store, job.id)
        assert sorted(f.hour for f in recorded) == [13, 14, 15]
        assert set(recorded.values()) == {ExecutionStatus.CANCELLED}

    def test_job_pause__after_a_stall_every_fire_time_until_the_pause_has_a_record(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(HOURLY)).job
        _stall(store, clock, job, hours=3.5)  # 13:00, 14:00, 15:00 never planned
        store.job_pause(job.id)
        assert sorted(f.hour for f in statuses_by_fire(store, job.id)) == [13, 14, 15]
        clock.advance(600)
        store.job_resume(job.id, misfire_grace=GRACE)
        Simulated(store, clock).run_for(3600, step=10)
        recorded = statuses_by_fire(store, job.id)
        assert all(recorded[_today(clock, hour)].is_final for hour in (13, 14, 15)), recorded
        assert recorded.get(_today(clock, 16)) is ExecutionStatus.SUCCEEDED
        assert_chain_intact(store, job.id)

    # -- misfire: which missed fire times run -----------------------------------------------------

    @pytest.mark.parametrize(
        ("misfire", "ran_hours"),
        [
            (MisfirePolicy.RUN_ONCE, [15]),  # the most recent missed fire time
            (MisfirePolicy.RUN_ALL, [14, 15]),  # those inside the 2 h catch-up window
            (MisfirePolicy.SKIP, []),
        ],
    )
    def test_execution_dispatch__a_stall_runs_what_the_misfire_policy_picks(
        self,
        store: Store,
        clock: FakeClock,
        misfire: MisfirePolicy,
        ran_hours: list[int],
    ) -> None:
        job = store.job_create(_cron(HOURLY, misfire=misfire, catchup_window=7200.0)).job
        _stall(store, clock, job, hours=3.5)  # back at 15:30
        Simulated(store, clock).run_for(60, step=5)
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        ran = sorted(h for h, r in runs.items() if r.status is ExecutionStatus.SUCCEEDED)
        assert ran == ran_hours
        assert all(runs[h].catchup for h in ran)
        for hour in {13, 14, 15} - set(ran):
            assert runs[hour].status is ExecutionStatus.SKIPPED
            assert "misfire" in (runs[hour].reason or "")
        assert_chain_intact(store, job.id)

    @pytest.mark.parametrize("misfire", list(MisfirePolicy))
    def test_execution_claim__runs_queued_before_an_outage_obey_the_misfire_policy(
        self, store: Store, clock: FakeClock, misfire: MisfirePolicy
    ) -> None:
        """Runs already queued when the node died come back through the sweep after the outage:
        the misfire policy applies to them where they start, not only where they are planned."""
        job = store.job_create(_cron(EVERY_MINUTE, misfire=misfire, catchup_window=600.0)).job
        clock.advance(55)
        queued = _dispatch(store, window=200.0)  # 12:01 .. 12:04 queued, 12:05 planned
        assert len(queued) == 4
        clock.advance(3600)  # the outage: the queue is lost, nothing runs
        sim = Simulated(store, clock, {i.execution_id: i for i in queued})  # the sweep refills it
        sim.tick()
        assert [_get(store, i.execution_id).status for i in queued] == [ExecutionStatus.SKIPPED] * 4
        runs = [r for r in _runs(store, job.id) if r.status is ExecutionStatus.SUCCEEDED]
        catchups = [r for r in runs if r.catchup]
        # run_once: the most recent missed minute; run_all: the missed minutes inside the 10 min
        # catch-up window (12:51 .. 12:59); skip: none. The on-time 13:00 runs in every case.
        assert len(catchups) == {MisfirePolicy.RUN_ONCE: 1, MisfirePolicy.RUN_ALL: 9}.get(
            misfire, 0
        )
        assert _today(clock, 13) in {r.scheduled_for for r in runs if not r.catchup}
        assert_chain_intact(store, job.id)

    def test_execution_claim__run_all_runs_queued_runs_inside_the_catchup_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE, misfire=MisfirePolicy.RUN_ALL)).job
        clock.advance(55)
        queued = _dispatch(store, window=200.0)
        clock.advance(300)  # down 5 minutes: inside the default 1 h catch-up window
        Simulated(store, clock, {i.execution_id: i for i in queued}).tick()
        for item in queued:
            run = _get(store, item.execution_id)
            assert run.status is ExecutionStatus.SUCCEEDED
            assert run.catchup
        assert_chain_intact(store, job.id)

    def test_execution_dispatch__a_long_outage_records_every_fire_time(
        self, store: Store, clock: FakeClock
    ) -> None:
        """An every-second cron down longer than one dispatch walks: no fire time is jumped."""
        job = store.job_create(_cron(EVERY_SECOND, misfire=MisfirePolicy.SKIP)).job
        down = MAX_FIRES_PER_DISPATCH + 500
        clock.advance(down)
        for _ in range(4):
            _dispatch(store)
        recorded = statuses_by_fire(store, job.id)
        expected = fires_between(job.schedule, job.created_at, clock.now())
        assert [f for f in expected if f not in recorded] == []
        assert_chain_intact(store, job.id)

    # -- overlap x backlog --------------------------------------------------------------------------

    @pytest.mark.parametrize("overlap", list(OverlapPolicy))
    def test_execution_claim__a_backlog_runs_in_fire_time_order_not_skipped_as_overlap(
        self, store: Store, clock: FakeClock, overlap: OverlapPolicy
    ) -> None:
        """A stall's fire times within the grace all come due at once: each waits for the one
        before it instead of being skipped as "overlapping" a run that started after it."""
        job = store.job_create(_cron("*/10 * * * * *", overlap=overlap)).job
        clock.advance(45)  # 12:00:10 .. 12:00:40 missed by less than the grace
        sim = Simulated(store, clock)
        sim.tick()
        sim.run_for(20, step=1)
        recorded = statuses_by_fire(store, job.id)
        for second in (10, 20, 30, 40, 50, 0):
            fire = _today(clock, 12, 0 if second else 1, second)
            assert recorded.get(fire) is ExecutionStatus.SUCCEEDED, (fire, recorded)
        assert_chain_intact(store, job.id)

    def test_execution_claim__a_backlog_waits_for_its_earlier_fire_times_in_any_claim_order(
        self, store: Store, clock: FakeClock
    ) -> None:
        """After a stall, the queue may hand out a later fire time first (e.g. a takeover sweep
        re-enqueues the older ones after dispatch queued the newer): the later one waits."""
        job = store.job_create(_cron("*/10 * * * * *")).job
        clock.advance(35)  # 12:00:10, :20, :30 came due during a stall (within the grace)
        first, second, third = sorted(_dispatch(store), key=lambda i: i.due_at)[:3]
        assert store.execution_claim([third.execution_id], WORKER, RUN_TTL, GRACE).started == []
        waiting = _get(store, third.execution_id)
        assert waiting.status is ExecutionStatus.SCHEDULED
        assert first.execution_id in (waiting.reason or "")
        [started] = store.execution_claim(
            [first.execution_id, second.execution_id], WORKER, RUN_TTL, GRACE
        ).started
        assert started.execution.id == first.execution_id
        store.execution_finish_many(
            [Completion(started.execution.id, started.execution.fencing_token, succeeded=True)]
        )
        sim = Simulated(store, clock)
        sim.tick()
        runs = sorted(
            (r for r in _runs(store, job.id) if r.status is ExecutionStatus.SUCCEEDED),
            key=lambda r: r.scheduled_for,
        )
        assert [r.id for r in runs[:3]] == [i.execution_id for i in (first, second, third)]
        starts = [r.started_at for r in runs[:3]]
        assert starts == sorted(starts)  # type: ignore[type-var]

    def test_execution_claim__overlap_skip_still_skips_a_run_due_while_one_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE, overlap=OverlapPolicy.SKIP)).job
        clock.advance(55)
        first, second = sorted(_dispatch(store, window=70.0), key=lambda i: i.due_at)
        clock.set(first.due_at)
        assert len(store.execution_claim([first.execution_id], WORKER, RUN_TTL, GRACE).started) == 1
        clock.set(second.due_at)
        assert store.execution_claim([second.execution_id], WORKER, RUN_TTL, GRACE).started == []
        assert _get(store, second.execution_id).status is ExecutionStatus.SKIPPED
        assert _leases(store)  # the shard is still held
        assert_chain_intact(store, job.id)


class ScheduleHistoryContract:
    """The promise as a property over random histories, not one example."""

    def test_schedule_history__every_fire_time_has_one_record(
        self, store_factory: StoreFactory
    ) -> None:
        class Machine(ScheduleHistoryMachine):
            open_store = store_factory

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=40,
                stateful_step_count=20,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


_HISTORY_CRONS = (
    "*/20 * * * * *",
    "*/30 * * * * *",
    "0,30 * * * * *",
    "* * * * *",
    "*/2 * * * *",
    "0 * * * *",
)


class ScheduleHistoryMachine(RuleBasedStateMachine):
    """Random sequences of edits, pauses, resumes, run-nows, stalls and lost queues on one cron job
    (every misfire and overlap policy), with a healthy scheduler and worker ticking in between.
    After every step: the job's chain is intact, and every fire time of the schedule in force
    (the audit's replay of the job's history) has exactly one record; at the end, after a drain,
    every run whose time has come is final."""

    open_store: ClassVar[StoreFactory]

    def __init__(self) -> None:
        super().__init__()
        self._exit = ExitStack()
        directory = Path(self._exit.enter_context(tempfile.TemporaryDirectory()))
        self.clock = FakeClock()
        open_another = self._exit.enter_context(type(self).open_store(directory, self.clock))
        self.store = open_another()
        self.sim = Simulated(self.store, self.clock)
        self.job_id = ""

    @initialize(
        cron=st.sampled_from(_HISTORY_CRONS),
        misfire=st.sampled_from(list(MisfirePolicy)),
        overlap=st.sampled_from(list(OverlapPolicy)),
    )
    def create(self, cron: str, misfire: MisfirePolicy, overlap: OverlapPolicy) -> None:
        job = self.store.job_create(
            _cron(cron, misfire=misfire, overlap=overlap, catchup_window=300.0)
        ).job
        self.job_id = job.id

    @rule(seconds=st.sampled_from([1, 5, 9, 10, 30, 59, 61, 120]))
    def run_for(self, seconds: int) -> None:
        self.sim.run_for(seconds, step=min(seconds, 5))

    @rule(
        seconds=st.sampled_from([30, 90, 600, 3700]),
        lose_queue=st.booleans(),
        then=st.sampled_from(["tick", "edit", "pause", "resume", "run_now"]),
    )
    def stall(self, seconds: int, lose_queue: bool, then: str) -> None:
        """Nothing runs for a while (a frozen or dead node); the queue may be lost with it. Then
        the scheduler comes back, or a user acts first (the chain's head is still in the past)."""
        self.clock.advance(seconds)
        if then == "edit":
            self.edit("*/2 * * * *", "UTC")
        elif then != "tick":
            getattr(self, then)()
        if lose_queue:  # the sweep hands every queued run back to the new queue
            queued = [
                r for r in _runs(self.store, self.job_id) if r.status is ExecutionStatus.QUEUED
            ]
            self.sim.queue = {r.id: QueueItem(r.id, r.due_at, r.priority) for r in queued}
        self.sim.tick()

    @rule(cron=st.sampled_from(_HISTORY_CRONS), timezone=st.sampled_from(["UTC", "Asia/Kolkata"]))
    def edit(self, cron: str, timezone: str) -> None:
        schedule = Schedule.parse(cron=cron, timezone=timezone)
        self.store.job_update(self.job_id, JobChanges(schedule=schedule))
        self.sim.tick()

    @rule()
    def pause(self) -> None:
        self.store.job_pause(self.job_id)
        self.sim.tick()

    @rule()
    def resume(self) -> None:
        self.store.job_resume(self.job_id, misfire_grace=GRACE)
        self.sim.tick()

    @rule()
    def run_now(self) -> None:
        if _job(self.store, self.job_id).status is JobStatus.ACTIVE:
            self.store.job_run_now(self.job_id)
            self.sim.tick()

    @invariant()
    def chain_intact(self) -> None:
        if self.job_id:
            assert_chain_intact(self.store, self.job_id)

    @invariant()
    def every_fire_time_has_one_record(self) -> None:
        if not self.job_id:
            return
        job, now = _job(self.store, self.job_id), self.clock.now()
        records = self.store.execution_fire_records(self.job_id, job.created_at, now)
        fires = [fire for fire, _ in records]
        assert len(fires) == len(set(fires)), "a fire time has two records"
        events = self.store.job_events(self.job_id)
        assert audit(events, records, job.created_at, now).missing == []
        # the job is never cancelled here, so no fire time in force may be settled as cancelled
        status = dict(records)
        expected = expected_fire_times(events, job.created_at, now)
        assert [f for f in expected if status[f] is ExecutionStatus.CANCELLED] == []

    def teardown(self) -> None:
        try:
            if self.job_id:
                self._drain()
        finally:
            self._exit.close()

    def _drain(self) -> None:
        if _job(self.store, self.job_id).status is JobStatus.PAUSED:
            self.store.job_resume(self.job_id, misfire_grace=GRACE)
        self.sim.run_for(30, step=1)
        now = self.clock.now()
        stuck = [
            (r.scheduled_for, r.status, r.reason)
            for r in self.store.execution_list(self.job_id, limit=100_000)
            if not r.status.is_final and r.due_at < now - timedelta(seconds=2)
        ]
        assert stuck == [], stuck
