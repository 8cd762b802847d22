"""``bench/fleet.py`` at a tiny size, so the benchmark cannot rot: every phase on both queues
starts its fleet, counts every run started once (none lost, duplicated or early) and cleans up
after itself. Counts only, never times."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest

from onbeat.testing.postgres import TEST_SERVER
from tests.e2e.conftest import REPO

TINY = {
    "throughput": ["--jobs", "300"],
    "steady": ["--rate", "100", "--duration", "2", "--lead", "2", "--warmup", "0.5"],
    "burst": ["--burst", "300", "--burst-lead", "4", "--warmup", "0.5"],
}


def _bench_schemas() -> set[str]:
    with psycopg.connect(TEST_SERVER) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'onbeat_bench_%'"
        ).fetchall()
    return {row[0] for row in rows}


@pytest.mark.parametrize("queue", ["redis", "table"])
@pytest.mark.parametrize("phase", sorted(TINY))
def test_fleet_bench__tiny_run_counts_every_run_once_and_cleans_up(phase: str, queue: str) -> None:
    before = _bench_schemas()
    done = subprocess.run(
        [sys.executable, "bench/fleet.py", "--phase", phase, "--queue", queue, *TINY[phase]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON ")]
    figures = json.loads(line.removeprefix("BENCH_JSON "))["result"]["figures"]
    assert figures["runs"] > 0
    assert figures["started"] == figures["runs"]
    assert (figures["lost"], figures["duplicated"], figures["early"]) == (0, 0, 0)
    assert figures["store"] == {"succeeded": figures["runs"]}
    assert set(figures["exit_statuses"].values()) == {0}
    assert figures["cpu"]["worker-0"]["cpu_s"] > 0
    assert _bench_schemas() <= before  # its schema was dropped
