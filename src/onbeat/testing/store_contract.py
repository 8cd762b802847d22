"""The ``Store`` contract suite: every backend must pass it unchanged. This module holds what its
parts share (fixtures' types, constants, helpers); the tests are mixin classes, one module per area:

==============================  ===========================================================
``store_contract_jobs``         ``JobsContract``: create (idempotency key), get, list, run now
``store_contract_job_changes``  ``JobChangesContract``: pause, resume, cancel, edit
``store_contract_dispatch``     ``DispatchContract``: shard leases, dispatch, misfire
``store_contract_claim``        ``ClaimContract``: claim, overlap policies
``store_contract_claim_ahead``  ``ClaimAheadContract``: claims ahead of the due time, confirm
``store_contract_finish``       ``FinishContract``: finish, reap, sweep, release
``store_contract_dead_letters`` ``DeadLetterContract``: list, replay, drop
``store_contract_fencing``      ``FencingContract``: fencing tokens as a state machine
``store_contract_simulation``   ``ProtocolSimulationContract``: the run protocol with crashes
``store_contract_heartbeat``    ``HeartbeatContract``: lease renewal
``store_contract_recovery``     ``RecoveryContract``: reaping in every shard, sweep pages
``store_contract_schedules``    ``ScheduleChainContract``, ``ScheduleHistoryContract``
``store_contract_dashboard``    ``DashboardReadsContract``: the dashboard's reads
``store_contract_history``      ``HistoryContract``: final runs in the history, retention
==============================  ===========================================================

Use it by subclassing all of them in a test module that provides three fixtures: ``clock`` (a
``FakeClock``), ``store_factory`` (a :data:`StoreFactory` for the backend under test) and ``store``
(a store on a fresh, empty database from that factory, driven by ``clock``, closed afterwards)::

    @pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.external_service)])
    def store_factory(request) -> StoreFactory: ...

    @pytest.fixture
    def store(store_factory, tmp_path, clock) -> Iterator[Store]:
        with store_factory(tmp_path, clock) as open_store:
            yield open_store()

    class TestStore(JobsContract, JobChangesContract, DispatchContract, ...):
        pass

``tests/contract/test_store.py`` is the complete example. The mixins' names do not start with
``Test`` so pytest collects them only through such a subclass.
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
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from onbeat.model import (
    PENDING_STATUSES,
    AttemptOutcome,
    Execution,
    Job,
    MisfirePolicy,
    RetryPolicy,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule
from onbeat.store.base import ClaimedRun, Completion, DispatchParams, NewJob, ShardLeases, Store
from onbeat.testing.clock import FakeClock

__all__ = ["SHARD_COUNT", "StoreFactory", "StoreOpener"]

StoreOpener = Callable[[], Store]
"""Opens one more store on the database its factory made, with connections of its own and the
factory's clock; the factory closes it. Two of them stand for two processes sharing a database."""

StoreFactory = Callable[[Path, FakeClock], AbstractContextManager[StoreOpener]]
"""Makes a fresh, empty database (files, if any, under the given empty directory) and yields a
:data:`StoreOpener` for it; on exit closes every store opened on it (and, for a server database,
drops it). Most tests use one store; the concurrency tests open two on one database."""

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
