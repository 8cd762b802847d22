"""``bench/dispatch.py`` at a tiny size: every cron job's and one-shot's run due at the instant is
handed over, page by page."""

from __future__ import annotations

import pytest

from tests.e2e.bench_runs import run_bench


@pytest.mark.external_service
def test_dispatch_bench__tiny_run_dispatches_every_run_in_pages() -> None:
    summary = run_bench(
        "bench/dispatch.py", "--crons", "50", "--once", "200", "--page", "100", "--rounds", "1"
    )
    assert (summary["crons"], summary["once"], summary["page"]) == (50, 200, 100)
    assert summary["dispatched"] == [250] and summary["pages"] == [3]
    assert summary["wall_s_median"] > 0 < summary["client_us_per_run_median"]
