"""``bench/queue_table.py`` and ``bench/queue_redis.py`` at a tiny size: every id enqueued is
claimed exactly once across the claimer processes, and a waiter wakes for each enqueue."""

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
