"""The one place onbeat reads time, so tests can drive it instead of sleeping.

Every component takes a ``Clock``. Production uses ``SystemClock``; tests use
``onbeat.testing.FakeClock``, whose ``advance()`` also wakes the sleepers it has passed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Current wall-clock time, timezone-aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; for deadlines and timeouts."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class StoreClock(SystemClock):
    """The clock of an ``App`` given none: ``now()`` is the store's (PostgreSQL: the database
    server's, see ``PostgresStore``), so the queue, the worker and the scheduler of every process
    of a fleet agree on "now" with the store whatever their host's wall clock says; deadlines
    and sleeps run on this host's monotonic clock."""

    def __init__(self, store_now: Callable[[], datetime]) -> None:
        self._store_now = store_now

    def now(self) -> datetime:
        return self._store_now()
