"""Two workers' claims, confirms, starts, outcome writes, heartbeats and restarts, and a user's
cancels, interleaved at random with the watchdog's hand-back (what it does while a task blocks a
worker's event loop), also in the middle of their store calls, on the FakeClock. Whatever the
order:

- no run is left leased to a worker that no longer tracks it (running, or held ahead, with no
  holder until its lease runs out: the confirm race fixed on 2026-12-07 was one), nor to a
  worker that stopped;
- every run ends: succeeded, its task called once (no crash here, so no repeat) and never before
  its due time; or, if its job was cancelled, cancelled (not called) or succeeded (called once).

The hand-back is called on the test's thread at points where the loop waits for a store call
(before and after each one, as drawn), which is where the watchdog's thread runs it for real.
``ONBEAT_INTERLEAVINGS=5000`` runs more examples than CI's."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from onbeat import App, ExecutionStatus, TaskContext
from onbeat.model import Execution
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.store.base import Store
from onbeat.testing import FakeClock
from onbeat.testing.postgres import store_schema
from onbeat.worker import Worker

AHEAD = 2.0
LEASE_TTL = 10.0
MAX_JOBS = 6
ADVANCE_BUDGET = 8.0
"""The ops' clock moves stay within a lease: no lease ends for want of a heartbeat (which would
be a lost attempt, run again by design)."""

_FLEETS = itertools.count()
INTERLEAVED = (
    "execution_claim",
    "execution_confirm",
    "execution_finish_many",
    "execution_release",
    "execution_requeue",
    "execution_heartbeat",
)


class WatchdogAtStoreCalls:
    """One worker's store: before and after each of its calls in ``INTERLEAVED``, and after its
    claim's thread took the leases (``_claim_leases``, before the loop starts them), the
    watchdog's hand-back runs if the next drawn flag says so (no flags left: never)."""

    def __init__(self, store: Store, flags: list[bool]) -> None:
        self._store = store
        self._flags = deque(flags)
        self._handing_back = False
        self.worker: Worker | None = None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name not in INTERLEAVED:
            return method

        return self.interleaved(method)

    def interleaved(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.maybe_hand_back()
            result = method(*args, **kwargs)
            self.maybe_hand_back()
            return result

        return call

    def maybe_hand_back(self) -> None:
        if self._handing_back or self.worker is None or not self._flags:
            return
        if self._flags.popleft():
            self._handing_back = True  # its own release goes through here too
            try:
                self.worker._hand_back_unstarted()
            finally:
                self._handing_back = False


@dataclass
class Node:
    """One store for all of a test's examples: each example's runs are its own jobs', on a clock
    a day on from the last example's, so nothing an earlier one left (a lease, a shard) counts."""

    app: App
    clock: FakeClock
    calls: list[tuple[str, datetime]]
    """(run id, when its task began) of every task call."""


@contextmanager
def _node(database_url: str) -> Iterator[Node]:
    clock = FakeClock()
    app = App(
        database_url,
        clock=clock,
        shards=4,
        lease_ttl=LEASE_TTL,
        heartbeat_interval=3,
        window=5,
        misfire_grace=60,
        claim_ahead=AHEAD,
        concurrency=3,
    )
    node = Node(app, clock, [])

    @app.task(name="record")
    async def record(ctx: TaskContext) -> None:
        node.calls.append((ctx.execution_id, clock.now()))

    try:
        yield node
    finally:
        app.close()


class Fleet:
    """An example's scheduler and two workers, on the node's store and a queue of their own."""

    def __init__(self, node: Node, flags: tuple[list[bool], list[bool]]) -> None:
        node.clock.advance(86_400)
        node.calls.clear()
        self.app = node.app
        self.clock = node.clock
        self.calls = node.calls
        self.name = f"fleet-{next(_FLEETS)}"
        self.queue = MemoryDelayQueue(self.clock)
        self.scheduler = Scheduler(self.app.store, self.queue, self.app.settings, self.clock)
        self.stores = [WatchdogAtStoreCalls(self.app.store, worker_flags) for worker_flags in flags]
        self.stopped: list[Worker] = []
        self.workers = [self._new_worker(n) for n in range(len(flags))]

    def _new_worker(self, n: int) -> Worker:
        worker = Worker(
            cast(Store, self.stores[n]),
            self.queue,
            self.app.registry,
            self.app.settings,
            self.clock,
            owner=f"{self.name}-worker-{n}-{len(self.stopped)}",
        )
        self.stores[n].worker = worker
        interleaved = self.stores[n].interleaved(worker._claim_leases)
        worker._claim_leases = interleaved  # type: ignore[method-assign]
        return worker

    async def restart(self, n: int) -> None:
        """Stop worker ``n`` as a deploy does (it releases what it holds) and start another."""
        await self.workers[n].shutdown()
        self.stopped.append(self.workers[n])
        self.workers[n] = self._new_worker(n)

    def runs(self, job_ids: list[str]) -> list[Execution]:
        return [e for job_id in job_ids for e in self.app.list_executions(job_id)]

    async def dispatch(self) -> None:
        await self.scheduler.renew_shards()
        await self.scheduler.reap()
        await self.scheduler.dispatch()

    async def let_tasks_run(self, worker: Worker) -> None:
        tasks = [held.task for held in list(worker._held.values()) if held.task is not None]
        if tasks:
            await asyncio.gather(*tasks)


def assert_every_lease_has_a_holder(fleet: Fleet, job_ids: list[str]) -> None:
    """A run the store says a worker leases (running, or queued and held ahead) is one that
    worker tracks under the same fencing token: else nothing renews, runs or releases it."""
    owners = {worker.owner: worker for worker in fleet.workers + fleet.stopped}
    for run in fleet.runs(job_ids):
        if run.lease_owner is None or run.status not in (
            ExecutionStatus.RUNNING,
            ExecutionStatus.QUEUED,
        ):
            continue
        if run.lease_expires_at is not None and run.lease_expires_at <= fleet.clock.now():
            continue  # expired: the reaper's (a run held ahead and never confirmed)
        worker = owners[run.lease_owner]
        with worker._held_lock:
            held = worker._held.get(run.id)
            tokens = {
                held.token if held is not None else None,
                worker._claimed.get(run.id),
                worker._ahead.leases.get(run.id),
            }
        assert run.fencing_token in tokens, (
            f"run {run.id} is {run.status.value} under {run.lease_owner}'s lease (token "
            f"{run.fencing_token}) but that worker does not track it: {tokens - {None}}"
        )


WORKER_STEPS: dict[str, Callable[[Fleet, int], Awaitable[object]]] = {
    "claim": lambda fleet, n: fleet.workers[n]._claim(),
    "confirm": lambda fleet, n: fleet.workers[n]._ahead.confirm_due(),
    "run": lambda fleet, n: fleet.let_tasks_run(fleet.workers[n]),
    "flush": lambda fleet, n: fleet.workers[n].flush(),
    "heartbeat": lambda fleet, n: fleet.workers[n].heartbeat(),
    "hand_back": lambda fleet, n: asyncio.to_thread(fleet.workers[n]._hand_back_unstarted),
    "restart": lambda fleet, n: fleet.restart(n),
}
WORKER_OPS = (
    ["claim"] * 3 + ["confirm"] * 3 + ["run"] * 2 + ["flush"] * 2 + ["hand_back", "heartbeat"]
)
OPS = st.lists(
    st.sampled_from(
        [(op, worker) for op in WORKER_OPS for worker in (0, 1)]
        + [("advance", seconds) for seconds in (0.25, 0.5, 0.5, 1.0, 1.0)] * 2
        + [("dispatch", 0), ("restart", 0), ("restart", 1)]
        + [("cancel", job) for job in range(MAX_JOBS)]
    ),
    max_size=40,
)
"""The steps of the workers' loops, weighted by repetition, between moves of the clock and a
user's cancels (of the job of that index, if there is one); the watchdog's hand-back runs between
them and inside the store calls too, as the flags draw."""
FLAGS = st.lists(st.booleans(), max_size=30)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.external_service)])
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    if request.param == "postgres":
        with store_schema() as url, _node(url) as node:
            yield node
    else:
        with _node(f"sqlite:///{tmp_path / 'onbeat.db'}") as node:
            yield node


