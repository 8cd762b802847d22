"""Store contract, concurrency: two stores on one database (two connections, as two processes
would have) make the same call, or two conflicting ones, at the same instant, and what the
``Concurrency:`` line of each method in :mod:`onbeat.store.base` promises still holds.

Each race runs its two calls from two threads released together by a ``threading.Barrier``,
``RACE_ROUNDS`` times, so that both orders and, where the backend allows it, true overlaps
happen; every round asserts the invariant, never a timing. A backend whose writers take turns
(SQLite) passes by construction if every read-decide-write step is one transaction; one with
row-level concurrency (PostgreSQL, READ COMMITTED) passes only if each step re-checks its
condition where it writes.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures); its
``store_pair`` fixture opens the two stores through the backend's ``store_factory``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from onbeat.audit import audit
from onbeat.model import (
    AttemptOutcome,
    ExecutionStatus,
    JobStatus,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.schedule import Schedule
from onbeat.store.base import (
    ClaimResult,
    Completion,
    DispatchParams,
    JobChanges,
    ShardLeases,
    Store,
)
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    FAST_RETRY,
    GRACE,
    OTHER_SCHEDULER,
    OTHER_WORKER,
    RUN_TTL,
    SCHEDULER,
    SHARD_TTL,
    WINDOW,
    WORKER,
    StoreFactory,
    _at,
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
    _runs,
    _start,
)
from onbeat.testing.store_contract_schedules import assert_chain_intact, statuses_by_fire

__all__ = ["RACE_ROUNDS", "ConcurrencyContract", "race"]

RACE_ROUNDS = 30
"""Races per test: enough for both orders to occur many times over."""
BARRIER_TIMEOUT = 30.0
"""Seconds a racer waits for the other to reach the start (a guard against a hung test only)."""
ONE_ATTEMPT = RetryPolicy(max_attempts=1)
EVERY_5_SECONDS = "*/5 * * * * *"
"""Fires often enough that every round of a dispatch race has runs to queue, seldom enough to keep
the rounds quick."""

First = TypeVar("First")
Second = TypeVar("Second")
Answer = TypeVar("Answer")


def race(first: Callable[[], First], second: Callable[[], Second]) -> tuple[First, Second]:
    """Call ``first`` and ``second`` at once, each from its own thread, both released by one
    barrier; returns both answers, or raises ``first``'s error, else ``second``'s."""
    start = threading.Barrier(2, timeout=BARRIER_TIMEOUT)

    def released(call: Callable[[], Answer]) -> Answer:
        start.wait()
        return call()

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="race") as pool:
        one = pool.submit(released, first)
        two = pool.submit(released, second)
        return one.result(), two.result()


def _dispatch_with(store: Store, leases: ShardLeases) -> list[str]:
    """Dispatch with leases got earlier (a scheduler's dispatch task holds on to them)."""
    items = store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 10_000))
    return [item.execution_id for item in items]


def _take_over_and_dispatch(store: Store, owner: str) -> tuple[ShardLeases, list[str]]:
    """A live scheduler's renewal (it takes the shards whose lease expired), then its dispatch."""
    leases = _leases(store, owner)
    return leases, _dispatch_with(store, leases)


def _hand_over_and_dispatch(
    store: Store, leaving: str, taking: str
) -> tuple[ShardLeases, list[str]]:
    """A stopping scheduler releases its shards; another takes them at once and dispatches."""
    store.shard_release(leaving)
    return _take_over_and_dispatch(store, taking)


def _queued(store: Store, job_ids: list[str]) -> set[str]:
    return {
        r.id
        for job_id in job_ids
        for r in _runs(store, job_id)
        if r.status is ExecutionStatus.QUEUED
    }


def _assert_one_chain(store: Store, clock: FakeClock, job_id: str) -> None:
    """The job's schedule goes on as one chain: the head ``assert_chain_intact`` checks is its
    only planned future run and a fire time of the schedule in force, each fire time has one
    record, and every fire time of its history up to now has one (the run audit)."""
    assert_chain_intact(store, job_id)
    statuses_by_fire(store, job_id)
    job, now = _job(store, job_id), clock.now()
    later = [
        r.scheduled_for
        for r in _runs(store, job_id)
        if r.trigger is Trigger.SCHEDULE
        and r.status is ExecutionStatus.SCHEDULED
        and r.scheduled_for > now
    ]
    assert later == [job.next_fire_at], (later, job.next_fire_at)
    assert job.next_fire_at is not None
    before = job.next_fire_at - timedelta(microseconds=1)
    assert job.schedule.next_fire_after(before) == job.next_fire_at, "a fire of an old schedule"
    records = store.execution_fire_records(job_id, job.created_at, now)
    assert audit(store.job_events(job_id), records, job.created_at, now).missing == []


