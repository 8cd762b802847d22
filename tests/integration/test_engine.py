"""Scheduler + worker + SQLite store + memory queue together, time driven by a FakeClock."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

from onbeat import AttemptOutcome, ExecutionStatus, JobStatus
from tests.integration.conftest import Node


async def test_engine__run_now_job_runs_once_and_records_result(node: Node) -> None:
    job = node.app.schedule("record", {"x": 1})
    await node.step()
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.result == {"echo": {"x": 1}}
    assert [a.outcome for a in execution.attempts] == [AttemptOutcome.SUCCEEDED]
    assert node.calls.seen == [(execution.id, {"x": 1}, 1)]
    assert node.app.get_job(job.id).status is JobStatus.COMPLETED


async def test_engine__async_task_runs_in_the_loop(node: Node) -> None:
    job = node.app.schedule("arecord", {"y": 2})
    await node.step()
    [execution] = node.app.list_executions(job.id)
    assert execution.result == "async"


async def test_engine__once_job_waits_for_its_time(node: Node) -> None:
    at = node.clock.now().replace(microsecond=0).isoformat()
    job = node.app.schedule("record", at=at.replace("12:00:00", "12:00:30"))
    await node.step(advance=20)
    assert node.calls.seen == []
    await node.step(advance=10)
    assert [e.status for e in node.app.list_executions(job.id)] == [ExecutionStatus.SUCCEEDED]


async def test_engine__cron_job_fires_at_each_fire_time(node: Node) -> None:
    job = node.app.schedule("record", cron="*/10 * * * * *")
    for _ in range(6):
        await node.step(advance=10)
    executions = node.app.list_executions(job.id)
    succeeded = [e for e in executions if e.status is ExecutionStatus.SUCCEEDED]
    assert len(succeeded) == 6
    fire_seconds = sorted(e.scheduled_for.second for e in succeeded)
    assert fire_seconds == [0, 0, 10, 20, 30, 40] or len({e.scheduled_for for e in succeeded}) == 6
    pending = [e for e in executions if not e.status.is_final]
    assert all(e.scheduled_for > node.clock.now() for e in pending)


async def test_engine__failures_retry_with_backoff_then_dead_letter(node: Node) -> None:
    job = node.app.schedule("fail")
    await node.step()
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SCHEDULED
    assert execution.last_error == "RuntimeError: boom 1"
    for _ in range(2):
        await node.step(advance=10)  # past the largest backoff (cap 10 s)
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.FAILED
    assert [a.attempt for a in execution.attempts] == [1, 2, 3]
    assert [a.outcome for a in execution.attempts] == [AttemptOutcome.FAILED] * 3
    [dead] = node.app.list_dead_letters()
    assert dead.execution_id == execution.id
    assert dead.last_error == "RuntimeError: boom 3"


async def test_engine__timeout_counts_as_a_failed_attempt(node: Node) -> None:
    job = node.app.schedule("slow", max_attempts=1)
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    await node.worker.claim_once()
    idle = asyncio.create_task(node.worker.run_until_idle())
    await asyncio.wait_for(node.clock.until_sleeping(), 5)
    node.clock.advance(1.5)
    await asyncio.wait_for(idle, 5)
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.attempts[0].outcome is AttemptOutcome.TIMED_OUT
    assert execution.last_error == "timed out after 1.0s"


async def test_engine__dead_worker_run_is_reaped_and_run_again(node: Node) -> None:
    job = node.app.schedule("record")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    dead = node.new_worker()
    ids = await node.queue.claim_due(10)
    claim = node.app.store.execution_claim(
        ids, dead.owner, node.app.settings.lease_ttl, node.app.settings.misfire_grace
    )
    assert len(claim.started) == 1  # the dead worker held it and never ran it
    await node.step(advance=5)
    assert node.calls.seen == []  # lease still valid: not taken away
    await node.step(advance=6)  # lease expired -> retry after backoff
    await node.step(advance=2)  # backoff is at most 1 s for attempt 1
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert [a.outcome for a in execution.attempts] == [
        AttemptOutcome.LOST,
        AttemptOutcome.SUCCEEDED,
    ]
    assert execution.attempt == 2


async def test_engine__stale_worker_result_is_discarded(node: Node) -> None:
    job = node.app.schedule("block")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    await node.worker.claim_once()
    await node.calls.started.wait()
    first = node.app.list_executions(job.id)[0]
    # The worker stalls past its lease: another pass reaps the run and a second worker runs it.
    node.clock.advance(11)
    await node.scheduler.reap()
    node.clock.advance(2)
    await node.scheduler.dispatch()
    other = node.new_worker()
    node.calls.release.set()
    await other.run_until_idle()
    await node.worker.run_until_idle()  # the stalled worker finishes late
    assert node.worker.stats.fenced == 1
    assert other.stats.succeeded == 1
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.fencing_token > first.fencing_token
    assert [a.outcome for a in execution.attempts] == [
        AttemptOutcome.LOST,
        AttemptOutcome.SUCCEEDED,
    ]


async def test_engine__heartbeat_keeps_a_long_run_alive(node: Node) -> None:
    job = node.app.schedule("block")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    await node.worker.claim_once()
    await node.calls.started.wait()
    for _ in range(10):  # 30 s of a 10 s lease, renewed every 3 s
        node.clock.advance(3)
        await node.worker.heartbeat()
        assert await node.scheduler.reap() == 0
    node.calls.release.set()
    await node.worker.run_until_idle()
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert len(execution.attempts) == 1


async def test_engine__heartbeat_leaves_a_fresh_lease_until_it_is_due(node: Node) -> None:
    """A lease the claim just granted is not renewed by a heartbeat moments later (a burst would
    be written twice at its start); it is once the next look would be a heartbeat interval after
    the claim."""
    node.app.schedule("block")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    await node.worker.claim_once()
    await node.calls.started.wait()
    [run_id] = node.worker._leases_due(math.inf)
    granted = node.app.store.execution_get(run_id)
    assert granted is not None and granted.lease_expires_at is not None
    interval = node.app.settings.heartbeat_interval
    node.clock.advance(interval / 2)
    await node.worker.heartbeat()
    unchanged = node.app.store.execution_get(run_id)
    assert unchanged is not None and unchanged.lease_expires_at == granted.lease_expires_at
    node.clock.advance(interval / 2)
    await node.worker.heartbeat()
    renewed = node.app.store.execution_get(run_id)
    assert renewed is not None and renewed.lease_expires_at == node.clock.now() + timedelta(
        seconds=node.app.settings.lease_ttl
    )
    node.calls.release.set()
    await node.worker.run_until_idle()


async def test_engine__paused_job_does_not_run_until_resumed(node: Node) -> None:
    job = node.app.schedule("record")
    node.app.pause(job.id)
    await node.step()
    assert node.calls.seen == []
    node.app.resume(job.id)
    await node.step()
    assert len(node.calls.seen) == 1


async def test_engine__cancelled_job_runs_nothing(node: Node) -> None:
    job = node.app.schedule("record", cron="* * * * *")
    node.app.cancel(job.id)
    await node.step(advance=120)
    assert node.calls.seen == []
    assert all(e.status is ExecutionStatus.CANCELLED for e in node.app.list_executions(job.id))


async def test_engine__graceful_shutdown_releases_unfinished_runs(node: Node) -> None:
    node.app.settings.shutdown_grace = 0
    job = node.app.schedule("block")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    await node.worker.claim_once()
    await node.calls.started.wait()
    await node.worker.shutdown()
    assert node.worker.stats.released == 1
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SCHEDULED
    assert execution.attempt == 0  # the interrupted attempt does not count
    node.calls.release.set()
    other = node.new_worker()
    await node.scheduler.dispatch()
    await other.run_until_idle()
    [execution] = node.app.list_executions(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.attempt == 1


async def test_engine__lost_queue_is_rebuilt_by_the_sweep(node: Node) -> None:
    job = node.app.schedule("record")
    await node.scheduler.renew_shards()
    await node.scheduler.dispatch()
    assert await node.scheduler.sweep() == 0  # the new shards' takeover check: all held
    await node.queue.remove(await node.queue.claim_due(100))  # the queue loses everything
    await node.worker.run_until_idle()
    assert node.calls.seen == []
    assert await node.scheduler.sweep() == 0  # not overdue yet
    node.clock.advance(node.app.settings.sweep_overdue + 1)
    assert await node.scheduler.sweep() == 1
    await node.worker.run_until_idle()
    assert [e.status for e in node.app.list_executions(job.id)] == [ExecutionStatus.SUCCEEDED]


async def test_engine__submitted_work_is_dispatched_without_waiting_for_a_poll(node: Node) -> None:
    """With a poll interval far away, only the submit wake-up can start the run."""
    node.app.settings.poll_interval = 3600
    node.app.on_submit(node.scheduler.wake)
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(node.scheduler.run(stop)),
        asyncio.create_task(node.worker.run(stop)),
    ]
    await asyncio.wait_for(node.scheduler.started.wait(), 5)
    node.app.schedule("block")
    await asyncio.wait_for(node.calls.started.wait(), 5)
    node.calls.release.set()
    stop.set()
    await asyncio.gather(*loops)
    assert node.calls.seen and node.clock.monotonic() == 0
