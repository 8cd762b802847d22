"""Fast checks of the suite's own parts: the nemesis's plan is the seed's, and the checker's
percentile is the one its table claims."""

from __future__ import annotations

from tests.faults.checker import percentile
from tests.faults.nemesis import PlannedFault, random_plan


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