class ConcurrencyContract:
    """Races between two stores on one database; see the module docstring."""

    @pytest.fixture
    def store_pair(
        self, store_factory: StoreFactory, tmp_path: Path, clock: FakeClock
    ) -> Iterator[tuple[Store, Store]]:
        """Two stores on one fresh database, sharing the test's clock (in a directory of its
        own, apart from the ``store`` fixture's database)."""
        directory = tmp_path / "shared"
        directory.mkdir()
        with store_factory(directory, clock) as open_another:
            yield open_another(), open_another()

    # -- workers -------------------------------------------------------------------------------

    def test_execution_claim__race_starts_each_run_once(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """Two workers claim the same queued runs (in opposite orders) at once."""
        a, b = store_pair
        for _ in range(RACE_ROUNDS):
            ids = [_only_run(a, a.job_create(_new()).job.id).id for _ in range(3)]
            assert _ids(_dispatch(a)) == set(ids)
            mine, theirs = race(
                partial(a.execution_claim, ids, WORKER, RUN_TTL, GRACE),
                partial(b.execution_claim, ids[::-1], OTHER_WORKER, RUN_TTL, GRACE),
            )
            claims: dict[str, ClaimResult] = {WORKER: mine, OTHER_WORKER: theirs}
            started = [run for claim in claims.values() for run in claim.started]
            assert sorted(run.execution.id for run in started) == sorted(ids), "not started once"
            for owner, claim in claims.items():
                for run in claim.started:
                    stored = _get(a, run.execution.id)
                    assert (stored.status, stored.lease_owner) == (ExecutionStatus.RUNNING, owner)
                    assert stored.fencing_token == run.execution.fencing_token
                    [attempt] = stored.attempts
                    assert (attempt.worker, attempt.fencing_token) == (owner, stored.fencing_token)
                    assert attempt.outcome is AttemptOutcome.RUNNING
                other = OTHER_WORKER if owner == WORKER else WORKER
                assert b.execution_heartbeat(other, _held(*claim.started), RUN_TTL) == {}
                assert a.execution_heartbeat(owner, _held(*claim.started), RUN_TTL) == _held(
                    *claim.started
                )

    def test_execution_claim__race_of_two_overlap_skip_runs_runs_one_at_a_time(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """The scheduled run and a manual run of one overlap=skip job are both due and claimed
        at once by two workers: one starts, the other waits or is skipped, never both run."""
        a, b = store_pair
        for _ in range(RACE_ROUNDS):
            job = a.job_create(_new(overlap=OverlapPolicy.SKIP)).job
            scheduled = _only_run(a, job.id)
            clock.advance(1)
            manual = a.job_run_now(job.id)
            assert {scheduled.id, manual.id} <= _ids(_dispatch(a))
            clock.advance(1)
            mine, theirs = race(
                partial(a.execution_claim, [scheduled.id], WORKER, RUN_TTL, GRACE),
                partial(b.execution_claim, [manual.id], OTHER_WORKER, RUN_TTL, GRACE),
            )
            started = [*mine.started, *theirs.started]
            assert len(started) == 1, "two runs of an overlap=skip job started together"
            runs = {r.id: r for r in _runs(a, job.id)}
            running = [r.id for r in runs.values() if r.status is ExecutionStatus.RUNNING]
            assert running == [started[0].execution.id]
            [held_back] = {scheduled.id, manual.id} - set(running)
            assert runs[held_back].status in (ExecutionStatus.SCHEDULED, ExecutionStatus.SKIPPED)
            assert runs[held_back].attempts == ()
            assert runs[held_back].reason
            assert a.execution_finish_many([_ok(started[0])]) == [started[0].execution.id]

    def test_execution_confirm__race_with_job_cancel_has_one_winner(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A worker confirms a run it claimed ahead at its due time while the job is cancelled:
        either the run started (and runs on, as a run started before a cancel does) or it is
        cancelled without an attempt; never a cancelled run with a begun attempt, nor one lost."""
        a, b = store_pair
        for _ in range(RACE_ROUNDS):
            job = a.job_create(_once(_at(clock, 1))).job
            run = _only_run(a, job.id)
            assert run.id in _ids(_dispatch(a))
            claim = a.execution_claim(
                [run.id], WORKER, RUN_TTL, GRACE, max_starts=1, ahead=2.0, max_ahead=1
            )
            [held] = claim.started
            clock.advance(1)
            confirmed, _ = race(
                partial(a.execution_confirm, WORKER, _held(held), RUN_TTL),
                partial(b.job_cancel, job.id),
            )
            stored = _get(a, run.id)
            if confirmed:
                assert (stored.status, stored.fencing_token) == (
                    ExecutionStatus.RUNNING,
                    confirmed[run.id],
                )
                [attempt] = stored.attempts
                assert attempt.outcome is AttemptOutcome.RUNNING
                done = Completion(run.id, confirmed[run.id], True)
                assert a.execution_finish_many([done]) == [run.id]
            else:
                assert (stored.status, stored.attempts) == (ExecutionStatus.CANCELLED, ())
            assert a.tenant_usage("default").running == 0

    def test_execution_finish_many__race_with_reap_has_one_winner(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A worker reports the outcome of a run whose lease just expired while a scheduler
        reaps it: exactly one of them wins, and the attempt is closed once, by the winner. Odd
        rounds are the run's last attempt, which both would dead-letter."""
        a, b = store_pair
        for round_ in range(RACE_ROUNDS):
            last = round_ % 2 == 1
            run = _start(a, _new(retry=ONE_ATTEMPT if last else FAST_RETRY))
            eid, token = run.execution.id, run.execution.fencing_token
            clock.advance(RUN_TTL + 1)
            outcome = _failed(run, "boom") if last else _ok(run, "done")
            accepted, reaped = race(
                partial(a.execution_finish_many, [outcome]), partial(b.execution_reap, 1000)
            )
            finished, was_reaped = accepted == [eid], eid in _ids(reaped)
            assert finished != was_reaped, f"finished={finished}, reaped={was_reaped}"
            stored = _get(a, eid)
            [attempt] = stored.attempts
            assert attempt.fencing_token == token
            assert attempt.finished_at == clock.now()
            if finished:
                expected = AttemptOutcome.FAILED if last else AttemptOutcome.SUCCEEDED
                assert attempt.outcome is expected
                assert stored.status is (
                    ExecutionStatus.FAILED if last else ExecutionStatus.SUCCEEDED
                )
            else:
                assert attempt.outcome is AttemptOutcome.LOST
                assert stored.status is (ExecutionStatus.FAILED if last else ExecutionStatus.QUEUED)
            letters = [d for d in b.dead_letter_list(limit=1000) if d.execution_id == eid]
            assert len(letters) == (1 if last else 0)
            assert a.execution_heartbeat(WORKER, _held(run), RUN_TTL) == {}
            assert b.execution_finish_many([outcome]) == []

    def test_execution_requeue__race_with_a_claim_has_one_winner(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A blocked worker's watchdog requeues a run its queue handed it while another worker,
        handed the same id again, claims it: either the claim started it and the requeue did
        nothing, or the requeue won and the claim skipped it, for the dispatch to queue again."""
        a, b = store_pair
        for _ in range(RACE_ROUNDS):
            job = a.job_create(_new()).job
            eid = _only_run(a, job.id).id
            assert eid in _ids(_dispatch(a))
            requeued, claim = race(
                partial(a.execution_requeue, [eid]),
                partial(b.execution_claim, [eid], OTHER_WORKER, RUN_TTL, GRACE),
            )
            started = _ids(claim.started) == {eid}
            assert (requeued == 1) != started, f"requeued={requeued}, started={started}"
            stored = _get(a, eid)
            if started:
                assert stored.status is ExecutionStatus.RUNNING
                assert stored.lease_owner == OTHER_WORKER
            else:
                assert stored.status is ExecutionStatus.SCHEDULED
                assert eid in _ids(_dispatch(a))

    def test_execution_heartbeat__race_with_reap_never_rescues_a_kept_run(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A worker heartbeats a run whose lease just expired while a scheduler reaps: a
        heartbeat that commits first keeps the run (no false rescue); a reap that commits first
        takes it, and the heartbeat's answer leaves it out."""
        a, b = store_pair
        for _ in range(RACE_ROUNDS):
            run = _start(a, _new(retry=FAST_RETRY))
            eid = run.execution.id
            clock.advance(RUN_TTL + 1)
            held, reaped = race(
                partial(a.execution_heartbeat, WORKER, _held(run), RUN_TTL),
                partial(b.execution_reap, 1000),
            )
            assert held in ({}, _held(run))
            kept, was_reaped = held == _held(run), eid in _ids(reaped)
            assert kept != was_reaped, f"kept={kept}, reaped={was_reaped}"
            stored = _get(a, eid)
            [attempt] = stored.attempts
            if kept:
                assert stored.status is ExecutionStatus.RUNNING
                assert stored.lease_expires_at == _at(clock, RUN_TTL)
                assert attempt.outcome is AttemptOutcome.RUNNING
                assert a.execution_finish_many([_ok(run)]) == [eid]
            else:
                assert stored.status is ExecutionStatus.QUEUED
                assert attempt.outcome is AttemptOutcome.LOST
                assert a.execution_finish_many([_ok(run)]) == []

    # -- schedulers ----------------------------------------------------------------------------

    def test_execution_dispatch__race_with_takeover_writes_nothing_stale(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A scheduler stalls past its shard lease; as another takes its shards over and
        dispatches them, the stalled one's dispatch (with its old leases) runs too. The stale
        dispatch returns nothing and queues nothing; no fire time gets two runs. The two
        schedulers swap roles every round."""
        a, b = store_pair
        job_ids = [a.job_create(_cron(EVERY_5_SECONDS)).job.id for _ in range(2)]
        stores = {SCHEDULER: a, OTHER_SCHEDULER: b}
        stalled, live = SCHEDULER, OTHER_SCHEDULER
        leases = _leases(a, stalled)
        assert set(leases.epochs) == set(range(a.shard_count))
        for _ in range(RACE_ROUNDS):
            clock.advance(SHARD_TTL + 1)
            queued_before = _queued(a, job_ids)
            stale, (taken, fresh) = race(
                partial(_dispatch_with, stores[stalled], leases),
                partial(_take_over_and_dispatch, stores[live], live),
            )
            assert stale == [], "a scheduler wrote to shards taken over from it"
            assert taken.acquired == set(range(a.shard_count))
            for shard, epoch in leases.epochs.items():
                assert taken.epochs[shard] > epoch
            assert len(fresh) == len(set(fresh))
            assert _queued(a, job_ids) == queued_before | set(fresh)
            assert queued_before.isdisjoint(fresh), "a queued run was dispatched again"
            for job_id in job_ids:
                _assert_one_chain(a, clock, job_id)
            stalled, live, leases = live, stalled, taken

    def test_execution_dispatch__race_with_a_hand_over_queues_each_run_once(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A stopping scheduler releases its shards while its last dispatch pass is still in
        flight, and another takes them over and dispatches at once. The lease is checked where
        each dispatch writes: the one that commits while holding it queues the due runs, the
        other writes nothing, so no run is queued twice. The two swap roles every round."""
        a, b = store_pair
        job_ids = [a.job_create(_cron(EVERY_5_SECONDS)).job.id for _ in range(2)]
        stores = {SCHEDULER: a, OTHER_SCHEDULER: b}
        leaving, taking = SCHEDULER, OTHER_SCHEDULER
        leases = _leases(a, leaving)
        for _ in range(RACE_ROUNDS):
            clock.advance(5)
            queued_before = _queued(a, job_ids)
            last, (taken, fresh) = race(
                partial(_dispatch_with, stores[leaving], leases),
                partial(_hand_over_and_dispatch, stores[taking], leaving, taking),
            )
            assert set(last).isdisjoint(fresh), "two schedulers queued one run"
            assert taken.acquired == set(range(a.shard_count))
            assert _queued(a, job_ids) == queued_before | set(last) | set(fresh)
            assert queued_before.isdisjoint([*last, *fresh]), "a queued run was dispatched again"
            for job_id in job_ids:
                _assert_one_chain(a, clock, job_id)
            leaving, taking, leases = taking, leaving, taken

    def test_execution_dispatch__race_of_a_stale_epoch_with_the_current_one(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """A scheduler's lease lapsed and it took its shards again, under a new epoch; its
        dispatch still holding the old epoch races the one holding the new: only the new one
        writes, and no fire time gets two runs."""
        a, b = store_pair
        job_ids = [a.job_create(_cron(EVERY_5_SECONDS)).job.id for _ in range(2)]
        old = _leases(a)
        for _ in range(RACE_ROUNDS):
            clock.advance(SHARD_TTL + 1)
            current = _leases(b)
            assert current.acquired == set(old.epochs)
            queued_before = _queued(a, job_ids)
            stale, fresh = race(
                partial(_dispatch_with, a, old), partial(_dispatch_with, b, current)
            )
            assert stale == [], "a dispatch with a superseded epoch wrote"
            assert fresh, "the current lease dispatched nothing"
            assert _queued(a, job_ids) == queued_before | set(fresh)
            assert queued_before.isdisjoint(fresh)
            for job_id in job_ids:
                _assert_one_chain(a, clock, job_id)
            old = current

    def test_job_repair_next_runs__race_with_dispatch_repairs_nothing(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """The reconciler reads a page of cron jobs while a dispatch moves them on to their next
        fire time: it judges each job by what that dispatch wrote, so it finds every chain
        whole and plans no second run (a page judged at a snapshot older than its lock saw the
        new next fire time without the run planned for it, and "repaired" it)."""
        a, b = store_pair
        job_ids = [a.job_create(_cron(EVERY_5_SECONDS)).job.id for _ in range(20)]
        rounds_dispatched = 0  # not those where the reconciler's locks made it pass the jobs by
        for _ in range(RACE_ROUNDS):
            clock.advance(5)
            leases = _leases(a)
            dispatched, (repaired, _) = race(
                partial(_dispatch_with, a, leases),
                partial(b.job_repair_next_runs, leases, None, 1000),
            )
            assert repaired == [], "a whole chain was repaired"
            rounds_dispatched += bool(dispatched)
            _dispatch_with(a, leases)  # the jobs the reconciler's locks made it pass over
            for job_id in job_ids:
                _assert_one_chain(a, clock, job_id)
        assert rounds_dispatched > 0, "the reconciler's locks kept every dispatch out: no race"

    # -- API -----------------------------------------------------------------------------------

    def test_job_create__race_under_one_idempotency_key_makes_one_job(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        a, b = store_pair
        for round_ in range(RACE_ROUNDS):
            tenant = f"tenant-{round_}"
            new = _new(tenant=tenant, idempotency_key="retried-submission")
            one, two = race(partial(a.job_create, new), partial(b.job_create, new))
            assert sorted([one.replayed, two.replayed]) == [False, True]
            assert one.job.id == two.job.id
            assert [j.id for j in a.job_list(tenant=tenant)] == [one.job.id]
            assert len(_runs(a, one.job.id)) == 1

    def test_job_changes__race_keeps_one_schedule_chain(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        """Two of edit, pause, claim and dispatch hit one cron job at its fire time at once:
        afterwards its schedule is still one chain (see ``_assert_one_chain``), and it goes on
        firing."""
        a, b = store_pair

        def edit(store: Store, job_id: str, cron: str) -> None:
            store.job_update(job_id, JobChanges(schedule=Schedule.parse(cron=cron)))

        def pause(store: Store, job_id: str) -> None:
            store.job_pause(job_id)

        def claim(store: Store, run_id: str) -> None:
            store.execution_claim([run_id], WORKER, RUN_TTL, GRACE)

        def dispatch(store: Store) -> None:
            _dispatch(store)

        for round_ in range(RACE_ROUNDS):
            job = a.job_create(_cron(EVERY_MINUTE)).job
            head = _only_run(a, job.id)
            clock.set(head.scheduled_for)
            kind = round_ % 5
            if kind != 3:  # the head is queued, for a claim to take
                assert head.id in _ids(_dispatch(a))
            pairs: list[tuple[Callable[[], None], Callable[[], None]]] = [
                (partial(edit, a, job.id, "*/2 * * * *"), partial(claim, b, head.id)),
                (partial(pause, a, job.id), partial(claim, b, head.id)),
                (partial(edit, a, job.id, "*/3 * * * *"), partial(pause, b, job.id)),
                (partial(edit, a, job.id, "*/5 * * * *"), partial(dispatch, b)),
                (partial(edit, a, job.id, "*/2 * * * *"), partial(edit, b, job.id, "*/3 * * * *")),
            ]
            race(*pairs[kind])
            _assert_one_chain(a, clock, job.id)
            if _job(a, job.id).status is JobStatus.PAUSED:
                a.job_resume(job.id, misfire_grace=GRACE)
                _assert_one_chain(a, clock, job.id)
            nxt = _job(a, job.id).next_fire_at
            assert nxt is not None
            clock.set(nxt)
            [planned] = [r for r in _runs(a, job.id) if r.scheduled_for == nxt]
            assert planned.id in _ids(_dispatch(a)), "the job stopped firing"
            _assert_one_chain(a, clock, job.id)
            a.job_cancel(job.id)
