"""Under a backlog the scheduler degrades instead of collapsing: the sweep re-enqueues only what
the queue lost, a bounded page per pass, and the shard leases are renewed whatever else is slow."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.store.base import Store
from onbeat.testing import FakeClock
from tests.integration.conftest import Node

SAFETY_TIMEOUT = 10.0
"""Real seconds before a wait that should already be over is declared hung."""


async def backlog(node: Node, runs: int) -> list[str]:
    """``runs`` runs queued in the store and held by the queue, overdue by more than
    ``sweep_overdue``, with nobody claiming them (the worker is not driven)."""
    jobs = [node.app.schedule("record") for _ in range(runs)]
    await node.scheduler.renew_shards()
    assert await node.scheduler.sweep() == 0  # the takeover check of the fresh shards: empty
    assert await node.scheduler.dispatch() == runs
    node.clock.advance(node.app.settings.sweep_overdue + 1)
    return [node.app.list_executions(job.id)[0].id for job in jobs]


async def test_sweep__reenqueues_nothing_the_queue_still_holds(node: Node) -> None:
    await backlog(node, 25)
    for _ in range(3):
        assert await node.scheduler.sweep() == 0
    assert node.scheduler.stats.swept == 0


async def test_sweep__reenqueues_exactly_the_runs_the_queue_lost(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.app.settings.sweep_batch = 10
    ids = await backlog(node, 25)
    lost = ids[::4]  # 7 runs, spread over every page
    await node.queue.remove(lost)
    with caplog.at_level(logging.INFO, "onbeat.scheduler"):
        passes = [await node.scheduler.sweep() for _ in range(3)]  # 3 pages of at most 10: 25
    assert sum(passes) == len(lost) == 7
    assert [r.getMessage() for r in caplog.records if "re-enqueued" in r.getMessage()] == [
        f"re-enqueued {n} runs queued over 15s ago that the delay queue did not hold"
        for n in passes
        if n
    ]
    assert await node.queue.missing(ids) == []
    assert await node.scheduler.sweep() == 0


async def test_sweep__reads_a_bounded_page_per_pass_and_goes_on_where_it_stopped(
    node: Node,
) -> None:
    node.app.settings.sweep_batch = 10
    ids = await backlog(node, 25)
    await node.queue.remove(ids)  # the queue lost everything
    assert [await node.scheduler.sweep() for _ in range(4)] == [10, 10, 5, 0]
    assert await node.queue.size() == 25
    assert await node.queue.missing(ids) == []


async def test_sweep__after_a_takeover_checks_every_queued_run_not_only_overdue_ones(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead scheduler's queue is gone with it: its queued runs go to the new owner's queue as
    it takes the shards, not ``sweep_overdue`` after their time; page by page, each bounded."""
    node.app.settings.sweep_batch = 5
    due = node.clock.now().replace(microsecond=0).isoformat().replace("12:00:00", "12:00:03")
    jobs = [node.app.schedule("record", at=due) for _ in range(12)]
    await node.scheduler.renew_shards()
    assert await node.scheduler.dispatch() == 12  # into the dead scheduler's queue
    node.clock.advance(node.app.settings.shard_lease_ttl + 1)  # overdue by 13 s, less than 15
    heir_queue = MemoryDelayQueue(node.clock)
    heir = Scheduler(node.app.store, heir_queue, node.app.settings, node.clock)
    await heir.renew_shards()  # the takeover wakes the sweep loop
    assert heir.leases.acquired == frozenset(range(4))
    with caplog.at_level(logging.INFO, "onbeat.scheduler"):
        assert await heir.sweep() == 12  # every queued run of the shards taken, not overdue
    assert [r.getMessage() for r in caplog.records if "delay queue" in r.getMessage()] == [
        "enqueued 12 queued runs of the shards just taken over that the delay queue did not hold"
    ]
    assert heir.stats.swept == 12
    assert await heir_queue.size() == 12
    assert await heir.sweep() == 0
    assert {node.app.list_executions(job.id)[0].id for job in jobs} == set(
        await heir_queue.claim_due(100)
    )


class StuckStore:
    """The node's store, except that a call of ``stuck`` hangs until ``release`` is set: a
    dispatch or sweep pass that takes far longer than the shard lease (a huge backlog, a slow
    disk, a busy box)."""

    def __init__(self, store: Store, stuck: str) -> None:
        self._store, self._stuck = store, stuck
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if name != self._stuck:
            return method

        def hanging(*args: Any) -> Any:
            self.entered.set()
            self.release.wait(SAFETY_TIMEOUT)
            return method(*args)

        return hanging


async def test_scheduler__shard_leases_are_renewed_while_a_dispatch_pass_hangs(
    node: Node, clock: FakeClock
) -> None:
    await leases_renewed_while_stuck(node, clock, StuckStore(node.app.store, "execution_dispatch"))


async def test_scheduler__shard_leases_are_renewed_while_the_sweep_after_a_takeover_hangs(
    node: Node, clock: FakeClock
) -> None:
    """The sweep of the shards just taken ran inside the renew pass: a long one (1,024 shards'
    queued runs on a busy box) let the leases lapse, the other scheduler took them, swept them
    in its renew pass in turn, and so on (the fault suite's S7 saw the shards change hands every
    few seconds). The renew loop only wakes the sweep loop now."""
    await leases_renewed_while_stuck(node, clock, StuckStore(node.app.store, "execution_sweep"))


async def leases_renewed_while_stuck(node: Node, clock: FakeClock, store: StuckStore) -> None:
    """``store`` hangs in one method while three shard lease TTLs go by: the scheduler keeps
    its shards (it took all four at start), and no other scheduler can take one."""
    settings = node.app.settings
    scheduler = Scheduler(store, node.queue, settings, clock)
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stop))
    try:
        assert await asyncio.to_thread(store.entered.wait, SAFETY_TIMEOUT)
        await asyncio.wait_for(scheduler.started.wait(), SAFETY_TIMEOUT)  # the first renewal
        held = dict(scheduler.leases.epochs)
        assert sorted(held) == [0, 1, 2, 3]
        # Three shard lease TTLs go by while the store hangs. The loops that do not wait for it
        # (six of the seven: renew, dispatch, reap, sweep, reconcile, backlog, history) each sleep
        # on the clock again after every pass: time moves on only once every one of them is
        # asleep again, the renewal's pass done (waiting for fewer let time run ahead of a renewal
        # still in its thread, and the leases lapse in fake time on a busy box).
        for _ in range(round(3 * settings.shard_lease_ttl / settings.shard_renew_interval)):
            clock.advance(settings.shard_renew_interval)
            await asyncio.wait_for(clock.until_sleeping(6), SAFETY_TIMEOUT)
        assert dict(scheduler.leases.epochs) == held, "a lease lapsed and was taken again"
        assert scheduler.stats.shards_taken == 4
        intruder = node.app.store.shard_acquire("scheduler-intruder", settings.shard_lease_ttl)
        assert intruder.epochs == {}, "another scheduler could take a shard of a busy one"
    finally:
        store.release.set()
        stop.set()
        await asyncio.wait_for(running, SAFETY_TIMEOUT)
