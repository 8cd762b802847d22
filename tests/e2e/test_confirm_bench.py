"""``bench/confirm.py`` at a tiny size, on both stores: every run held ahead is confirmed once."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.parametrize(
    "store", ["sqlite", pytest.param("postgres", marks=pytest.mark.external_service)]
)
def test_confirm_bench__tiny_run_confirms_every_run_held_ahead(store: str) -> None:
    summary = run_bench("bench/confirm.py", "--runs", "300", "--batch", "128", "--store", store)
    assert (summary["runs"], summary["held"], summary["confirmed"]) == (300, 300, 300)
    assert summary["first_batch_ms"] <= summary["all_ms"]
