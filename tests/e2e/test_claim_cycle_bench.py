"""``bench/claim_cycle.py`` at a tiny size: every run of every batch size is claimed and
finished, and each transaction's costs and the fit are reported."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_claim_cycle_bench__tiny_run_claims_and_finishes_every_run_at_each_batch_size() -> None:
    summary = run_bench("bench/claim_cycle.py", "--batches", "4,16", "--runs", "64")
    results = summary["results"]
    assert [r["batch"] for r in results] == [4, 16]
    assert all(r["runs"] == r["started"] == r["finished"] == 64 for r in results)
    assert [r["transactions"] for r in results] == [16, 4]
    for r in results:
        for name in ("claim", "finish"):
            assert r[name]["client_ms_per_tx"] > 0 < r[name]["wall_ms_per_tx"]
    assert set(summary["fits"]) == {"claim", "finish"}
