"""A worker with ``claim_ahead``: it holds runs due soon, starts each at its due time and not
before, within its concurrency, and a cancel, pause or stop before that instant still wins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from onbeat import ExecutionStatus
from onbeat.model import Execution
from onbeat.store.base import AHEAD_LEASE_GRACE
from onbeat.worker import Worker
from onbeat.worker.ahead import REFUSED_MARGIN
from tests.integration.conftest import Node, running_worker

AHEAD = 2.0


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the event loop until ``condition`` holds (bounded by ``asyncio.wait_for``)."""
    while not condition():  # noqa: ASYNC110
        await asyncio.sleep(0)


def _worker(node: Node, **settings: Any) -> Worker:
    changed = node.app.settings.model_copy(update={"claim_ahead": AHEAD, **settings})
    return Worker(node.app.store, node.queue, node.app.registry, changed, node.clock)


def _runs(node: Node, job_ids: list[str]) -> list[Execution]:
    return [e for job_id in job_ids for e in node.app.list_executions(job_id)]


def _all_succeeded(node: Node, job_ids: list[str]) -> bool:
    return all(e.status is ExecutionStatus.SUCCEEDED for e in _runs(node, job_ids))


def _held_ahead(node: Node, job_ids: list[str]) -> int:
    return sum(
        e.status is ExecutionStatus.QUEUED and e.lease_owner is not None
        for e in _runs(node, job_ids)
    )


async def _burst(node: Node, count: int, due_in: float, task: str = "record") -> list[str]:
    at = node.clock.now() + timedelta(seconds=due_in)
    ids = [
        node.app.schedule(task, {"n": i} if task == "record" else {}, at=at).id
        for i in range(count)
    ]
    await node.dispatch()
    return ids


async def test_claim_ahead__a_burst_starts_at_its_instant_and_not_before(node: Node) -> None:
    jobs = await _burst(node, 20, due_in=1.5)
    due = node.clock.now() + timedelta(seconds=1.5)
    async with running_worker(_worker(node)):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, jobs) == 20), 10)
        assert node.calls.seen == []
        node.clock.advance(1.0)
        await asyncio.sleep(0.05)  # the loop may run anything that is (wrongly) due
        assert node.calls.seen == [], "a run claimed ahead started before its due time"
        node.clock.advance(0.5)
        await asyncio.wait_for(_until(lambda: len(node.calls.seen) == 20), 10)
        await asyncio.wait_for(
            _until(lambda: all(e.status is ExecutionStatus.SUCCEEDED for e in _runs(node, jobs))),
            10,
        )
    for run in _runs(node, jobs):
        assert run.started_at == due
        assert [a.started_at for a in run.attempts] == [due]
    assert sorted(params["n"] for _, params, _ in node.calls.seen) == list(range(20))


async def test_claim_ahead__runs_held_by_several_claims_start_each_at_its_own_due_time(
    node: Node,
) -> None:
    """The loop confirms, at each due time, the runs due then and none later, in whatever order
    the claims took them (the latest due first here)."""
    late = await _burst(node, 3, due_in=1.5)
    async with running_worker(_worker(node)):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, late) == 3), 10)
        early = await _burst(node, 2, due_in=0.5)
        middle = await _burst(node, 2, due_in=1.0)
        await asyncio.wait_for(_until(lambda: _held_ahead(node, late + early + middle) == 7), 10)
        for group in (early, middle, late):
            node.clock.advance(0.49)
            await asyncio.sleep(0.05)  # the loop may run anything that is (wrongly) due
            assert _held_ahead(node, group) == len(group), "a run started before its due time"
            node.clock.advance(0.01)
            await asyncio.wait_for(_until(partial(_all_succeeded, node, group)), 10)
        assert len(node.calls.seen) == 7