async def _play(
    fleet: Fleet, job_ids: list[str], ops: list[tuple[str, float]], check: Callable[[], None]
) -> set[str]:
    """Carry out ``ops``, checking after each; returns the ids of the jobs cancelled."""
    advanced = 0.0
    cancelled: set[str] = set()
    for op, arg in ops:
        if op in WORKER_STEPS:
            await WORKER_STEPS[op](fleet, int(arg))
        elif op == "cancel" and int(arg) < len(job_ids):
            fleet.app.cancel(job_ids[int(arg)])
            cancelled.add(job_ids[int(arg)])
        elif op == "advance" and advanced + arg <= ADVANCE_BUDGET:
            fleet.clock.advance(arg)
            advanced += arg
        elif op == "dispatch":
            await fleet.dispatch()
        check()
    return cancelled


async def _settle(fleet: Fleet, job_ids: list[str]) -> None:
    """Run the fleet as its loops would until every run has ended (bounded)."""
    for worker in fleet.workers:  # outcomes first: the clock moves on below
        await fleet.let_tasks_run(worker)
        await worker.flush()
    for _ in range(40):
        if all(run.status.is_final for run in fleet.runs(job_ids)):
            return
        fleet.clock.advance(0.5)
        await fleet.dispatch()
        for worker in fleet.workers:
            await worker._ahead.confirm_due()
            await worker._claim()
            await fleet.let_tasks_run(worker)
            await worker.flush()


