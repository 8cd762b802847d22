"""``bench/store_drivers.py`` at a tiny size, on the variants CI has the drivers for (asyncpg is
the optional ``bench`` extra's): each variant claims and finishes every run, and the schema then
holds a succeeded run and attempt and a completed job for each; the results go to ``--out``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.bench_runs import run_bench

VARIANTS = ("store", "psycopg-sync/json", "psycopg-async/json")


@pytest.mark.external_service
def test_store_drivers_bench__tiny_run_claims_and_finishes_every_run_per_variant(
    tmp_path: Path,
) -> None:
    summary = run_bench(
        "bench/store_drivers.py", "--runs", "200", "--batch", "32", "--repeat", "1",
        "--variants", ",".join(VARIANTS), "--out", str(tmp_path),
    )  # fmt: skip
    every = dict.fromkeys(("claimed", "finished", "succeeded", "attempts", "completed"), 200)
    assert summary["counts"] == {variant: [every] for variant in VARIANTS}
    assert set(summary["summary"]) == set(VARIANTS)
    [saved] = tmp_path.glob("store_drivers-*.json")
    assert str(saved) == summary["saved"]
    rounds = json.loads(saved.read_text())["rounds"]
    assert {v: [r["counts"] for r in rs] for v, rs in rounds.items()} == summary["counts"]
