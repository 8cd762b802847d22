"""A worker's own part of a burst: from the confirm of runs held ahead to every task begun.

    .venv/bin/python bench/burst_start.py --runs 5000            # us per run, p50 / last start
    .venv/bin/python bench/burst_start.py --runs 5000 --profile  # and the top functions

What is left of W2's start delay once every run of the burst is held ahead and confirmed at its
instant (``docs/performance.md``, "Claims ahead of the due time") is each worker starting its runs
one by one. This measures that alone, in one process: runs are created, dispatched and claimed
ahead on a real SQLite store, then the confirm and the outcome writes are answered without a store
(the store's share is measured by ``bench/peers/run.py``), and the time from the confirm to the
last task's first line is printed, per run, with the default concurrency and a no-op async task.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from onbeat import App, TaskContext
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.store.base import Completion
from onbeat.testing import FakeClock
from onbeat.worker import Worker

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402


class _AnsweringStore:
    """The app's store, except that the confirm and the outcomes are answered at once."""

    def __init__(self, app: App) -> None:
        self._store = app.store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def execution_confirm(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        return {eid: token + 1 for eid, token in held.items()}

    def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
        return [done.execution_id for done in completions]


async def measure(runs: int, profile: bool) -> dict[str, float]:
    began: dict[int, float] = {}
    starts = 0
    clock = FakeClock()
    app = App(f"sqlite:///{tempfile.mkdtemp()}/burst.db", clock=clock, claim_ahead=5.0)

    @app.task(name="noop")
    async def noop(ctx: TaskContext, i: int) -> None:
        nonlocal starts
        starts += 1
        began[i] = time.perf_counter()

    at = clock.now() + timedelta(seconds=3)
    for i in range(runs):
        app.schedule("noop", {"i": i}, at=at)
    queue = MemoryDelayQueue(clock)
    scheduler = Scheduler(app.store, queue, app.settings, clock)
    await scheduler.renew_shards()
    await scheduler.dispatch()
    worker = Worker(_AnsweringStore(app), queue, app.registry, app.settings, clock)
    # the worker's own steps (private: this measures one of them), without its loops
    while (await worker._claim())[0]:
        pass
    clock.advance(3)
    profiler = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    await worker._ahead.confirm_due()
    while len(began) < runs:  # noqa: ASYNC110 (the runs are the loop's other tasks)
        await asyncio.sleep(0)
    for _ in range(100):  # a run started twice would show in these passes
        await asyncio.sleep(0)
    end = time.perf_counter()
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    app.close()
    times = sorted(began.values())
    return {
        "runs": runs,
        "started": starts,
        "us_per_run": round((end - start) / runs * 1e6, 1),
        "p50_ms": round((times[runs // 2] - start) * 1e3, 1),
        "last_ms": round((end - start) * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.runs, args.profile))
    print(
        f"{figures['runs']} runs confirmed at one instant: {figures['us_per_run']} us per run, "
        f"p50 {figures['p50_ms']} ms, last {figures['last_ms']} ms"
    )
    print(
        "BENCH_JSON",
        json.dumps({"bench": "burst_start", "python_loop_us": python_loop_us(), **figures}),
    )


if __name__ == "__main__":
    main()
