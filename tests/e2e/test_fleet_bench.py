"""``bench/fleet.py`` at a tiny size, so the benchmark cannot rot: every phase on both queues
starts its fleet, counts every run started once (none lost, duplicated or early) and cleans up
after itself. Counts only, never times."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import bench_schemas, run_bench

TINY = {
    "throughput": ["--jobs", "300"],
    "steady": ["--rate", "100", "--duration", "2", "--lead", "2", "--warmup", "0.5"],
    "burst": ["--burst", "300", "--burst-lead", "4", "--warmup", "0.5"],
    "seconds": ["--crons", "5", "--settle", "2", "--duration", "2", "--warmup", "0.5"],
}


@pytest.mark.parametrize("queue", ["redis", "table"])
@pytest.mark.parametrize("phase", sorted(TINY))
def test_fleet_bench__tiny_run_counts_every_run_once_and_cleans_up(phase: str, queue: str) -> None:
    before = bench_schemas()
    summary = run_bench("bench/fleet.py", "--phase", phase, "--queue", queue, *TINY[phase])
    figures = summary["result"]["figures"]
    assert figures["runs"] > 0
    assert figures["started"] == figures["runs"]
    assert (figures["lost"], figures["duplicated"], figures["early"]) == (0, 0, 0)
    if phase == "seconds":  # the runs of the measured seconds, of ongoing cron jobs
        assert figures["store"]["succeeded"] >= figures["runs"]
        assert set(figures["store"]) <= {"succeeded", "scheduled", "queued", "running"}
    else:
        assert figures["store"] == {"succeeded": figures["runs"]}
    assert set(figures["exit_statuses"].values()) == {0}, (
        f"{figures['exit_statuses']}\n{figures.get('logs', '')}"
    )
    assert figures["cpu"]["worker-0"]["cpu_s"] > 0
    assert bench_schemas() <= before  # its schema was dropped
