"""``bench/queue_table.py``, ``queue_redis.py`` and ``queue_compare.py`` at a tiny size: every
id enqueued is claimed exactly once across the claimer processes, on every queue."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_queue_table_bench__tiny_run_hands_each_id_out_once_on_both_drivers() -> None:
    summary = run_bench(
        "bench/queue_table.py",
        *("--items", "2000", "--enqueue-batch", "500", "--batch", "64", "--wake-samples", "5"),
    )
    runs = {r["driver"]: r for r in summary["runs"]}
    assert set(runs) == {"postgres", "sqlite"}
    for driver, r in runs.items():
        assert (r["lost"], r["duplicates"]) == (0, 0), driver
        assert sum(r["per_claimer"]) == 2000, driver


@pytest.mark.external_service
def test_queue_redis_bench__tiny_run_hands_each_id_out_once() -> None:
    summary = run_bench(
        "bench/queue_redis.py",
        *("--items", "2000", "--shards", "16", "--enqueue-batch", "500", "--batch", "64"),
        *("--wakes", "5"),
    )
    assert (summary["lost"], summary["duplicated"]) == (0, 0)
    assert sum(summary["claimed_per_claimer"]) == 2000
    assert summary["wake_p50_ms"] > 0


@pytest.mark.external_service
def test_queue_compare_bench__tiny_run_claims_every_id_once_on_each_queue() -> None:
    summary = run_bench(
        "bench/queue_compare.py",
        *("--items", "1000", "--idle-workers", "2", "--idle-seconds", "1", "--redis-port", "18731"),
    )
    runs = {r["queue"]: r for r in summary["runs"]}
    assert set(runs) == {"redis", "postgres", "failover", "failover-down"}
    for queue, r in runs.items():
        assert (r["claimed"], r["duplicates"]) == (1000, 0), queue
