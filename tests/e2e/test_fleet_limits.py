"""Fairness under the fleet limits, in real time on an embedded node (SQLite, memory queue, one
scheduler, one worker of 64 places): every 100 ms tenant ``big`` submits 100 runs due now in one
``submit_many`` and tenant ``small`` one, for 10 s; each run takes 100 ms. That is more than the
node runs, so without a limit ``big``'s backlog grows and ``small``'s runs wait behind it
(printed, not asserted: how long depends on the machine); with ``big`` limited in starts per
second, ``small``'s runs start within a second of their due time (asserted).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from onbeat import App, TaskContext
from onbeat.limits import TenantLimits
from onbeat.node import Node

SMALL_INTERVAL = 0.1
SMALL_RUNS = 100
LOAD_RATIO = 100
"""``big`` submits this many runs for each of ``small``'s: one ``submit_many`` of them per tick."""
BIG_RUNS = SMALL_RUNS * LOAD_RATIO
BIG_STARTS_PER_SECOND = 200.0
TASK_SECONDS = 0.1
"""How long each run takes: the node's 64 places then run at most 640 runs/s, fewer than
``big`` submits, so without a limit ``big``'s backlog grows and ``small`` waits behind it."""
MAX_SMALL_DELAY = 1.0
SAFETY_TIMEOUT = 60.0


@dataclass
class Starts:
    """Start delay (start - fire time, in seconds) and start time of every run, by tenant."""

    delays: dict[str, list[float]] = field(default_factory=lambda: {"big": [], "small": []})
    times: dict[str, list[float]] = field(default_factory=lambda: {"big": [], "small": []})
    small_done: asyncio.Event = field(default_factory=asyncio.Event)
    first_submitted: float = 0.0

    def record(self, tenant: str, ctx: TaskContext) -> None:
        now = time.time()
        self.delays[tenant].append(now - ctx.scheduled_for.timestamp())
        self.times[tenant].append(now)
        if tenant == "small" and len(self.delays["small"]) == SMALL_RUNS:
            self.small_done.set()


async def _two_tenants(directory: Path, big_limited: bool) -> Starts:
    app = App(f"sqlite:///{directory}/onbeat.db")
    starts = Starts()

    @app.task(name="big")
    async def big(ctx: TaskContext) -> None:
        starts.record("big", ctx)
        await asyncio.sleep(TASK_SECONDS)

    @app.task(name="small")
    async def small(ctx: TaskContext) -> None:
        starts.record("small", ctx)
        await asyncio.sleep(TASK_SECONDS)

    if big_limited:
        app.store.tenant_limits_set(
            "big", TenantLimits(max_starts_per_second=BIG_STARTS_PER_SECOND)
        )
    node = Node(app)
    runner = asyncio.create_task(node.run())
    try:
        assert node._scheduler is not None
        await asyncio.wait_for(node._scheduler.started.wait(), SAFETY_TIMEOUT)

        def submit_both() -> None:
            """Every tick: ``big``'s batch of runs due now, then ``small``'s one run."""
            start = time.monotonic()
            starts.first_submitted = time.time()
            for i in range(SMALL_RUNS):
                time.sleep(max(0.0, start + i * SMALL_INTERVAL - time.monotonic()))
                app.submit_many([app.prepare("big", tenant="big") for _ in range(LOAD_RATIO)])
                app.schedule("small", tenant="small")

        await asyncio.to_thread(submit_both)
        await asyncio.wait_for(starts.small_done.wait(), SAFETY_TIMEOUT)
    finally:
        node.stop.set()
        await asyncio.wait_for(runner, SAFETY_TIMEOUT)
        app.close()
    return starts


def _figures(starts: Starts) -> str:
    small = sorted(starts.delays["small"])
    big = starts.times["big"]
    window = max(big) - min(big) if len(big) > 1 else 0.0
    return (
        f"small: {len(small)} runs, start delay p50 {small[len(small) // 2]:.3f} s, "
        f"max {small[-1]:.3f} s; big: {len(big)} runs started in {window:.1f} s "
        f"({len(big) / window if window else 0:.0f}/s)"
    )


def _most_ahead_of_the_rate(times: list[float], since: float, rate: float) -> float:
    """How many slots ahead of ``rate`` (counted from ``since``) the k-th of ``times`` starts, at
    most: no more than 0 if no run starts before its slot (slots are ``1 / rate`` apart)."""
    return max(k - (at - since) * rate for k, at in enumerate(sorted(times)))


async def test_a_tenant_limited_in_starts_per_second_cannot_starve_a_small_one(
    tmp_path: Path,
) -> None:
    limited = await _two_tenants(tmp_path, big_limited=True)
    print(f"\nbig limited to {BIG_STARTS_PER_SECOND:.0f} starts/s: {_figures(limited)}")
    small = limited.delays["small"]
    assert len(small) == SMALL_RUNS
    assert max(small) < MAX_SMALL_DELAY, _figures(limited)
    # GCRA spaces the slots evenly and no run starts before its slot.
    ahead = _most_ahead_of_the_rate(
        limited.times["big"], limited.first_submitted, BIG_STARTS_PER_SECOND
    )
    assert ahead <= 0.01, ahead


async def test_without_the_limit_the_small_tenant_waits_behind_the_backlog(
    tmp_path: Path,
) -> None:
    """The same load with no limit: printed for comparison (how long ``small`` waits depends on
    how fast this machine drains ``big``'s backlog)."""
    unlimited = await _two_tenants(tmp_path, big_limited=False)
    print(f"\nno limit: {_figures(unlimited)}")
    assert len(unlimited.delays["small"]) == SMALL_RUNS
