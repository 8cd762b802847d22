"""The DelayQueue seam: a precise timer and buffer in front of the store.

The store is the source of truth; the queue only decides *when* an execution id is handed to a
worker. Anything a queue loses, the scheduler's sweep finds again in the store, so a backend may
lose data (Redis restarted without persistence) without losing runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from onbeat.errors import ValidationError


@dataclass(frozen=True, slots=True)
class QueueItem:
    execution_id: str
    due_at: datetime
    priority: int = 0
    """Higher is more urgent: among due items, higher tiers are released first."""
    shard: int = 0
    """The execution's shard (fixed by the store). A backend may keep shards apart (Redis keys
    are hash-tagged by it); ``claim_due`` and ``missing`` still span every shard."""


def horizon(ahead: float) -> timedelta:
    """``ahead`` (seconds) as checked by ``claim_due`` and ``wait``: one rule, and one rounding
    to microseconds, for every backend. NaN or infinity would fail later and less clearly."""
    if not (math.isfinite(ahead) and ahead >= 0):
        raise ValidationError("ahead", f"must be a finite number of seconds >= 0, got {ahead!r}")
    return timedelta(seconds=ahead)


class DelayQueue(Protocol):
    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        """Add items; idempotent on ``execution_id`` (one copy is kept, with the newest due_at/priority)."""
        ...

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        """Atomically remove and return up to ``limit`` ids due by now + ``ahead`` seconds.

        Highest priority first, then earliest ``due_at`` (a backend that keeps shards apart,
        like Redis, orders by ``due_at`` within each shard and spreads a claim over the shards
        of a tier). An id is returned to one caller only, across processes if the backend is
        shared. ``ahead`` (>= 0, else ``ValidationError``) lets a worker take ids a little
        early and start each by a local timer at its due time; 0 claims only what is due.
        """
        ...

    async def remove(self, execution_ids: Sequence[str]) -> None:
        """Drop ids if present (e.g. the execution was cancelled)."""
        ...

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        """Those of ``execution_ids`` the queue does not hold (never enqueued, claimed, removed or
        lost), in the order given. One call per batch: the sweep re-enqueues only these."""
        ...

    async def next_due_at(self) -> datetime | None:
        """The earliest due time waiting, or None when empty."""
        ...

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        """Return once an item may be due within ``ahead`` seconds (the earliest due time minus
        ``ahead`` came, or new items arrived), or after ``timeout`` seconds, whichever is first.
        Lets workers sleep exactly; pass ``claim_due``'s ``ahead``. Negative: ``ValidationError``."""
        ...

    async def size(self) -> int:
        """Number of ids waiting, due or not."""
        ...

    async def close(self) -> None: ...