@pytest.mark.timeout(600)
@settings(
    max_examples=int(os.environ.get("ONBEAT_INTERLEAVINGS", "300")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # one store for the examples: see Node
    ],
)
@example(  # the confirm race of 2026-12-07: handed back right after the confirm committed
    due_in=[1.0],
    ops=[("claim", 0), ("advance", 1.0), ("confirm", 0)],
    flags=([False, False, False, True], []),
)
@given(
    due_in=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=1, max_size=MAX_JOBS),
    ops=OPS,
    flags=st.tuples(FLAGS, FLAGS),
)
def test_worker_interleavings__every_run_ends_once_and_no_lease_is_left_without_a_holder(
    node: Node,
    due_in: list[float],
    ops: list[tuple[str, float]],
    flags: tuple[list[bool], list[bool]],
) -> None:
    fleet = Fleet(node, flags)

    async def scenario() -> None:
        at = fleet.clock.now()
        job_ids = [
            fleet.app.schedule("record", at=at + timedelta(seconds=offset)).id for offset in due_in
        ]
        await fleet.dispatch()
        cancelled = await _play(
            fleet, job_ids, ops, lambda: assert_every_lease_has_a_holder(fleet, job_ids)
        )
        await _settle(fleet, job_ids)
        runs = fleet.runs(job_ids)
        calls = Counter(execution_id for execution_id, _ in fleet.calls)
        for run in runs:
            ends = {ExecutionStatus.SUCCEEDED: 1}
            if run.job_id in cancelled:
                ends[ExecutionStatus.CANCELLED] = 0
            assert run.status in ends, (run.id, run.status.value, run.lease_owner)
            assert calls[run.id] == ends[run.status], f"{run.id} ran {calls[run.id]} times"
        due = {run.id: run.due_at for run in runs}
        early = [(eid, at, due[eid]) for eid, at in fleet.calls if eid in due and at < due[eid]]
        assert not early, f"started before their due time: {early}"
        for worker in fleet.workers:
            await worker.shutdown()

    asyncio.run(scenario())