async def test_claim_ahead__confirmed_runs_start_within_the_concurrency(node: Node) -> None:
    jobs = await _burst(node, 6, due_in=1.0, task="block")
    async with running_worker(_worker(node, concurrency=2)):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, jobs) == 6), 10)
        node.clock.advance(1.0)
        await asyncio.wait_for(_until(lambda: len(node.calls.seen) == 2), 10)
        await asyncio.sleep(0.05)
        assert len(node.calls.seen) == 2, "more runs executing than the concurrency"
        node.calls.release.set()
        await asyncio.wait_for(_until(lambda: len(node.calls.seen) == 6), 10)
        await asyncio.wait_for(
            _until(lambda: all(e.status is ExecutionStatus.SUCCEEDED for e in _runs(node, jobs))),
            10,
        )


async def test_claim_ahead__cancel_before_the_instant_wins(node: Node) -> None:
    kept, cancelled = await _burst(node, 2, due_in=1.5)
    async with running_worker(_worker(node)):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, [kept, cancelled]) == 2), 10)
        node.app.cancel(cancelled)
        node.clock.advance(1.5)
        await asyncio.wait_for(
            _until(lambda: node.execution(kept).status is ExecutionStatus.SUCCEEDED), 10
        )
    gone = node.execution(cancelled)
    assert (gone.status, gone.attempts) == (ExecutionStatus.CANCELLED, ())
    assert [params["n"] for _, params, _ in node.calls.seen] == [0]


async def test_claim_ahead__pause_before_the_instant_holds_the_run_until_resumed(
    node: Node,
) -> None:
    [job] = await _burst(node, 1, due_in=1.5)
    worker = _worker(node)
    async with running_worker(worker):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, [job]) == 1), 10)
        node.app.pause(job)
        node.clock.advance(1.5)
        await asyncio.wait_for(
            _until(lambda: node.execution(job).status is ExecutionStatus.SCHEDULED), 10
        )
        assert node.calls.seen == []
        assert (node.execution(job).attempt, node.execution(job).attempts) == (0, ())
        node.app.resume(job)
        await node.dispatch()
        await asyncio.wait_for(
            _until(lambda: node.execution(job).status is ExecutionStatus.SUCCEEDED), 10
        )
    assert len(node.calls.seen) == 1
    assert [a.attempt for a in node.execution(job).attempts] == [1]


async def test_claim_ahead__a_stop_gives_back_the_runs_held_ahead(node: Node) -> None:
    jobs = await _burst(node, 3, due_in=1.5)
    worker = _worker(node)
    async with running_worker(worker):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, jobs) == 3), 10)
    for run in _runs(node, jobs):
        assert (run.status, run.attempt, run.attempts, run.lease_owner) == (
            ExecutionStatus.SCHEDULED,
            0,
            (),
            None,
        )
    assert worker.stats.released == 3
    await node.step(1.5)  # another worker runs them at their time
    assert all(e.status is ExecutionStatus.SUCCEEDED for e in _runs(node, jobs))
    assert len(node.calls.seen) == 3


async def test_claim_ahead__holds_no_more_than_claim_ahead_max(node: Node) -> None:
    jobs = await _burst(node, 5, due_in=1.5)
    async with running_worker(_worker(node, claim_ahead_max=3)):
        await asyncio.wait_for(_until(lambda: _held_ahead(node, jobs) == 3), 10)
        await asyncio.sleep(0.05)
        assert _held_ahead(node, jobs) == 3
        node.clock.advance(1.5)
        await asyncio.wait_for(_until(lambda: len(node.calls.seen) == 5), 10)


async def test_claim_ahead__runs_of_a_worker_that_died_start_a_grace_after_their_time(
    node: Node,
) -> None:
    """kill -9 of a worker holding runs ahead: they are not heartbeated, so the reaper frees
    them ``AHEAD_LEASE_GRACE`` after their due time (not a lease TTL later), and another worker
    runs them without a lost attempt."""
    jobs = await _burst(node, 3, due_in=1.5)
    dead = _worker(node)
    assert (await dead._claim())[0] == 3  # holds them; then never runs again
    assert _held_ahead(node, jobs) == 3
    node.clock.advance(1.5 + AHEAD_LEASE_GRACE)
    await node.step()  # reap, dispatch, run: nothing expired yet
    assert node.calls.seen == []
    await node.step(0.001)
    assert len(node.calls.seen) == 3
    for run in _runs(node, jobs):
        assert run.status is ExecutionStatus.SUCCEEDED
        assert [a.attempt for a in run.attempts] == [1]


