"""A clock that only moves when a test moves it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta


class FakeClock:
    """A frozen clock. ``advance()`` moves it and wakes every ``sleep()`` whose deadline has passed."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock needs an aware datetime")
        self._mono = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), fut))
        await fut

    async def until_sleeping(self, count: int = 1) -> None:
        """Yield to the event loop until ``count`` sleepers wait on this clock, so a test that
        advances time next knows the code under test is already waiting for it."""
        while sum(not fut.done() for _, _, fut in self._sleepers) < count:  # noqa: ASYNC110
            await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake the sleepers whose deadline is now past."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._mono += seconds
        self._now += timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (forward only)."""
        self.advance((when - self._now).total_seconds())

    def step_back(self, seconds: float) -> None:
        """Set the wall clock back, as NTP steps a host's clock (or a failover lands on a server
        whose clock is behind); the monotonic clock, and so every sleeper, stays where it is."""
        if seconds < 0:
            raise ValueError("step_back takes the seconds to go back")
        self._now -= timedelta(seconds=seconds)
