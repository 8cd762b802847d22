"""A run a worker holds the lease of, from its claim (or confirm) until its outcome is written."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from onbeat.store.base import ClaimedRun

__all__ = ["Held"]


@dataclass(eq=False, slots=True)
class Held:
    run: ClaimedRun
    task: asyncio.Task[None] | None = None
    """The asyncio task running it; None if it was claimed while the worker was stopping (it is
    released, never started)."""
    began: bool = False
    """Its task has begun (on the loop): a run not begun yet may be handed back while a task
    blocks the loop (``Worker._hand_back_unstarted``)."""
    renewed_at: float = -math.inf
    """When (the worker clock's monotonic time) the store call that granted or last renewed its
    lease began: no later than the commit the lease runs from. The heartbeat renews it again
    before ``heartbeat_interval`` has passed since (-inf, not known: at its next look)."""

    @property
    def token(self) -> int:
        return self.run.execution.fencing_token
