"""A dead node's runs come back within their lease TTL + the reap interval, whoever died: any live
scheduler reaps expired leases in every shard, without waiting to take the shards over."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from onbeat import AttemptOutcome, ExecutionStatus
from onbeat.errors import StoreUnavailableError
from onbeat.model import Execution
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.schedule import Schedule
from onbeat.scheduler import Scheduler
from onbeat.store import sqlite as sqlite_store
from onbeat.store.base import DispatchParams, NewJob
from onbeat.store.rows import to_us
from onbeat.store.sqlite import SQLiteStore
from onbeat.testing import FakeClock
from onbeat.worker import Worker
from tests.integration.conftest import Node


async def test_rescue__a_dead_nodes_runs_restart_elsewhere_before_its_shards_are_taken_over(
    node: Node,
) -> None:
    settings = node.app.settings
    jobs = [node.app.schedule("record", {"n": n}) for n in range(6)]
    # Node A: its scheduler holds every shard and dispatched the runs; its worker claimed them.
    # Then A dies whole: no heartbeat, no renewal, no release.
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    ids = await node.queue.claim_due(100)
    dead_worker = node.new_worker()
    assert (
        len(
            node.app.store.execution_claim(
                ids, dead_worker.owner, settings.lease_ttl, settings.misfire_grace
            ).started
        )
        == 6
    )
    # Node B: its own queue, worker and scheduler; A's shard leases (15 s) outlive the runs' (10 s).
    queue_b = MemoryDelayQueue(node.clock)
    scheduler_b = Scheduler(node.app.store, queue_b, settings, node.clock)
    worker_b = Worker(node.app.store, queue_b, node.app.registry, settings, node.clock)
    reaped_at = None
    while not node.calls.seen and node.clock.monotonic() < settings.shard_lease_ttl:
        node.clock.advance(settings.reap_interval)
        await scheduler_b.renew_shards()
        assert scheduler_b.leases.epochs == {}, "B took a shard over: not what is tested here"
        if await scheduler_b.reap() and reaped_at is None:
            reaped_at = node.clock.monotonic()
        await scheduler_b.dispatch()
        await worker_b.run_until_idle()
    assert reaped_at is not None
    assert reaped_at <= settings.lease_ttl + settings.reap_interval
    # Due again after the lost attempt's backoff (at most ``backoff`` = 1 s for attempt 1).
    while len(node.calls.seen) < 6 and node.clock.monotonic() < reaped_at + 1:
        node.clock.advance(0.25)
        await worker_b.run_until_idle()
    assert scheduler_b.leases.epochs == {}
    assert sorted(params["n"] for _, params, _ in node.calls.seen) == list(range(6))
    for job in jobs:
        [execution] = node.app.list_executions(job.id)
        assert execution.status is ExecutionStatus.SUCCEEDED
        assert [a.outcome for a in execution.attempts] == [
            AttemptOutcome.LOST,
            AttemptOutcome.SUCCEEDED,
        ]
        assert execution.attempts[1].worker == worker_b.owner


def test_reap_statement__changes_a_run_only_while_its_lease_is_expired_under_that_token(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The reap's UPDATE re-checks expiry and fencing token itself, so a heartbeat or an outcome
    committed between the reaper's read and its write wins (on a database where other sessions
    can commit in between), and a second reaper changes nothing."""
    store = SQLiteStore(tmp_path / "onbeat.db", clock)
    try:
        job = store.job_create(NewJob(task="t", params={}, schedule=Schedule.parse())).job
        leases = store.shard_acquire("scheduler", 30)
        [item] = store.execution_dispatch(DispatchParams(leases, 10, 60, 10))
        [run] = store.execution_claim([item.execution_id], "worker", 10, 60).started
        token = run.execution.fencing_token
        clock.advance(11)

        def apply(fencing_token: int) -> list[str]:
            decision = {
                "id": item.execution_id,
                "fencing_token": fencing_token,
                "status": "queued",
                "due_at": to_us(clock.now()),
                "error": "worker lost",
                "reason": "retry",
            }
            args = {"decisions": json.dumps([decision]), "now": to_us(clock.now())}
            with store._tx() as c:
                return [r["id"] for r in c.execute(sqlite_store.Q["execution_reap"], args)]

        assert apply(token - 1) == [], "a decision about an older attempt was applied"
        # committed after the reaper read the lease
        store.execution_heartbeat("worker", {item.execution_id: token}, 10)
        assert apply(token) == []
        clock.advance(11)
        assert apply(token) == [item.execution_id]
        assert apply(token) == [], "reaped twice"
        assert [e.status for e in store.execution_list(job.id)] == [ExecutionStatus.QUEUED]
    finally:
        store.close()


async def _claimed_by_a_holder(node: Node, runs: int) -> None:
    """``runs`` one-shot runs, dispatched and started by a worker that then goes quiet (its
    heartbeat never runs): only the reaper can move them on."""
    settings = node.app.settings
    for n in range(runs):
        node.app.schedule("record", {"n": n})
    await node.dispatch()
    ids = await node.queue.claim_due(100)
    holder = node.new_worker()
    started = node.app.store.execution_claim(
        ids, holder.owner, settings.lease_ttl, settings.misfire_grace
    ).started
    assert len(started) == runs


