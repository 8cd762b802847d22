"""``bench/bulk_route.py`` at a tiny size: every batch each thread sends is stored."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_bulk_route_bench__tiny_run_stores_every_job() -> None:
    summary = run_bench("bench/bulk_route.py", "--threads", "2", "--batches", "2", "--batch", "50")
    assert (summary["jobs"], summary["submitted"], summary["stored_jobs"]) == (200, 350, 350)
