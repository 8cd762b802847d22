"""``bench/inflight.py`` (W4) and ``bench/api.py`` (W5) at a tiny size, in both modes, so the
benchmarks cannot rot: every run held in flight at once and ended once, every request answered
as expected, every schema dropped. Counts only, never times."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import bench_schemas, run_bench


@pytest.mark.parametrize("mode", ["embedded", "distributed"])
def test_inflight_bench__tiny_run_holds_every_run_at_once_and_ends_each_once(mode: str) -> None:
    before = bench_schemas()
    runs = 50
    result = run_bench(
        "bench/inflight.py", "--mode", mode, "--runs", str(runs), "--sleep", "5", "--warmup", "0.5"
    )["result"]
    f = result["figures"]
    assert result["max_in_flight"] == runs  # the global cap is set, and lets all of them run
    assert (f["started"], f["lost"], f["duplicated"], f["early"]) == (runs, 0, 0, 0)
    assert f["all_at_once"] and f["running_in_store_when_all_started"] == runs
    assert f["store"] == {"succeeded": runs}
    expected = {"node"} if mode == "embedded" else {"scheduler", "worker-0", "worker-1"}
    assert set(f["rss_all_running_kib"]) == set(f["rss_before_kib"]) == expected
    assert all(kib > 0 for kib in f["rss_all_running_kib"].values())
    assert set(f["exit_statuses"].values()) == {0}
    assert bench_schemas() <= before  # its schema was dropped


@pytest.mark.parametrize(
    ("mode", "extra", "processes"),
    [
        ("embedded", [], {"node"}),
        ("distributed", [], {"api-0", "postgres:api-0", "scheduler", "worker-0"}),
        ("distributed", ["--schedule", "cron", "--api-processes", "2"], {"api-0", "api-1"}),
    ],
)
def test_api_bench__tiny_run_answers_every_request_of_each_phase(
    mode: str, extra: list[str], processes: set[str]
) -> None:
    before = bench_schemas()
    summary = run_bench(
        "bench/api.py", "--mode", mode, *extra, "--requests", "100", "--warmup", "5",
        "--bulk-requests", "3", "--bulk-warmup", "1", "--batch-size", "20",
    )  # fmt: skip
    results = {r["phase"]: r for r in summary["results"]}
    assert list(results) == ["POST /jobs", "GET /jobs/{id}", "POST /jobs/batch (20)"]
    assert [r["requests"] for r in results.values()] == [100, 100, 3]
    assert all(r["errors"] == {} for r in results.values())
    assert results["POST /jobs/batch (20)"]["jobs_per_request"] == 20
    assert summary["dead_letters"] == 0  # the jobs' runs did not fail (they did until 2026-12-07)
    for r in results.values():
        assert processes <= set(r["server_cpu_share_by_process"])
    assert bench_schemas() <= before


def test_api_bench__wrk_load_answers_every_request_of_each_phase() -> None:
    """``--load wrk`` (the load generator that leaves the box to the server): both phases run
    and every answer is the one expected."""
    summary = run_bench(
        "bench/api.py", "--mode", "distributed", "--schedule", "cron", "--api-processes", "2",
        "--load", "wrk", "--seconds", "1", "--phases", "post,get", "--concurrency", "4",
    )  # fmt: skip
    results = {r["phase"]: r for r in summary["results"]}
    assert list(results) == ["POST /jobs", "GET /jobs/{id}"]
    assert all(r["requests"] > 0 and r["errors"] == {} for r in results.values())
    for r in results.values():
        assert {"api-0", "api-1"} <= set(r["server_cpu_share_by_process"])
