"""``bench/bulk_create.py`` at a tiny size: every keyed job submitted, the warm-up's too, is
created and stored once, under its own idempotency key."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_bulk_create_bench__tiny_run_stores_every_job_once() -> None:
    summary = run_bench("bench/bulk_create.py", "--batch", "20", "--batches", "3", "--warmup", "1")
    assert (summary["batch"], summary["jobs"], summary["submitted"]) == (20, 60, 80)
    assert summary["keys"] == summary["created"] == 80
    assert summary["stored_jobs"] == summary["stored_keys"] == summary["keyed_jobs"] == 80
    assert (summary["missing_keys"], summary["unknown_keys"]) == (0, 0)
