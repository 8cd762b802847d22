"""Fast checks of the suite's own parts: the nemesis's plan is the seed's, and the checker's
percentile is the one its table claims."""

from __future__ import annotations

from tests.faults import summary
from tests.faults.checker import Report, percentile
from tests.faults.nemesis import PlannedFault, mixed_plan, random_plan


def kill_plan(
    seed: int, slots: list[int], interval: tuple[float, float], duration: float, limit: int = 1000
) -> list[PlannedFault]:
    return random_plan(seed, "kill -9", slots, interval, duration, limit)


def test_random_plan__same_seed_same_plan_within_bounds() -> None:
    plan = kill_plan(7, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    assert plan == kill_plan(7, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    assert plan != kill_plan(8, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    offsets = [fault.offset for fault in plan]
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert all(3.0 <= gap <= 7.0 for gap in gaps) and offsets[-1] < 60.0
    assert {fault.slot for fault in plan} <= {3, 4, 5, 6}
    assert len(kill_plan(7, [0], (3.0, 5.0), 60.0, limit=5)) == 5


def test_percentile__nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([], 0.99) == 0.0


def test_mixed_plan__draws_every_kind_with_its_duration() -> None:
    kinds = [("kill -9", 0.0), ("kill -STOP", 8.0), ("kill -TERM", 0.0)]
    plan = mixed_plan(7, kinds, [1, 2, 3], (1.0, 2.0), 200.0)
    assert plan == mixed_plan(7, kinds, [1, 2, 3], (1.0, 2.0), 200.0)
    assert {(f.kind, f.lasts) for f in plan} == set(kinds)


def test_summary_table__a_column_per_scenario_failures_marked() -> None:
    passed = Report("S0", 7, {"runs_lost": 0, "start_delay_p99": 0.05}, {"runs_lost": True})
    failed = Report("S1", 7, {"runs_lost": 3}, {"runs_lost": False})
    lines = summary.table([passed, failed]).splitlines()
    assert lines[0] == "| metric | S0 | S1 |"
    assert "| `runs_lost` | 0 | **3** ✗ |" in lines
    assert "| `start_delay_p99` | 0.050 | — |" in lines
    assert lines[-1] == "| **result** | PASS | **FAIL** |"
