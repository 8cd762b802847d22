"""``bench/store_wal.py`` at a tiny size: every run goes through create, dispatch, claim and finish
once, and the schema ends with one succeeded run, one succeeded attempt and one completed job
for each."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_store_wal_bench__tiny_run_takes_every_run_through_every_phase() -> None:
    summary = run_bench(
        "bench/store_wal.py", "--runs", "200", "--batch", "64", "--repeat", "1",
        "--history-partitions",
    )  # fmt: skip
    [round_] = summary["rounds"]
    assert round_["counts"] == dict.fromkeys(("created", "dispatched", "claimed", "finished"), 200)
    assert round_["final"] == {
        "executions": {"succeeded": 200},
        "attempts": {"succeeded": 200},
        "jobs": {"completed": 200},
    }
    assert set(summary["per_run"]) == {"create", "dispatch", "claim", "finish"}
