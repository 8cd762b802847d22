"""``bench/finish_parts.py`` at a tiny size: every run is claimed and finished, and each shape of
the finish statement (the stored one, and each with a clause cut out) runs."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_finish_parts_bench__tiny_run_claims_and_finishes_every_run_in_every_shape() -> None:
    summary = run_bench("bench/finish_parts.py", "--runs", "300", "--batch", "64", "--rounds", "1")
    assert (summary["runs"], summary["started"], summary["finished"]) == (300, 300, 300)
    shapes = summary["finish_statement_us_per_run"]
    assert set(shapes) == {"stored", "without the job's completion", "attempts without ON CONFLICT"}
    assert all(len(s["rounds"]) == 1 and s["median"] > 0 for s in shapes.values())
    assert summary["claim_client_cpu_us_per_run"] > 0 < summary["finish_client_cpu_us_per_run"]
