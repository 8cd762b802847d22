"""``bench/reconcile.py`` at a tiny size: the first pass repairs exactly the jobs broken behind
onbeat's back (the bench stops otherwise), the next passes none, over pages that end mid-shard."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_reconcile_bench__tiny_run_repairs_the_broken_jobs_once() -> None:
    summary = run_bench(
        "bench/reconcile.py", "--crons", "300", "--broken", "7", "--page", "40", "--rounds", "2"
    )
    assert (summary["crons"], summary["broken"], summary["page"]) == (300, 7, 40)
    assert summary["wall_s_median"] > 0 < summary["client_s_median"]