async def test_rescue__no_reap_within_a_lease_ttl_of_the_store_coming_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (fault suite S6, PostgreSQL crash recovery): the leases of a healthy worker ran
    out while the database was down, and the reaper took its runs the moment the database was
    back, before the worker could reconnect and renew them: every one ran twice."""
    settings = node.app.settings
    await _claimed_by_a_holder(node, 3)
    reap = node.app.store.execution_reap

    def down(limit: int, restart_grace: float = 0.0) -> list[Execution]:
        raise StoreUnavailableError("the database is down (test)")

    monkeypatch.setattr(node.app.store, "execution_reap", down)
    stop = asyncio.Event()
    passes = node.scheduler._every(settings.reap_interval, node.scheduler.reap, stop)
    loop = asyncio.create_task(passes)
    node.clock.advance(settings.lease_ttl + 1)  # the leases ran out during the outage
    await node.clock.until_sleeping()  # its pass found the store down
    stop.set()
    await asyncio.wait_for(loop, 5)
    monkeypatch.setattr(node.app.store, "execution_reap", reap)  # back
    assert await node.scheduler.reap() == 0  # the holder gets a lease TTL to renew
    node.clock.advance(settings.lease_ttl - 1)
    assert await node.scheduler.reap() == 0
    node.clock.advance(1)
    assert await node.scheduler.reap() == 3  # nobody renewed: the holder is dead after all


async def test_rescue__no_reap_within_a_lease_ttl_of_a_reap_the_store_kept_waiting(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (fault suite S6, ``LOCK TABLE runs`` held past the lease TTL): the holders'
    heartbeats waited behind the lock like the reaper did; the reaper's next pass, right after
    the lock was released, took their runs before the queued heartbeats committed."""
    settings = node.app.settings
    await _claimed_by_a_holder(node, 1)
    reap = node.app.store.execution_reap

    def blocked(limit: int, restart_grace: float = 0.0) -> list[Execution]:
        node.clock.advance(settings.lease_ttl + 1)  # waited on a lock past the lease
        return []

    monkeypatch.setattr(node.app.store, "execution_reap", blocked)
    assert await node.scheduler.reap() == 0
    monkeypatch.setattr(node.app.store, "execution_reap", reap)
    assert await node.scheduler.reap() == 0  # the holder's heartbeat may be right behind
    node.clock.advance(settings.lease_ttl)
    assert await node.scheduler.reap() == 1  # nobody renewed it in a lease TTL


async def test_rescue__no_reap_by_a_pass_that_waited_to_reach_the_store(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (fault suite N1, PostgreSQL ``stop -m immediate`` + start on a busy box): a
    reap pass waited for a connection through the server's 5.7 s of crash recovery, past the
    store's grace from the server's start, and reaped the healthy workers' runs the moment it got
    in, before they could reconnect: their outcomes were refused and every run ran twice."""
    settings = node.app.settings
    await _claimed_by_a_holder(node, 1)
    ping = node.app.store.ping

    def waited() -> None:
        node.clock.advance(settings.lease_ttl + 1)  # got through after the leases ran out
        ping()

    monkeypatch.setattr(node.app.store, "ping", waited)
    caplog.set_level(logging.INFO, logger="onbeat.scheduler")
    assert await node.scheduler.reap() == 0  # the holder is reconnecting too
    monkeypatch.setattr(node.app.store, "ping", ping)
    node.clock.advance(settings.lease_ttl - 1)
    assert await node.scheduler.reap() == 0
    node.clock.advance(1)
    assert await node.scheduler.reap() == 1  # nobody renewed it in a lease TTL: dead after all
    # One line says why the runs of a dead worker wait (once per hold-off, not per pass).
    held_off = [r.getMessage() for r in caplog.records if "reaper holding off" in r.getMessage()]
    assert len(held_off) == 1, held_off


async def test_rescue__no_reap_within_a_lease_ttl_of_the_first_round_trip_after_a_failure(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (fault suite N1, PostgreSQL ``stop -m immediate`` + start, 5 s of crash
    recovery): a pass found the store down; a lease TTL later the server was back, and the
    reaper's first pass got through at once and reaped the runs of a worker whose connection pool
    reconnected 2 s later (its backoff): their outcomes were refused and they ran twice. The
    holders get a lease TTL from the moment the store answers again."""
    settings = node.app.settings
    await _claimed_by_a_holder(node, 2)
    ping = node.app.store.ping

    def down() -> None:
        raise StoreUnavailableError("the database is down (test)")

    monkeypatch.setattr(node.app.store, "ping", down)
    stop = asyncio.Event()
    passes = asyncio.create_task(
        node.scheduler._every(settings.reap_interval, node.scheduler.reap, stop)
    )
    await node.clock.until_sleeping()  # its pass found the store down
    stop.set()
    await asyncio.wait_for(passes, 5)
    monkeypatch.setattr(node.app.store, "ping", ping)
    node.clock.advance(settings.lease_ttl + 1)  # down past the leases; the first pass gets in
    assert await node.scheduler.reap() == 0  # the holder may be reconnecting still
    node.clock.advance(settings.lease_ttl - 1)
    assert await node.scheduler.reap() == 0
    node.clock.advance(1)
    assert await node.scheduler.reap() == 2  # nobody renewed them in a lease TTL: dead after all
