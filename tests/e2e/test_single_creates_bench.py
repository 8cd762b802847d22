"""``bench/single_creates.py`` at a tiny size: every caller gets a job of its own."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench

pytestmark = pytest.mark.external_service


def test_single_creates_bench__tiny_run_gives_each_caller_its_own_job() -> None:
    summary = run_bench("bench/single_creates.py", "--jobs", "60", "--threads", "4")
    alone, together = summary["result"]
    assert (alone["threads"], together["threads"]) == (1, 4)
    for row in (alone, together):
        assert (row["jobs"], row["each_its_own"]) == (60, True)
    assert alone["jobs_per_transaction"] == 1.0
