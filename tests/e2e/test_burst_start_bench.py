"""``bench/burst_start.py`` at a tiny size: every run held ahead and confirmed starts once."""

from __future__ import annotations

from tests.e2e.bench_runs import run_bench


def test_burst_start_bench__tiny_run_starts_every_confirmed_run_once() -> None:
    summary = run_bench("bench/burst_start.py", "--runs", "200")
    assert (summary["runs"], summary["started"]) == (200, 200)
    assert summary["us_per_run"] > 0
