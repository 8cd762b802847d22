"""The worker's bookkeeping of the runs it holds: every run the store started for it is run,
heartbeated, finished or released exactly once, whatever fails, stops or interleaves."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import pytest

from onbeat import AttemptOutcome, ExecutionStatus
from onbeat.queue.base import QueueItem
from onbeat.store.base import ClaimResult, Completion, Store
from onbeat.worker import worker as worker_module
from onbeat.worker.heartbeat import Heartbeat, HeldLeases
from tests.integration.conftest import Node


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition`` holds (bounded by the caller's wait_for)."""
    while not condition():  # noqa: ASYNC110
        await asyncio.sleep(0)


class _StoreProxy:
    """The node's store, with hooks around some calls (a Store by duck typing)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _QueueProxy:
    def __init__(self, node: Node) -> None:
        self._queue = node.queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


async def test_worker__stop_during_a_claim_releases_what_the_claim_started(node: Node) -> None:
    """The claim commits in its thread while shutdown cancels the claim loop: the run it started
    is released (due again, attempt not counted), not left to its lease and dead-lettered."""

    class GatedClaims(_StoreProxy):
        entered, gate, returned = threading.Event(), threading.Event(), threading.Event()

        def execution_claim(self, *args: Any, **kwargs: Any) -> ClaimResult:
            self.entered.set()
            self.gate.wait(5)
            try:
                return self._store.execution_claim(*args, **kwargs)
            finally:
                self.returned.set()

    class ClaimerQueue(_QueueProxy):
        claimers: list[asyncio.Task[Any]] = []

        async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
            self.claimers.append(cast(asyncio.Task[Any], asyncio.current_task()))
            return await self._queue.claim_due(limit, ahead)

    job = node.app.schedule("record", max_attempts=1)
    await node.dispatch()
    store, queue = GatedClaims(node.app.store), ClaimerQueue(node)
    worker = node.new_worker(store, queue)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    assert await asyncio.to_thread(store.entered.wait, 5)
    stop.set()
    claim_loop = queue.claimers[-1]
    await asyncio.wait_for(_until(lambda: claim_loop.done() or claim_loop.cancelling() > 0), 5)
    store.gate.set()  # the claim commits after shutdown began
    await asyncio.wait_for(running, 5)
    assert await asyncio.to_thread(store.returned.wait, 5)
    execution = node.execution(job.id)
    assert (execution.status, execution.attempt) == (ExecutionStatus.SCHEDULED, 0)
    assert [a.outcome for a in execution.attempts] == [AttemptOutcome.RELEASED]
    assert worker.stats.released == 1
    assert node.calls.seen == []


async def test_worker__started_run_is_run_although_requeueing_the_not_due_ones_fails(
    node: Node,
) -> None:
    """A claim returns a started run and one not yet due; putting the latter back in the queue
    fails. The started run is tracked before that, so it runs and its outcome is written."""
    now_job = node.app.schedule("record", {"n": 1})
    later_job = node.app.schedule("record", {"n": 2}, at=node.clock.now() + timedelta(seconds=3))
    await node.dispatch()
    later = node.execution(later_job.id)

    class BrokenRequeue(_QueueProxy):
        async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
            # The queue released ``later`` early (its clock runs ahead of the store's).
            return [*(await self._queue.claim_due(limit, ahead)), later.id]

        async def enqueue(self, items: Sequence[QueueItem]) -> None:
            raise RuntimeError("queue unavailable")

    worker = node.new_worker(queue=BrokenRequeue(node))
    assert await worker.claim_once() == 1
    await asyncio.wait_for(worker.run_until_idle(), 5)
    assert node.execution(now_job.id).status is ExecutionStatus.SUCCEEDED
    assert node.calls.seen[0][1] == {"n": 1}
    assert node.execution(later_job.id).status is ExecutionStatus.QUEUED  # the sweep re-enqueues it


async def test_worker__claim_loop_claims_again_at_once_after_ids_it_could_not_start(
    node: Node,
) -> None:
    """The queue hands out the id of a run that already ran (a stale copy, e.g. re-enqueued by a
    sweep while its claim committed): the store starts nothing. The queue had due work, so the
    claim loop claims again at once, not after waiting on the queue (which may sleep up to
    poll_interval while runs are due), and the run due behind it starts."""
    ran = node.app.schedule("record", {"n": 1})
    await node.dispatch()
    await node.worker.run_until_idle()
    stale = node.execution(ran.id).id
    due = node.app.schedule("record", {"n": 2})
    await node.dispatch()

    class StaleFirst(_QueueProxy):
        calls: list[str] = []

        async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
            self.calls.append("claim")
            return [stale] if len(self.calls) == 1 else await self._queue.claim_due(limit, ahead)

        async def wait(self, timeout: float, ahead: float = 0.0) -> None:
            self.calls.append("wait")
            await self._queue.wait(timeout, ahead)

    queue = StaleFirst(node)
    worker = node.new_worker(queue=queue)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(_until(lambda: worker.stats.succeeded == 1), 5)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert queue.calls[:2] == ["claim", "claim"]
    assert node.execution(due.id).status is ExecutionStatus.SUCCEEDED
    assert node.execution(ran.id).attempt == 1  # the stale copy did not run it again


async def test_worker__heartbeat_does_not_keep_alive_a_run_the_worker_does_not_run(
    node: Node,
) -> None:
    """A run the store started for this worker's owner that the worker is not running (it lost
    track of it) is not renewed by its heartbeats: the reaper frees it and it runs."""
    job = node.app.schedule("record")
    await node.dispatch()
    worker = node.new_worker()
    ids = await node.queue.claim_due(10)
    settings = node.app.settings
    [lost] = node.app.store.execution_claim(
        ids, worker.owner, settings.lease_ttl, settings.misfire_grace
    ).started
    for _ in range(4):  # 12 s of heartbeats every 3 s: past the 10 s lease
        node.clock.advance(3)
        await worker.heartbeat()
    assert await node.scheduler.reap() == 1
    node.clock.advance(2)
    await node.scheduler.dispatch()
    await worker.run_until_idle()
    execution = node.execution(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert [a.outcome for a in execution.attempts] == [
        AttemptOutcome.LOST,
        AttemptOutcome.SUCCEEDED,
    ]
    assert lost.execution.id == execution.id


async def test_worker__claim_loop_that_fails_is_logged_and_restarted(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    class FailsOnce(_QueueProxy):
        failed = asyncio.Event()

        async def wait(self, timeout: float, ahead: float = 0.0) -> None:
            if not self.failed.is_set():
                self.failed.set()
                raise RuntimeError("queue connection lost")
            await self._queue.wait(timeout, ahead)

    queue = FailsOnce(node)
    worker = node.new_worker(queue=queue)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(queue.failed.wait(), 5)
    node.app.schedule("block")
    await node.dispatch()
    await asyncio.wait_for(node.calls.started.wait(), 5)  # claimed by the restarted loop
    node.calls.release.set()
    stop.set()
    await asyncio.wait_for(running, 5)
    assert worker.stats.loop_restarts == 1
    assert worker.stats.succeeded == 1
    assert "worker claim loop failed; restarting it" in caplog.text


async def test_worker__run_claimed_again_by_the_same_worker_stops_its_old_task(
    node: Node,
) -> None:
    """The worker stalled past its lease, the run was reaped and this same worker claimed it
    again: the old local run is stopped, not left running beside the new one."""
    job = node.app.schedule("block")
    await node.dispatch()
    worker = node.worker
    await worker.claim_once()
    await node.calls.started.wait()
    eid = node.execution(job.id).id
    node.clock.advance(11)
    assert await node.scheduler.reap() == 1
    node.clock.advance(2)
    await node.scheduler.dispatch()
    assert await worker.claim_once() == 1
    await asyncio.sleep(0)  # let the cancellation land

    def live_runs() -> list[asyncio.Task[Any]]:
        return [
            t for t in asyncio.all_tasks() if t.get_name() == f"onbeat-run-{eid}" and not t.done()
        ]

    assert len(live_runs()) == 1
    assert worker.stats.fenced == 1
    node.calls.release.set()
    await worker.run_until_idle()
    execution = node.execution(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert [a.outcome for a in execution.attempts] == [
        AttemptOutcome.LOST,
        AttemptOutcome.SUCCEEDED,
    ]


async def test_worker__heartbeat_while_an_outcome_is_being_written_fences_nothing(
    node: Node,
) -> None:
    """A heartbeat lands after the outcome committed but before the worker saw the write
    return: the run is not counted (or logged) as fenced."""

    class SlowFinish(_StoreProxy):
        committed, gate = threading.Event(), threading.Event()

        def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
            accepted = self._store.execution_finish_many(completions)
            self.committed.set()
            self.gate.wait(5)
            return accepted

    store = SlowFinish(node.app.store)
    job = node.app.schedule("arecord")
    await node.dispatch()
    worker = node.new_worker(store)
    draining = asyncio.create_task(worker.run_until_idle())
    assert await asyncio.to_thread(store.committed.wait, 5)
    node.clock.advance(node.app.settings.heartbeat_interval)  # its lease is due for renewal
    await worker.heartbeat()
    store.gate.set()
    await asyncio.wait_for(draining, 5)
    assert node.execution(job.id).status is ExecutionStatus.SUCCEEDED
    assert (worker.stats.succeeded, worker.stats.fenced) == (1, 0)


async def test_heartbeat__thread_renews_held_leases_on_the_clock_and_reports_lost_ones(
    node: Node,
) -> None:
    """The heartbeat thread, driven by the FakeClock: it renews the pairs it is given once the
    interval passed, and reports the ones no longer held back on the event loop."""
    for _ in range(2):
        node.app.schedule("record")
    await node.dispatch()
    store, owner, ttl = node.app.store, "worker-hb", node.app.settings.lease_ttl
    grace = node.app.settings.misfire_grace
    kept, gone = store.execution_claim(await node.queue.claim_due(10), owner, ttl, grace).started
    held = {r.execution.id: r.execution.fencing_token for r in (kept, gone)}
    assert store.execution_release(owner, {gone.execution.id: gone.execution.fencing_token}) == 1
    lost: asyncio.Queue[tuple[HeldLeases, bool]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def on_lost(pairs: HeldLeases) -> None:
        lost.put_nowait((pairs, asyncio.get_running_loop() is loop))

    heartbeat = Heartbeat(store, owner, ttl, 3.0, node.clock, lambda before: dict(held), on_lost)
    heartbeat.start(loop)
    try:
        node.clock.advance(3)
        heartbeat.wake()
        pairs, on_loop = await asyncio.wait_for(lost.get(), 5)
        assert pairs == {gone.execution.id: gone.execution.fencing_token}
        assert on_loop
        renewed = store.execution_get(kept.execution.id)
        assert renewed is not None
        assert renewed.lease_expires_at == node.clock.now() + timedelta(seconds=ttl)
    finally:
        await asyncio.to_thread(heartbeat.stop)
    assert not heartbeat.alive


async def test_worker__writes_outcomes_a_bounded_batch_at_a_time_and_keeps_the_rest_on_a_failure(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More outcomes than OUTCOMES_PER_WRITE go to the store in several calls; a call that fails
    keeps its outcomes and those after it, and the next flush writes them all."""
    monkeypatch.setattr(worker_module, "OUTCOMES_PER_WRITE", 2)

    class FailsOnce(_StoreProxy):
        sizes: list[int] = []

        def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
            self.sizes.append(len(completions))
            if len(self.sizes) == 2:
                raise RuntimeError("the store is down for one write")
            return self._store.execution_finish_many(completions)

    store = FailsOnce(node.app.store)
    jobs = [node.app.schedule("record") for _ in range(5)]
    await node.dispatch()
    worker = node.new_worker(store)
    await worker.run_until_idle()
    assert store.sizes == [2, 2, 2, 1]
    assert [node.execution(job.id).status for job in jobs] == [ExecutionStatus.SUCCEEDED] * 5
    assert worker.stats.succeeded == 5