async def test_claim_ahead__a_blocked_loop_hands_the_runs_held_ahead_back(node: Node) -> None:
    """The watchdog's hand-back (a task blocks the loop) releases runs held ahead too: they go
    back pending without an attempt, and the loop, once free, does not start them here."""
    jobs = await _burst(node, 2, due_in=1.5)
    worker = _worker(node)
    assert (await worker._claim())[0] == 2
    await asyncio.to_thread(worker._hand_back_unstarted)  # from the watchdog's thread
    for run in _runs(node, jobs):
        assert (run.status, run.attempt, run.attempts) == (ExecutionStatus.SCHEDULED, 0, ())
    node.clock.advance(1.5)
    assert await worker._ahead.confirm_due()  # nothing of its own left to confirm
    assert node.calls.seen == []
    await node.step()
    assert len(node.calls.seen) == 2


async def test_claim_ahead__a_run_confirmed_as_the_watchdog_hands_back_is_still_tracked(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The confirm commits in its thread while a task blocks the loop, and the watchdog then
    hands back the runs held ahead under the tokens they had before it: the store refuses that
    release (the confirm moved the token on), so the runs are this worker's, started. They are
    tracked (heartbeated, then run here or handed back at the watchdog's next look), not left
    running in the store without a holder until their lease ran out (a user's trial on
    2026-12-07: a run 'running' 60 s with no worker, then reaped as lost)."""
    jobs = await _burst(node, 2, due_in=1.5)
    worker = _worker(node)
    assert (await worker._claim())[0] == 2
    real_confirm = worker.store.execution_confirm

    def confirm_then_hand_back(owner: str, held: dict[str, int], lease_ttl: float) -> Any:
        tokens = real_confirm(owner, held, lease_ttl)
        worker._hand_back_unstarted()  # the watchdog's thread, as a task blocks the loop
        return tokens

    monkeypatch.setattr(worker.store, "execution_confirm", confirm_then_hand_back)
    node.clock.advance(1.5)
    assert await worker._ahead.confirm_due()
    runs = _runs(node, jobs)
    assert [run.status for run in runs] == [ExecutionStatus.RUNNING] * 2  # the release refused
    assert {run.id for run in runs} <= set(worker._held)
    monkeypatch.undo()
    await asyncio.gather(*(held.task for held in worker._held.values() if held.task))
    await worker.flush()
    assert [run.status for run in _runs(node, jobs)] == [ExecutionStatus.SUCCEEDED] * 2


async def test_claim_ahead__runs_refused_ahead_are_not_claimed_again_until_the_first_held_is_due(
    node: Node,
) -> None:
    """Every-second cron jobs: of the runs due within ``claim_ahead``, the store holds each
    job's next one and refuses the rest (their job's earlier run is pending). Claiming ahead
    again at each poll only took those out of the queue and put them back (two workers and 100
    such jobs: 4,100 runs a second each); the worker claims nothing ahead until just after the
    first run it held falls due, when the next run of its job can be held."""
    jobs = [node.app.schedule("record", cron="* * * * * *").id for _ in range(3)]
    await node.dispatch()
    worker = _worker(node, claim_ahead=4.0)
    queued = await node.queue.size()
    assert (await worker._claim())[0] == 3  # the three next runs held; the others handed back
    assert _held_ahead(node, jobs) == 3
    assert await node.queue.size() == queued - 3
    assert worker._ahead.room() == 0
    assert (await worker._claim())[:2] == (0, 0)  # nothing due now, nothing claimed ahead
    first_due = min(run.due_at for run in worker._ahead.runs.values())
    node.clock.advance((first_due - node.clock.now()).total_seconds() + REFUSED_MARGIN)
    assert worker._ahead.room() > 0
