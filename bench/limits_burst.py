"""A tenant's burst against the fleet limits, on the embedded node (real time, SQLite, memory
queue): tenant ``big`` submits ``--big`` runs due now at once (back-to-back ``submit_many`` calls
of 1,000) while tenant ``small`` submits one run every ``--interval`` seconds for ``--seconds``;
every run takes ``--task-seconds``. Printed: ``small``'s start delay (p50, max) and ``big``'s
start rate, with ``big`` limited to ``--rate`` starts/s and without a limit.

``small``'s delay with the limit is what the node needs to take in ``big``'s burst once
(insert, dispatch, one claim that gives each run its slot); without it, the time to run
``big``'s whole backlog ahead of it.

    .venv/bin/python bench/limits_burst.py [--big 20000] [--rate 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from onbeat import App, TaskContext
from onbeat.limits import TenantLimits
from onbeat.node import Node

BATCH = 1_000


async def burst(directory: Path, args: argparse.Namespace, rate: float | None) -> str:
    app = App(f"sqlite:///{directory}/onbeat.db")
    delays: dict[str, list[float]] = {"big": [], "small": []}
    big_times: list[float] = []
    small_runs = int(args.seconds / args.interval)
    small_done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def record(tenant: str, ctx: TaskContext) -> None:
        now = time.time()
        delays[tenant].append(now - ctx.scheduled_for.timestamp())
        if tenant == "big":
            big_times.append(now)
        elif len(delays["small"]) == small_runs:
            loop.call_soon(small_done.set)

    @app.task(name="big")
    async def big(ctx: TaskContext) -> None:
        record("big", ctx)
        await asyncio.sleep(args.task_seconds)

    @app.task(name="small")
    async def small(ctx: TaskContext) -> None:
        record("small", ctx)
        await asyncio.sleep(args.task_seconds)

    if rate is not None:
        app.store.tenant_limits_set("big", TenantLimits(max_starts_per_second=rate))
    node = Node(app)
    runner = asyncio.create_task(node.run())
    await asyncio.sleep(0.5)

    def submit_big() -> None:
        jobs = [app.prepare("big", tenant="big") for _ in range(args.big)]
        for i in range(0, args.big, BATCH):
            app.submit_many(jobs[i : i + BATCH])

    def submit_small() -> None:
        start = time.monotonic()
        for i in range(small_runs):
            time.sleep(max(0.0, start + i * args.interval - time.monotonic()))
            app.schedule("small", tenant="small")

    await asyncio.gather(asyncio.to_thread(submit_big), asyncio.to_thread(submit_small))
    await asyncio.wait_for(small_done.wait(), 300)
    node.stop.set()
    await runner
    app.close()
    ordered = sorted(delays["small"])
    window = max(big_times) - min(big_times) if len(big_times) > 1 else 0.0
    return (
        f"big {f'limited to {rate:g}/s' if rate else 'unlimited'}: small start delay "
        f"p50 {statistics.median(ordered):.3f} s, max {ordered[-1]:.3f} s; big started "
        f"{len(big_times)} runs ({len(big_times) / window if window else 0:.0f}/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--task-seconds", type=float, default=0.0)
    args = parser.parse_args()
    for rate in (args.rate, None):
        with tempfile.TemporaryDirectory() as directory:
            print(asyncio.run(burst(Path(directory), args, rate)))


if __name__ == "__main__":
    main()
