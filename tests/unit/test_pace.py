"""RecentEnds: how many of a worker's runs will likely end within the next window, from the
ends of the current window and the one before, forgotten once they are older than that."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from onbeat.worker import pace
from onbeat.worker.pace import RecentEnds

WINDOW = 0.0625  # a binary fraction: the windows turn exactly when the test says


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> FakeMonotonic:
    clock = FakeMonotonic()
    monkeypatch.setattr(pace, "time", SimpleNamespace(monotonic=clock))
    return clock


def ended(ends: RecentEnds, n: int) -> None:
    for _ in range(n):
        ends.ended()


def test_recent_ends__the_larger_of_this_window_and_the_last(monotonic: FakeMonotonic) -> None:
    ends = RecentEnds()
    ended(ends, 30)
    assert ends.expected(WINDOW) == 30  # the current window so far
    monotonic.now += WINDOW
    assert ends.expected(WINDOW) == 30  # the window turned: the last one's 30
    ended(ends, 5)
    assert ends.expected(WINDOW) == 30
    ended(ends, 40)
    assert ends.expected(WINDOW) == 45
    monotonic.now += WINDOW
    assert ends.expected(WINDOW) == 45
    ended(ends, 2)
    monotonic.now += WINDOW
    assert ends.expected(WINDOW) == 2  # the pace fell: the last window's 2, not the 45 before


def test_recent_ends__older_ends_are_forgotten(monotonic: FakeMonotonic) -> None:
    """Runs that stopped ending (a worker now running long runs, or idle) prefetch nothing once
    two windows passed without an end, however many ended before."""
    ends = RecentEnds()
    ended(ends, 200)
    monotonic.now += 2 * WINDOW
    assert ends.expected(WINDOW) == 0
    monotonic.now += WINDOW
    assert ends.expected(WINDOW) == 0


def test_recent_ends__off_at_zero(monotonic: FakeMonotonic) -> None:
    ends = RecentEnds()
    ended(ends, 10)
    assert ends.expected(0.0) == 0
