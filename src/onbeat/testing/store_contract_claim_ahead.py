"""Store contract, claims ahead: a run due within the horizon is held by one worker before its
time and starts only once confirmed at it; a cancel, edit or pause committed before the confirm
wins, and a run held ahead that never began leaves no attempt behind, however it ends.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

from datetime import timedelta

from onbeat.limits import LimitDefaults, TenantLimits
from onbeat.model import ExecutionStatus, OverlapPolicy
from onbeat.schedule import Schedule
from onbeat.store.base import (
    AHEAD_LEASE_GRACE,
    ClaimedRun,
    ClaimResult,
    Completion,
    JobChanges,
    Store,
)
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    EVERY_SECOND,
    GRACE,
    HOURLY,
    OTHER_WORKER,
    RUN_TTL,
    WORKER,
    _at,
    _cron,
    _dispatch,
    _get,
    _held,
    _ids,
    _ok,
    _once,
    _only_run,
    _reap,
    _runs,
)

__all__ = ["ClaimAheadContract"]

AHEAD = 3.0


def _claim_ahead(
    store: Store, ids: list[str], owner: str = WORKER, limits: LimitDefaults | None = None
) -> ClaimResult:
    extra = {} if limits is None else {"limits": limits}
    return store.execution_claim(
        ids, owner, RUN_TTL, GRACE, max_starts=10, ahead=AHEAD, max_ahead=10, **extra
    )


def _held_ahead(store: Store, clock: FakeClock, due_in: float = 2.0, **job: object) -> ClaimedRun:
    """A one-shot run due in ``due_in`` s, dispatched and claimed ahead by WORKER."""
    created = store.job_create(_once(_at(clock, due_in), **job)).job
    run = _only_run(store, created.id)
    assert run.id in _ids(_dispatch(store))
    result = _claim_ahead(store, [run.id])
    assert result.not_due == []
    [held] = result.started
    return held


class ClaimAheadContract:
    """``execution_claim(ahead=...)`` and ``execution_confirm``."""

    def test_claim_ahead__holds_a_run_due_within_the_horizon_without_starting_it(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        before = _get(store, held.execution.id)
        assert held.execution.started_at is None
        assert before.status is ExecutionStatus.QUEUED  # not started: it reads as queued
        assert (before.lease_owner, before.started_at, before.attempt) == (WORKER, None, 0)
        assert before.attempts == ()
        assert store.tenant_usage("default").running == 1
        # leased to shortly after its due time, not for a lease TTL: not heartbeated until it starts
        assert before.lease_expires_at == held.execution.due_at + timedelta(
            seconds=min(AHEAD_LEASE_GRACE, RUN_TTL)
        )

    def test_claim_ahead__a_held_run_reads_as_queued_in_every_read_until_it_starts(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        eid, job_id = held.execution.id, held.execution.job_id
        listed = {s: _ids(store.execution_list(job_id, status=s)) for s in ExecutionStatus}
        assert listed[ExecutionStatus.QUEUED] == {eid}
        assert all(ids == set() for s, ids in listed.items() if s is not ExecutionStatus.QUEUED)
        assert store.execution_running_by_owner(tenant=None) == []  # no worker runs it yet
        assert store.execution_last_of_jobs([job_id]) == {}  # nothing of the job has run
        clock.advance(2)
        store.execution_confirm(WORKER, _held(held), RUN_TTL)
        assert _ids(store.execution_list(job_id, status=ExecutionStatus.RUNNING)) == {eid}
        assert store.execution_list(job_id, status=ExecutionStatus.QUEUED) == []
        [load] = store.execution_running_by_owner(tenant=None)
        assert (load.owner, load.running) == (WORKER, 1)
        assert store.execution_last_of_jobs([job_id])[job_id].status is ExecutionStatus.RUNNING

    def test_claim_ahead__beyond_the_horizon_or_without_one_is_handed_back(
        self, store: Store, clock: FakeClock
    ) -> None:
        near = _only_run(store, store.job_create(_once(_at(clock, 2))).job.id)
        far = _only_run(store, store.job_create(_once(_at(clock, 5))).job.id)
        _dispatch(store)
        plain = store.execution_claim([near.id], WORKER, RUN_TTL, GRACE)
        assert (plain.started, _ids(plain.not_due)) == ([], {near.id})
        result = _claim_ahead(store, [near.id, far.id])
        assert _ids(result.started) == {near.id}
        assert _ids(result.not_due) == {far.id}
        assert _get(store, far.id).status is ExecutionStatus.QUEUED

    def test_claim_ahead__at_most_max_ahead(self, store: Store, clock: FakeClock) -> None:
        ids = [_only_run(store, store.job_create(_once(_at(clock, 2))).job.id).id for _ in range(3)]
        _dispatch(store)
        result = store.execution_claim(
            ids, WORKER, RUN_TTL, GRACE, max_starts=10, ahead=AHEAD, max_ahead=2
        )
        assert len(result.started) == 2
        assert len(result.not_due) == 1
        assert _ids(result.started) | _ids(result.not_due) == set(ids)

    def test_execution_confirm__starts_the_run_with_its_attempt(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        clock.advance(2)
        tokens = store.execution_confirm(WORKER, _held(held), RUN_TTL)
        assert tokens == {held.execution.id: held.execution.fencing_token + 1}
        stored = _get(store, held.execution.id)
        assert stored.lease_expires_at == _at(clock, RUN_TTL)
        assert (stored.status, stored.started_at, stored.attempt) == (
            ExecutionStatus.RUNNING,
            clock.now(),
            1,
        )
        [attempt] = stored.attempts
        assert (attempt.fencing_token, attempt.started_at) == (tokens[stored.id], clock.now())
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}, "confirmed twice"
        # the old token is spent: only the confirmed one finishes the run
        assert store.execution_finish_many([_ok(held)]) == []
        assert store.execution_heartbeat(WORKER, _held(held), RUN_TTL) == {}
        done = Completion(held.execution.id, tokens[stored.id], True)
        assert store.execution_finish_many([done]) == [stored.id]
        assert _get(store, stored.id).status is ExecutionStatus.SUCCEEDED
        assert store.tenant_usage("default").running == 0

    def test_execution_confirm__only_by_the_holder_under_its_token(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        clock.advance(2)
        eid, token = held.execution.id, held.execution.fencing_token
        assert store.execution_confirm(OTHER_WORKER, {eid: token}, RUN_TTL) == {}
        assert store.execution_confirm(WORKER, {eid: token + 1}, RUN_TTL) == {}
        assert _get(store, eid).started_at is None

    def test_claim_ahead__not_started_runs_finish_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        assert store.execution_finish_many([_ok(held)]) == []
        assert _get(store, held.execution.id).status is ExecutionStatus.QUEUED

    def test_claim_ahead__another_claim_does_not_start_a_run_held_ahead(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        clock.advance(2)
        other = store.execution_claim([held.execution.id], OTHER_WORKER, RUN_TTL, GRACE)
        assert (other.started, other.not_due) == ([], [])
        assert _get(store, held.execution.id).lease_owner == WORKER

    def test_claim_ahead__cancel_before_the_confirm_wins(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        store.job_cancel(held.execution.job_id)
        clock.advance(2)
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}
        stored = _get(store, held.execution.id)
        assert stored.status is ExecutionStatus.CANCELLED
        assert stored.attempts == ()
        assert store.tenant_usage("default").running == 0
        assert store.execution_release(WORKER, _held(held)) == 0

    def test_claim_ahead__pause_before_the_confirm_holds_the_run_for_the_resume(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        store.job_pause(held.execution.job_id)  # makes it pending again, as a cancel does
        clock.advance(2)
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}
        assert store.execution_release(WORKER, _held(held)) == 0
        stored = _get(store, held.execution.id)
        assert (stored.status, stored.attempt, stored.attempts) == (
            ExecutionStatus.SCHEDULED,
            0,
            (),
        )
        assert store.tenant_usage("default").running == 0
        store.job_resume(held.execution.job_id, misfire_grace=GRACE)
        assert held.execution.id in _ids(_dispatch(store))
        [started] = store.execution_claim([held.execution.id], WORKER, RUN_TTL, GRACE).started
        assert started.execution.attempt == 1

    def test_claim_ahead__schedule_edit_before_the_confirm_drops_the_old_fire_time(
        self, store: Store, clock: FakeClock
    ) -> None:
        clock.set(clock.now().replace(second=58))
        job = store.job_create(_cron(EVERY_MINUTE)).job
        fire = clock.now().replace(second=0) + timedelta(minutes=1)
        [item] = [i for i in _dispatch(store) if i.due_at == fire]
        [held] = _claim_ahead(store, [item.execution_id]).started
        store.job_update(job.id, JobChanges(schedule=Schedule.parse(cron=HOURLY)))
        clock.advance(2)
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}
        assert fire not in {r.scheduled_for for r in _runs(store, job.id)}
        assert store.tenant_usage("default").running == 0

    def test_claim_ahead__an_edit_before_the_confirm_is_claimed_again_with_the_new_fields(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        store.job_update(held.execution.job_id, JobChanges(params={"edited": True}))
        clock.advance(2)
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}
        assert _get(store, held.execution.id).status is ExecutionStatus.SCHEDULED
        assert held.execution.id in _ids(_dispatch(store))
        [run] = store.execution_claim([held.execution.id], WORKER, RUN_TTL, GRACE).started
        assert run.params == {"edited": True}
        assert store.tenant_usage("default").running == 1

    def test_claim_ahead__release_gives_the_run_back_without_an_attempt(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        assert store.execution_release(WORKER, _held(held)) == 1
        stored = _get(store, held.execution.id)
        assert (stored.status, stored.attempt, stored.attempts, stored.lease_owner) == (
            ExecutionStatus.SCHEDULED,
            0,
            (),
            None,
        )
        assert stored.due_at == held.execution.due_at
        assert store.tenant_usage("default").running == 0
        clock.advance(2)
        assert held.execution.id in _ids(_dispatch(store))

    def test_claim_ahead__a_holder_lost_before_the_due_time_costs_no_attempt(
        self, store: Store, clock: FakeClock
    ) -> None:
        held = _held_ahead(store, clock)
        clock.advance(2 + AHEAD_LEASE_GRACE)  # its due time and the grace: not yet expired
        assert _reap(store) == []
        clock.advance(0.001)
        assert _ids(_reap(store)) == {held.execution.id}
        stored = _get(store, held.execution.id)
        assert (stored.status, stored.attempt, stored.attempts) == (
            ExecutionStatus.QUEUED,
            0,
            (),
        )
        assert store.tenant_usage("default").running == 0
        assert store.execution_confirm(WORKER, _held(held), RUN_TTL) == {}

    def test_claim_ahead__not_while_a_run_of_its_job_is_running(
        self, store: Store, clock: FakeClock
    ) -> None:
        clock.set(clock.now().replace(second=58))
        job = store.job_create(_cron(EVERY_MINUTE, overlap=OverlapPolicy.SKIP)).job
        manual = store.job_run_now(job.id)
        fire = clock.now().replace(second=0) + timedelta(minutes=1)
        [item] = [i for i in _dispatch(store) if i.due_at == fire]
        [first] = store.execution_claim([manual.id], WORKER, RUN_TTL, GRACE).started
        result = _claim_ahead(store, [item.execution_id])
        assert (result.started, _ids(result.not_due)) == ([], {item.execution_id})
        assert store.execution_finish_many([_ok(first)]) == [first.execution.id]
        assert len(_claim_ahead(store, [item.execution_id]).started) == 1

    def test_claim_ahead__never_under_a_limit(self, store: Store, clock: FakeClock) -> None:
        run = _only_run(store, store.job_create(_once(_at(clock, 2), tenant="acme")).job.id)
        _dispatch(store)
        store.tenant_limits_set("acme", TenantLimits(max_in_flight=5))
        result = _claim_ahead(store, [run.id])
        assert (result.started, _ids(result.not_due)) == ([], {run.id})
        fleet_cap = LimitDefaults(max_in_flight=100)
        other = _only_run(store, store.job_create(_once(_at(clock, 2))).job.id)
        _dispatch(store)
        result = _claim_ahead(store, [other.id], limits=fleet_cap)
        assert (result.started, _ids(result.not_due)) == ([], {other.id})
        assert _claim_ahead(store, [other.id]).started != []

    def test_claim_ahead__only_the_earliest_pending_run_of_a_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_SECOND)).job
        _dispatch(store)
        by_fire = {r.scheduled_for: r.id for r in _runs(store, job.id)}
        first, second = by_fire[_at(clock, 1)], by_fire[_at(clock, 2)]
        alone = _claim_ahead(store, [second])
        assert (alone.started, _ids(alone.not_due)) == ([], {second})
        both = _claim_ahead(store, [second, first])
        assert (_ids(both.started), _ids(both.not_due)) == ({first}, {second})
