"""The overview's arithmetic: delay classes, percentiles estimated from them, chart axes."""

from __future__ import annotations

import random

import pytest

from onbeat.dashboard.charts import _linear_ticks
from onbeat.dashboard.overview import percentile
from onbeat.store.base import delay_class, delay_class_floor


@pytest.mark.parametrize("cls", range(40))
def test_delay_class__each_class_runs_from_its_floor_to_the_next_ones(cls: int) -> None:
    assert delay_class(delay_class_floor(cls)) == cls
    assert delay_class(delay_class_floor(cls + 1) - 1) == cls


def test_percentile__interpolates_inside_the_class_and_stays_in_it() -> None:
    rng = random.Random(7)
    delays = [rng.randrange(1_000, 3_000_000) for _ in range(5_000)]  # 1 ms to 3 s, in us
    histogram: dict[int, int] = {}
    for us in delays:
        histogram[delay_class(us)] = histogram.get(delay_class(us), 0) + 1
    delays.sort()
    for q in (0.5, 0.9, 0.99):
        exact = delays[int(q * len(delays)) - 1]
        estimate = percentile(histogram, q)
        assert estimate is not None
        cls = delay_class(exact)
        assert delay_class_floor(cls) <= estimate * 1e6 <= delay_class_floor(cls + 1)
        assert abs(estimate * 1e6 - exact) / exact < 0.1, (q, estimate, exact)
    assert percentile({}, 0.5) is None


@pytest.mark.parametrize(
    ("maximum", "ticks"),
    [
        (1, [0, 1]),
        (3, [0, 1, 2, 3]),
        (7, [0, 2, 4, 6, 8]),
        (10, [0, 5, 10]),
        (130, [0, 50, 100, 150]),
    ],
)
def test_chart_axis__round_whole_ticks_up_to_the_maximum(maximum: int, ticks: list[int]) -> None:
    top, found = _linear_ticks(maximum)
    assert found == ticks
    assert top == ticks[-1] >= maximum
