"""``bench/embedded.py`` (the embedded node's W1 and W2) at a tiny size: every phase's runs ran
once and succeeded, none of the burst before its instant."""

from __future__ import annotations

from tests.e2e.bench_runs import run_bench


def test_embedded_bench__tiny_run_of_every_phase_runs_each_run_once() -> None:
    summary = run_bench("bench/embedded.py", "--jobs", "300", "--burst", "200", "--burst-lead", "3")
    results = {r["phase"]: r["figures"] for r in summary["results"]}
    assert set(results) == {"throughput", "burst"}
    assert results["throughput"]["jobs"] == 300 and results["burst"]["runs"] == 200
    for phase, figures in results.items():
        n = figures.get("jobs", figures.get("runs"))
        assert figures["db_succeeded"] == figures["task_calls"] == n, phase
        assert (figures["lost"], figures["duplicates"], figures["timed_out"]) == (0, 0, False)
    # none before its instant (the promise's tolerance: 50 ms, docs/faults.md, early_starts)
    assert results["burst"]["delay_min_s"] >= -0.05
