"""``bench/limits_burst.py`` at a tiny size (``--drain``): with big's start rate limited and
without, every run of both tenants started once and succeeded, as the store has it afterwards."""

from __future__ import annotations

from tests.e2e.bench_runs import run_bench


def test_limits_burst_bench__tiny_run_starts_every_run_of_each_tenant_once() -> None:
    summary = run_bench(
        "bench/limits_burst.py",
        *("--big", "400", "--rate", "250", "--seconds", "1", "--interval", "0.1", "--drain"),
    )
    passes = summary["passes"]
    assert [p["rate"] for p in passes] == [250.0, None]
    for p in passes:
        expected = {"big": 400, "small": 10}
        assert p["submitted"] == p["started"] == p["distinct"] == expected, p["rate"]
        assert p["stored"] == {t: {"succeeded": n} for t, n in expected.items()}, p["rate"]
