"""The node's Prometheus metrics move as runs start, succeed, fail, retry and are reaped."""

from __future__ import annotations

import asyncio

from onbeat.metrics import Metrics
from tests.integration.conftest import Node


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def test_metrics__a_success_counts_its_start_delay_duration_and_final_status(
    node: Node,
) -> None:
    node.app.schedule("record", {"n": 1})
    await node.dispatch()
    node.clock.advance(2)  # the run starts 2 s after it was due
    await node.worker.run_until_idle()
    m = node.worker.metrics
    assert value(m, "onbeat_executions_total", task="record", status="succeeded") == 1
    assert value(m, "onbeat_start_delay_seconds_count") == 1
    assert value(m, "onbeat_start_delay_seconds_sum") >= 2
    assert value(m, "onbeat_start_delay_seconds_bucket", le="1.0") == 0
    assert value(m, "onbeat_run_duration_seconds_count", task="record") == 1
    assert value(m, "onbeat_runs_in_flight") == 0


async def test_metrics__failures_count_retries_then_one_dead_letter(node: Node) -> None:
    node.app.schedule("fail")
    await node.step()
    m = node.worker.metrics
    assert value(m, "onbeat_retries_total", task="fail") == 1
    assert value(m, "onbeat_executions_total", task="fail", status="failed") == 0
    for _ in range(2):
        await node.step(advance=10)
    assert value(m, "onbeat_retries_total", task="fail") == 2
    assert value(m, "onbeat_executions_total", task="fail", status="failed") == 1
    assert value(m, "onbeat_dead_letters_total") == 1
    assert value(m, "onbeat_run_duration_seconds_count", task="fail") == 3


async def test_metrics__a_reaped_run_counts_a_lease_expiry_and_its_late_outcome_is_fenced(
    node: Node,
) -> None:
    node.app.schedule("block")
    await node.dispatch()
    assert await node.worker.claim_once() == 1
    await asyncio.wait_for(node.calls.started.wait(), 5)
    assert value(node.worker.metrics, "onbeat_runs_in_flight") == 1
    node.clock.advance(node.app.settings.lease_ttl + 1)  # no heartbeat: the lease expires
    assert await node.scheduler.reap() == 1
    assert value(node.scheduler.metrics, "onbeat_lease_expiries_total") == 1
    node.calls.release.set()
    await node.worker.run_until_idle()  # the stale outcome is refused
    assert value(node.worker.metrics, "onbeat_fenced_results_discarded_total") == 1
    assert (
        value(node.worker.metrics, "onbeat_executions_total", task="block", status="succeeded") == 0
    )


async def test_metrics__shards_held_and_taken_over(node: Node) -> None:
    await node.scheduler.renew_shards()
    m = node.scheduler.metrics
    assert value(m, "onbeat_shards_held") == 4
    assert value(m, "onbeat_shard_takeovers_total") == 4
    await node.scheduler.renew_shards()
    assert value(m, "onbeat_shard_takeovers_total") == 4  # a renewal is no takeover


async def test_metrics__no_job_or_execution_id_reaches_a_label(node: Node) -> None:
    jobs = [node.app.schedule(task) for task in ("record", "arecord", "fail")]
    await node.step()
    text = node.worker.metrics.exposition().decode() + node.scheduler.metrics.exposition().decode()
    assert 'task="arecord"' in text
    for job in jobs:
        assert job.id not in text
        for execution in node.app.list_executions(job.id):
            assert execution.id not in text


async def test_metrics__queue_depth_by_priority_reads_zero_once_a_priority_empties(
    node: Node,
) -> None:
    node.app.schedule("record", priority=3)
    node.app.schedule("record", priority=3)
    node.app.schedule("record", priority=7)
    m = node.scheduler.metrics
    assert await node.scheduler.measure_backlog() == 3
    assert value(m, "onbeat_queue_depth", priority="3") == 2
    assert value(m, "onbeat_queue_depth", priority="7") == 1
    await node.step()  # all of them run
    assert await node.scheduler.measure_backlog() == 0
    assert value(m, "onbeat_queue_depth", priority="3") == 0
    assert value(m, "onbeat_queue_depth", priority="7") == 0


async def test_metrics__a_run_reaped_on_its_last_attempt_counts_as_a_failed_execution(
    node: Node,
) -> None:
    node.app.schedule("block", max_attempts=1)
    await node.dispatch()
    assert await node.worker.claim_once() == 1
    await asyncio.wait_for(node.calls.started.wait(), 5)
    node.clock.advance(node.app.settings.lease_ttl + 1)  # its worker is gone: no heartbeat
    assert await node.scheduler.reap() == 1
    m = node.scheduler.metrics
    assert value(m, "onbeat_dead_letters_total") == 1
    assert value(m, "onbeat_executions_total", task="block", status="failed") == 1
    node.calls.release.set()
    await node.worker.run_until_idle()
