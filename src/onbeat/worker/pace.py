"""How many of a worker's runs end in a short time: what its claims may take beyond its free
slots (``Settings.claim_prefetch``).

A claim cycle (the queue's take, the store's claim, the outcome write) costs its worker, the
queue and their PostgreSQL backends about the same however few runs it carries. A worker whose
claims carried only its free slots claimed 64 runs a claim at the default concurrency while
its no-op runs ended by the thousand a second (W1, docs/performance.md). A worker that claims
the runs its slots will free within ``window`` as well carries up to ``claim_batch`` a claim;
those runs wait in it for a slot, about ``window`` at most while the pace holds. A worker whose
runs last long sees few end, and claims for its free slots alone."""

from __future__ import annotations

import time

__all__ = ["RecentEnds"]


class RecentEnds:
    """Runs ended in the current window of ``window`` seconds (real time) and the one before:
    the larger of the two is how many slots will likely free in the next window. Counting an
    end is one addition (it happens once per run); the windows turn when read."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._current = 0
        self._previous = 0

    def ended(self) -> None:
        self._current += 1

    def expected(self, window: float) -> int:
        """Runs likely to end within the next ``window`` seconds (0 when ``window`` is 0: off)."""
        if window <= 0:
            return 0
        now = time.monotonic()
        elapsed = now - self._started
        if elapsed >= window:
            self._previous = self._current if elapsed < 2 * window else 0
            self._current = 0
            self._started = now
        return max(self._previous, self._current)
