"""The ``Store`` contract suite: every backend must pass it unchanged.

Use it by subclassing in a test module that provides three fixtures: ``clock`` (a ``FakeClock``),
``store_factory`` (a :data:`StoreFactory` for the backend under test) and ``store`` (a fresh, empty
store from that factory, driven by ``clock``, closed afterwards)::

    @pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.external_service)])
    def store_factory(request) -> StoreFactory: ...

    @pytest.fixture
    def store(store_factory, tmp_path, clock) -> Iterator[Store]:
        with store_factory(tmp_path, clock) as store:
            yield store

    class TestStore(StoreContract):
        pass

The class name does not start with ``Test`` so pytest collects it only through such a subclass.
The suite talks to the store only through the ``Store`` protocol (no SQL, no backend internals),
and time only moves by ``clock.advance()``/``clock.set()``: the store must take every time
decision (due, lease expiry, misfire) from the clock it was built with. A store needs at least two
shards (the fixture in ``tests/contract`` uses four).

What the suite pins down where ``base.Store`` is silent: an execution is due when
``due_at <= now``; a lease is expired once the clock is past ``lease_expires_at`` (a boundary
instant is not tested); a retry after a lost (reaped) attempt is due within the job's
``RetryPolicy.backoff_cap``; a one-shot job becomes ``completed`` once its schedule execution is
final; a cancelled job refuses edits, pause, resume and ``run_now`` with ``ConflictError``; unknown
ids raise ``NotFoundError`` from the methods that change a job or a dead letter, and read methods
answer ``None``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from onbeat.errors import ConflictError, NotFoundError, ValidationError
from onbeat.model import (
    PENDING_STATUSES,
    AttemptOutcome,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule
from onbeat.store.base import (
    ClaimedRun,
    Completion,
    DispatchParams,
    JobChanges,
    NewJob,
    ShardLeases,
    Store,
)
from onbeat.testing.clock import FakeClock

__all__ = ["SHARD_COUNT", "StoreContract", "StoreFactory", "StoreFencingMachine"]

StoreFactory = Callable[[Path, FakeClock], AbstractContextManager[Store]]
"""Opens a fresh, empty store (files, if any, under the given empty directory) driven by the given
clock, and closes (and, for a server database, drops) it on exit."""

SHARD_COUNT = 4
"""Shards of the stores the suite is run with in ``tests/contract`` (the suite needs at least 2)."""

SCHEDULER = "scheduler-a"
OTHER_SCHEDULER = "scheduler-b"
WORKER = "worker-a"
OTHER_WORKER = "worker-b"
SHARD_TTL = 30.0
RUN_TTL = 10.0
WINDOW = 10.0
GRACE = 60.0
FAST_RETRY = RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_cap=1.0)
"""Retries of a lost attempt are due within a second, so a test advances past them exactly."""

HOURLY = "0 * * * *"
EVERY_MINUTE = "* * * * *"
EVERY_SECOND = "* * * * * *"


# -- helpers: everything below goes through the Store protocol only ----------------------------


def _new(schedule: Schedule | None = None, **overrides: Any) -> NewJob:
    base = NewJob(task="tasks.noop", params={}, schedule=schedule or Schedule.parse())
    return dataclasses.replace(base, **overrides)


def _cron(expression: str, **overrides: Any) -> NewJob:
    return _new(Schedule.parse(cron=expression), **overrides)


def _once(at: datetime, **overrides: Any) -> NewJob:
    return _new(Schedule.parse(at=at), **overrides)


def _at(clock: FakeClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


def _leases(store: Store, owner: str = SCHEDULER) -> ShardLeases:
    return store.shard_acquire(owner, SHARD_TTL)


def _dispatch(
    store: Store,
    *,
    owner: str = SCHEDULER,
    window: float = WINDOW,
    grace: float = GRACE,
    limit: int = 1000,
) -> list[QueueItem]:
    """One scheduler pass: renew (or take) the shard leases, then dispatch."""
    return store.execution_dispatch(DispatchParams(_leases(store, owner), window, grace, limit))


def _reap(store: Store) -> list[Execution]:
    return store.execution_reap(1000)


def _get(store: Store, execution_id: str) -> Execution:
    execution = store.execution_get(execution_id)
    assert execution is not None, f"execution {execution_id} vanished"
    return execution


def _job(store: Store, job_id: str) -> Job:
    job = store.job_get(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


def _runs(store: Store, job_id: str) -> list[Execution]:
    return store.execution_list(job_id, limit=1000)


def _only_run(store: Store, job_id: str) -> Execution:
    runs = _runs(store, job_id)
    assert len(runs) == 1, runs
    return runs[0]


def _pending(store: Store, job_id: str) -> list[Execution]:
    return [r for r in _runs(store, job_id) if r.status in PENDING_STATUSES]


def _ids(items: Iterable[QueueItem | Execution | ClaimedRun]) -> set[str]:
    out: set[str] = set()
    for item in items:
        if isinstance(item, QueueItem):
            out.add(item.execution_id)
        elif isinstance(item, ClaimedRun):
            out.add(item.execution.id)
        else:
            out.add(item.id)
    return out


def _claim(
    store: Store, execution_id: str, owner: str = WORKER, ttl: float = RUN_TTL
) -> ClaimedRun:
    result = store.execution_claim([execution_id], owner, ttl, GRACE)
    assert len(result.started) == 1, result
    return result.started[0]


def _start(store: Store, new: NewJob | None = None, owner: str = WORKER) -> ClaimedRun:
    """Create a job that runs now, dispatch it and claim its run."""
    job = store.job_create(new or _new()).job
    run = _only_run(store, job.id)
    assert run.id in _ids(_dispatch(store))
    return _claim(store, run.id, owner)


def _held(*runs: ClaimedRun) -> dict[str, int]:
    """What a worker running ``runs`` heartbeats: id -> fencing token."""
    return {run.execution.id: run.execution.fencing_token for run in runs}


def _ok(run: ClaimedRun, result: Any = None) -> Completion:
    return Completion(run.execution.id, run.execution.fencing_token, succeeded=True, result=result)


def _failed(run: ClaimedRun, error: str = "boom", retry_in: float | None = None) -> Completion:
    return Completion(
        run.execution.id,
        run.execution.fencing_token,
        succeeded=False,
        error=error,
        retry_in=retry_in,
    )


def _attempt_of(execution: Execution, fencing_token: int) -> AttemptOutcome:
    found = [a for a in execution.attempts if a.fencing_token == fencing_token]
    assert len(found) == 1, execution.attempts
    return found[0].outcome


def _two_schedulers(store: Store) -> tuple[ShardLeases, ShardLeases]:
    """Two live schedulers, renewed until they split the shards between them."""
    a = _leases(store, SCHEDULER)
    b = _leases(store, OTHER_SCHEDULER)
    for _ in range(3):
        a = _leases(store, SCHEDULER)
        b = _leases(store, OTHER_SCHEDULER)
    return a, b


def _job_in_shards(store: Store, shards: Iterable[int], new: NewJob | None = None) -> Job:
    """A job whose shard is one of ``shards`` (jobs created on the way are cancelled)."""
    wanted = set(shards)
    for _ in range(200):
        job = store.job_create(new or _new()).job
        if job.shard in wanted:
            return job
        store.job_cancel(job.id)
    raise AssertionError(f"no job landed in shards {sorted(wanted)} in 200 tries")


def _misfired(store: Store, clock: FakeClock, misfire: MisfirePolicy, **overrides: Any) -> Job:
    """An hourly job created at 12:00 (first fire 13:00) whose scheduler comes back at 17:30."""
    job = store.job_create(_cron(HOURLY, misfire=misfire, **overrides)).job
    assert job.next_fire_at == clock.now().replace(hour=13)
    clock.set(clock.now().replace(hour=17, minute=30))
    return job


class StoreContract:
    """Behaviour every ``Store`` backend owes its callers; see the module docstring."""

    # -- job_create, job_get, job_list, execution_list, execution_get -------------------------

    def test_job_create__idempotency_key_returns_the_first_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        first = store.job_create(_new(idempotency_key="k-1"))
        again = store.job_create(_new(idempotency_key="k-1"))
        assert again.job.id == first.job.id
        assert (first.replayed, again.replayed) == (False, True)
        assert [j.id for j in store.job_list()] == [first.job.id]
        assert len(_runs(store, first.job.id)) == 1

    def test_job_create__idempotency_key_reused_for_another_submission_is_refused(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.job_create(_new(idempotency_key="k-1"))
        with pytest.raises(ValidationError) as refused:
            store.job_create(_new(params={"other": True}, idempotency_key="k-1"))
        assert refused.value.field == "Idempotency-Key"
        assert len(store.job_list()) == 1

    def test_job_create__idempotency_key_is_per_tenant_and_expires_after_a_day(
        self, store: Store, clock: FakeClock
    ) -> None:
        mine = store.job_create(_new(tenant="acme", idempotency_key="k")).job
        theirs = store.job_create(_new(tenant="globex", idempotency_key="k")).job
        assert mine.id != theirs.id
        clock.advance(24 * 3600 + 1)
        later = store.job_create(_new(tenant="acme", idempotency_key="k")).job
        assert later.id != mine.id

    def test_job_create__now_job_with_first_execution_due_now(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new()).job
        assert job.status is JobStatus.ACTIVE
        assert job.next_fire_at == clock.now()
        assert 0 <= job.shard < store.shard_count
        run = _only_run(store, job.id)
        assert run.job_id == job.id
        assert run.shard == job.shard
        assert run.trigger is Trigger.SCHEDULE
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.scheduled_for == run.due_at == clock.now()
        assert run.attempt == 0
        assert run.lease_owner is None
        assert run.attempts == ()

    def test_job_create__once_job_first_execution_at_its_time(
        self, store: Store, clock: FakeClock
    ) -> None:
        at = _at(clock, 3600)
        job = store.job_create(_once(at)).job
        assert job.next_fire_at == at
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.scheduled_for == run.due_at == at

    def test_job_create__cron_job_first_execution_at_next_fire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron("*/15 * * * *")).job
        fire = clock.now().replace(minute=15)
        assert job.next_fire_at == fire
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.trigger is Trigger.SCHEDULE
        assert run.scheduled_for == run.due_at == fire

    def test_job_create__jitter_puts_due_at_within_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        jitter = 30.0
        runs = [
            _only_run(store, store.job_create(_cron(HOURLY, jitter=jitter)).job.id)
            for _ in range(8)
        ]
        for run in runs:
            assert run.scheduled_for == clock.now().replace(hour=13)
            assert run.scheduled_for <= run.due_at < run.scheduled_for + timedelta(seconds=jitter)
        assert any(run.due_at > run.scheduled_for for run in runs), "jitter never moved a run"

    def test_job_create__definition_is_stored(self, store: Store, clock: FakeClock) -> None:
        new = _cron(
            HOURLY,
            task="tasks.report",
            params={"to": "ops", "n": [1, 2]},
            retry=RetryPolicy(max_attempts=7, backoff_base=2.0, backoff_cap=60.0),
            timeout=12.5,
            overlap=OverlapPolicy.QUEUE,
            misfire=MisfirePolicy.RUN_ALL,
            catchup_window=600.0,
            priority=5,
            jitter=3.0,
            tenant="acme",
        )
        job = store.job_create(new).job
        for name in (
            "task",
            "params",
            "schedule",
            "retry",
            "timeout",
            "overlap",
            "misfire",
            "catchup_window",
            "priority",
            "jitter",
            "tenant",
        ):
            assert getattr(job, name) == getattr(new, name), name
        assert store.job_get(job.id) == job

    def test_job_get__unknown_is_none(self, store: Store, clock: FakeClock) -> None:
        assert store.job_get("no-such-job") is None

    def test_job_list__keyset_pages_in_id_order(self, store: Store, clock: FakeClock) -> None:
        created = {store.job_create(_new()).job.id for _ in range(5)}
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = [job.id for job in store.job_list(after_id=after, limit=2)]
            if not page:
                break
            pages.append(page)
            after = page[-1]
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [job_id for page in pages for job_id in page]
        assert listed == sorted(created)

    def test_job_list__filters(self, store: Store, clock: FakeClock) -> None:
        a = store.job_create(_new(task="tasks.a", tenant="t1")).job
        b = store.job_create(_new(task="tasks.b", tenant="t2")).job
        c = store.job_create(_new(task="tasks.a", tenant="t2")).job
        store.job_pause(c.id)
        assert {j.id for j in store.job_list(tenant="t1")} == {a.id}
        assert {j.id for j in store.job_list(tenant="t2")} == {b.id, c.id}
        assert {j.id for j in store.job_list(task="tasks.a")} == {a.id, c.id}
        assert {j.id for j in store.job_list(status=JobStatus.PAUSED)} == {c.id}
        assert {j.id for j in store.job_list(status=JobStatus.ACTIVE)} == {a.id, b.id}
        assert {j.id for j in store.job_list(tenant="t2", task="tasks.b")} == {b.id}
        assert store.job_list(tenant="nobody") == []

    def test_execution_list__newest_fire_first_with_keyset_pages(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_SECOND)).job
        _dispatch(store)  # fires at +1..+10 queued, +11 scheduled
        runs = _runs(store, job.id)
        assert len(runs) == 11
        fires = [r.scheduled_for for r in runs]
        assert fires == sorted(fires, reverse=True)
        assert len(set(fires)) == len(fires)
        paged: list[Execution] = []
        before: str | None = None
        while page := store.execution_list(job.id, before_id=before, limit=4):
            paged.extend(page)
            before = page[-1].id
        assert [r.id for r in paged] == [r.id for r in runs]
        queued = store.execution_list(job.id, status=ExecutionStatus.QUEUED)
        assert len(queued) == 10
        assert all(r.status is ExecutionStatus.QUEUED for r in queued)
        assert [r.id for r in store.execution_list(job.id, status=ExecutionStatus.SCHEDULED)] == [
            runs[0].id
        ]

    def test_execution_get__unknown_is_none(self, store: Store, clock: FakeClock) -> None:
        assert store.execution_get("no-such-execution") is None

    # -- shard_acquire / shard_release --------------------------------------------------------

    def test_shard_acquire__single_owner_takes_every_shard(
        self, store: Store, clock: FakeClock
    ) -> None:
        every = set(range(store.shard_count))
        first = _leases(store)
        assert first.owner == SCHEDULER
        assert set(first.epochs) == every
        assert first.acquired == every
        renewed = _leases(store)
        assert renewed.epochs == first.epochs
        assert renewed.acquired == frozenset()

    def test_shard_acquire__two_owners_converge_to_fair_share(
        self, store: Store, clock: FakeClock
    ) -> None:
        every = set(range(store.shard_count))
        a = _leases(store, SCHEDULER)
        assert set(a.epochs) == every
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs).isdisjoint(a.epochs), "a live owner's shard was taken"
        b_taken = set(b.acquired)
        for _ in range(3):
            a = _leases(store, SCHEDULER)
            assert len(a.epochs) <= math.ceil(store.shard_count / 2), (
                "the first owner kept its excess"
            )
            b = _leases(store, OTHER_SCHEDULER)
            b_taken |= b.acquired
        assert b.acquired == frozenset(), "still moving shards after convergence"
        assert set(a.epochs).isdisjoint(b.epochs)
        assert set(a.epochs) | set(b.epochs) == every
        assert sorted([len(a.epochs), len(b.epochs)]) == [
            store.shard_count // 2,
            math.ceil(store.shard_count / 2),
        ]
        assert b_taken == set(b.epochs)

    def test_shard_acquire__three_owners_leave_nobody_idle(
        self, store: Store, clock: FakeClock
    ) -> None:
        owners = ["scheduler-a", "scheduler-b", "scheduler-c"]
        held: dict[str, set[int]] = {}
        for _ in range(4):
            for owner in owners:
                held[owner] = set(_leases(store, owner).epochs)
        sizes = sorted(len(shards) for shards in held.values())
        base, extra = divmod(store.shard_count, len(owners))
        assert sizes == [base] * (len(owners) - extra) + [base + 1] * extra
        assert set().union(*held.values()) == set(range(store.shard_count))

    def test_shard_acquire__silent_owner_loses_shards_after_ttl(
        self, store: Store, clock: FakeClock
    ) -> None:
        a, b = _two_schedulers(store)
        clock.advance(SHARD_TTL / 2)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs).isdisjoint(a.epochs), "took shards before their lease expired"
        clock.advance(SHARD_TTL / 2 + 1)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs) == set(range(store.shard_count))
        assert b.acquired == frozenset(a.epochs)
        for shard, epoch in a.epochs.items():
            assert b.epochs[shard] > epoch, f"shard {shard} taken over without a new epoch"

    def test_shard_release__frees_shards_for_others(self, store: Store, clock: FakeClock) -> None:
        a = _leases(store, SCHEDULER)
        assert _leases(store, OTHER_SCHEDULER).epochs == {}
        store.shard_release(SCHEDULER)
        b = _leases(store, OTHER_SCHEDULER)
        assert set(b.epochs) == set(range(store.shard_count))
        assert b.acquired == frozenset(b.epochs)
        for shard, epoch in a.epochs.items():
            assert b.epochs[shard] > epoch

    # -- execution_dispatch --------------------------------------------------------------------

    def test_execution_dispatch__queues_runs_due_within_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        t0 = clock.now()
        now_run = _only_run(store, store.job_create(_new(priority=3)).job.id)
        soon_run = _only_run(store, store.job_create(_once(_at(clock, 5))).job.id)
        later_run = _only_run(store, store.job_create(_once(_at(clock, 60))).job.id)
        items = _dispatch(store)
        assert sorted(items, key=lambda i: i.due_at) == [
            QueueItem(now_run.id, t0, 3),
            QueueItem(soon_run.id, t0 + timedelta(seconds=5), 0),
        ]
        assert _get(store, now_run.id).status is ExecutionStatus.QUEUED
        assert _get(store, soon_run.id).status is ExecutionStatus.QUEUED
        assert _get(store, later_run.id).status is ExecutionStatus.SCHEDULED
        assert _dispatch(store) == [], "a queued run was dispatched twice"
        clock.advance(50)
        assert _dispatch(store) == [QueueItem(later_run.id, t0 + timedelta(seconds=60), 0)]

    def test_execution_dispatch__respects_limit(self, store: Store, clock: FakeClock) -> None:
        for _ in range(3):
            store.job_create(_new())
        first = _dispatch(store, limit=2)
        assert len(first) == 2
        second = _dispatch(store, limit=2)
        assert len(second) == 1
        assert _ids(first).isdisjoint(_ids(second))

    def test_execution_dispatch__only_from_held_shards(
        self, store: Store, clock: FakeClock
    ) -> None:
        _leases(store, SCHEDULER)  # holds every shard
        run = _only_run(store, store.job_create(_new()).job.id)
        leases = _leases(store, OTHER_SCHEDULER)
        assert leases.epochs == {}
        assert store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 1000)) == []
        assert _get(store, run.id).status is ExecutionStatus.SCHEDULED

    def test_execution_dispatch__materialises_next_cron_fire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        first = _only_run(store, job.id)
        clock.advance(55)
        assert _dispatch(store) == [QueueItem(first.id, first.scheduled_for, 0)]
        nxt = first.scheduled_for + timedelta(minutes=1)
        for _ in range(2):  # a repeated pass changes nothing
            pending = _pending(store, job.id)
            scheduled = [r for r in pending if r.status is ExecutionStatus.SCHEDULED]
            assert [r.scheduled_for for r in scheduled] == [nxt]
            assert scheduled[0].due_at == nxt
            assert _job(store, job.id).next_fire_at == nxt
            assert _dispatch(store) == []
        assert len(_runs(store, job.id)) == 2

    def test_execution_dispatch__every_second_cron_fills_window_in_one_call(
        self, store: Store, clock: FakeClock
    ) -> None:
        t0 = clock.now()
        job = store.job_create(_cron(EVERY_SECOND)).job
        items = _dispatch(store, window=10)
        assert sorted(i.due_at for i in items) == [t0 + timedelta(seconds=s) for s in range(1, 11)]
        runs = _runs(store, job.id)
        assert _ids(items) == {r.id for r in runs if r.status is ExecutionStatus.QUEUED}
        scheduled = [r for r in runs if r.status is ExecutionStatus.SCHEDULED]
        assert [r.scheduled_for for r in scheduled] == [t0 + timedelta(seconds=11)]
        assert _job(store, job.id).next_fire_at == t0 + timedelta(seconds=11)

    def test_execution_dispatch__stale_lease_writes_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        stale = _leases(store, SCHEDULER)
        clock.advance(SHARD_TTL + 1)
        taker = _leases(store, OTHER_SCHEDULER)
        assert set(taker.epochs) == set(stale.epochs)
        job = store.job_create(_cron(EVERY_SECOND)).job
        run = _only_run(store, job.id)
        clock.advance(1)
        assert store.execution_dispatch(DispatchParams(stale, WINDOW, GRACE, 1000)) == []
        assert _runs(store, job.id) == [run], "a fenced scheduler wrote executions"
        assert _job(store, job.id).next_fire_at == run.scheduled_for
        items = store.execution_dispatch(DispatchParams(taker, WINDOW, GRACE, 1000))
        assert run.id in _ids(items)

    def test_execution_dispatch__takeovers_never_duplicate_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_MINUTE)).job
        owners = [SCHEDULER, OTHER_SCHEDULER]
        stale: list[ShardLeases] = []
        alive = 0
        for step in range(48):  # a pass every 15 s for 12 minutes, a takeover every 3
            clock.advance(15)
            if step % 12 == 11:
                stale.append(_leases(store, owners[alive]))
                alive = 1 - alive  # the live scheduler stalls; the other one takes over
            leases = _leases(store, owners[alive])
            store.execution_dispatch(DispatchParams(leases, WINDOW, GRACE, 1000))
            for zombie in stale[-1:]:  # the stalled one wakes up with its old leases
                store.execution_dispatch(DispatchParams(zombie, WINDOW, GRACE, 1000))
        runs = _runs(store, job.id)
        keys = [(r.scheduled_for, r.trigger) for r in runs]
        assert len(keys) == len(set(keys)), "duplicate (job, scheduled_for, trigger)"
        fires = sorted(r.scheduled_for for r in runs)
        minute = timedelta(minutes=1)
        assert all(b - a == minute for a, b in itertools.pairwise(fires)), "a gap"
        assert fires[0] == clock.now().replace(hour=12, minute=1, second=0)
        assert fires[-1] > clock.now()
        scheduled = [r for r in runs if r.status is ExecutionStatus.SCHEDULED]
        assert [r.scheduled_for for r in scheduled] == [fires[-1]]
        assert all(r.status is ExecutionStatus.QUEUED for r in runs if r not in scheduled)
        assert _job(store, job.id).next_fire_at == fires[-1]

    # -- misfire -------------------------------------------------------------------------------

    def test_execution_dispatch__misfire_run_once(self, store: Store, clock: FakeClock) -> None:
        job = _misfired(store, clock, MisfirePolicy.RUN_ONCE)
        items = _dispatch(store, grace=GRACE)
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        assert len(items) == 1
        caught_up = _get(store, items[0].execution_id)
        assert caught_up.status is ExecutionStatus.QUEUED
        assert caught_up.scheduled_for.hour in range(13, 18)
        for hour in range(13, 18):
            if hour != caught_up.scheduled_for.hour:
                assert runs[hour].status is ExecutionStatus.SKIPPED, hour
                assert runs[hour].reason, hour
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for

    def test_execution_dispatch__misfire_run_all_within_catchup_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = _misfired(store, clock, MisfirePolicy.RUN_ALL, catchup_window=3 * 3600.0)
        items = _dispatch(store, grace=GRACE)  # catch-up line: 14:30
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        assert _ids(items) == {runs[h].id for h in (15, 16, 17)}
        for hour in (15, 16, 17):
            assert runs[hour].status is ExecutionStatus.QUEUED
        for hour in (13, 14):
            assert runs[hour].status is ExecutionStatus.SKIPPED
            assert runs[hour].reason
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for

    def test_execution_dispatch__misfire_skip(self, store: Store, clock: FakeClock) -> None:
        job = _misfired(store, clock, MisfirePolicy.SKIP)
        assert _dispatch(store, grace=GRACE) == []
        runs = {r.scheduled_for.hour: r for r in _runs(store, job.id)}
        assert sorted(runs) == [13, 14, 15, 16, 17, 18]
        for hour in range(13, 18):
            assert runs[hour].status is ExecutionStatus.SKIPPED
            assert "misfire" in (runs[hour].reason or "").lower(), runs[hour].reason
        assert runs[18].status is ExecutionStatus.SCHEDULED
        assert runs[18].scheduled_for > clock.now()
        assert _job(store, job.id).next_fire_at == runs[18].scheduled_for
        assert _job(store, job.id).status is JobStatus.ACTIVE

    def test_execution_dispatch__late_within_grace_is_no_misfire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new(misfire=MisfirePolicy.SKIP)).job
        clock.advance(GRACE / 2)
        assert _ids(_dispatch(store, grace=GRACE)) == {_only_run(store, job.id).id}

    def test_execution_dispatch__misfired_once_job_run_once_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 300), misfire=MisfirePolicy.RUN_ONCE)).job
        clock.advance(7200)
        run = _only_run(store, job.id)
        assert _ids(_dispatch(store, grace=GRACE)) == {run.id}
        assert _get(store, run.id).status is ExecutionStatus.QUEUED

    def test_execution_dispatch__misfired_once_job_skip_completes_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_once(_at(clock, 300), misfire=MisfirePolicy.SKIP)).job
        clock.advance(7200)
        assert _dispatch(store, grace=GRACE) == []
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SKIPPED
        assert "misfire" in (run.reason or "").lower()
        assert _job(store, job.id).status is JobStatus.COMPLETED

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
        assert result.not_due == [QueueItem(run.id, run.due_at, 2)]
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
        assert store.execution_sweep(leases, every, 60.0, 100).items == [QueueItem(lost.id, t0, 4)]
        assert store.execution_sweep(leases, every, 300.0, 100).items == []
        swept = store.execution_sweep(leases, every, None, 100).items
        assert _ids(swept) == {lost.id, upcoming.id}
        assert running.execution.id not in _ids(swept)
        assert store.execution_sweep(leases, [], None, 100).items == []
        assert _get(store, lost.id).status is ExecutionStatus.QUEUED

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

    # -- job_run_now ---------------------------------------------------------------------------

    def test_job_run_now__manual_execution_due_now(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_cron(HOURLY)).job
        scheduled = _only_run(store, job.id)
        clock.advance(5)
        manual = store.job_run_now(job.id)
        assert manual.job_id == job.id
        assert manual.trigger is Trigger.MANUAL
        assert manual.status is ExecutionStatus.SCHEDULED
        assert manual.scheduled_for == manual.due_at == clock.now()
        assert _get(store, manual.id) == manual
        assert _ids(_dispatch(store)) == {manual.id}
        assert _claim(store, manual.id).execution.attempt == 1
        assert _get(store, scheduled.id).status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == scheduled.scheduled_for

    def test_job_run_now__twice_at_same_instant(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_cron(HOURLY)).job
        first = store.job_run_now(job.id)
        second = store.job_run_now(job.id)
        assert second.trigger is Trigger.MANUAL
        assert _get(store, second.id).status in PENDING_STATUSES
        assert {first.id, second.id} <= {r.id for r in _pending(store, job.id)}

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

    # -- a rule-based model of claim / heartbeat / reap / finish / release ---------------------

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
        self.store = self._exit.enter_context(type(self).open_store(directory, self.clock))
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
