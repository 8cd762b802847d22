"""A tenant's burst against the fleet limits, on the embedded node (real time, SQLite, memory
queue): tenant ``big`` submits ``--big`` runs due now at once (back-to-back ``submit_many`` calls
of 1,000) while tenant ``small`` submits one run every ``--interval`` seconds for ``--seconds``;
every run takes ``--task-seconds``. Printed: ``small``'s start delay (p50, max) and ``big``'s
start rate, with ``big`` limited to ``--rate`` starts/s and without a limit.

``small``'s delay with the limit is what the node needs to take in ``big``'s burst once
(insert, dispatch, one claim that gives each run its slot); without it, the time to run
``big``'s whole backlog ahead of it.

Each pass also reports, in one ``BENCH_JSON {...}`` line, the runs of each tenant submitted,
started (task calls, and distinct runs among them) and, read back from the store once the node
has stopped, by status. ``big``'s runs not started by the time ``small``'s last one has are left
queued, unless ``--drain`` waits for them too. Exits 1 if a run started twice, a started run did
not succeed, a submitted run is missing from the store, or (with ``--drain``) one did not start.

    .venv/bin/python bench/limits_burst.py [--big 20000] [--rate 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from onbeat import App, TaskContext
from onbeat.limits import TenantLimits
from onbeat.node import Node

BATCH = 1_000
TENANTS = ("big", "small")


def stored(db: Path) -> dict[str, dict[str, int]]:
    """Runs in the store by tenant and status."""
    counts: dict[str, dict[str, int]] = {tenant: {} for tenant in TENANTS}
    conn = sqlite3.connect(db)
    try:
        for tenant, status, n in conn.execute(
            "SELECT j.tenant, e.status, count(*) FROM executions e JOIN jobs j ON j.id = e.job_id"
            " GROUP BY j.tenant, e.status"
        ):
            counts.setdefault(tenant, {})[status] = n
    finally:
        conn.close()
    return counts


async def burst(directory: Path, args: argparse.Namespace, rate: float | None) -> dict[str, Any]:
    app = App(f"sqlite:///{directory}/onbeat.db")
    delays: dict[str, list[float]] = {"big": [], "small": []}
    started: dict[str, list[str]] = {"big": [], "small": []}
    big_times: list[float] = []
    small_runs = int(args.seconds / args.interval)
    small_done = asyncio.Event()
    big_done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def record(tenant: str, ctx: TaskContext) -> None:
        now = time.time()
        delays[tenant].append(now - ctx.scheduled_for.timestamp())
        started[tenant].append(ctx.execution_id)
        if tenant == "big":
            big_times.append(now)
            if len(big_times) == args.big:
                loop.call_soon(big_done.set)
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
    if args.drain:
        await asyncio.wait_for(big_done.wait(), 300)
    node.stop.set()
    await runner
    app.close()
    ordered = sorted(delays["small"])
    window = max(big_times) - min(big_times) if len(big_times) > 1 else 0.0
    rate_s = len(big_times) / window if window else 0
    line = (
        f"big {f'limited to {rate:g}/s' if rate else 'unlimited'}: small start delay "
        f"p50 {statistics.median(ordered):.3f} s, max {ordered[-1]:.3f} s; big started "
        f"{len(big_times)} runs ({rate_s:.0f}/s)"
    )
    return {
        "line": line,
        "rate": rate,
        "submitted": {"big": args.big, "small": small_runs},
        "started": {tenant: len(ids) for tenant, ids in started.items()},
        "distinct": {tenant: len(set(ids)) for tenant, ids in started.items()},
        "stored": stored(directory / "onbeat.db"),
        "small_delay_p50_s": round(statistics.median(ordered), 4),
        "small_delay_max_s": round(ordered[-1], 4),
        "big_starts_per_s": round(rate_s),
    }


def counts_add_up(result: dict[str, Any], drain: bool) -> bool:
    """No run started twice, every started run succeeded, every submitted one is in the store,
    every small one started, and with ``drain`` every big one too."""
    for tenant in TENANTS:
        submitted, started = result["submitted"][tenant], result["started"][tenant]
        by_status = result["stored"][tenant]
        if started != result["distinct"][tenant] or by_status.get("succeeded", 0) != started:
            return False
        if sum(by_status.values()) != submitted:
            return False
        if (tenant == "small" or drain) and started != submitted:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--task-seconds", type=float, default=0.0)
    parser.add_argument(
        "--drain", action="store_true", help="stop once every big run has started too"
    )
    args = parser.parse_args()
    passes = []
    for rate in (args.rate, None):
        with tempfile.TemporaryDirectory() as directory:
            result = asyncio.run(burst(Path(directory), args, rate))
        print(result.pop("line"))
        passes.append(result)
    settings = vars(args)
    print(
        "BENCH_JSON "
        + json.dumps({"bench": "limits_burst", "settings": settings, "passes": passes})
    )
    if not all(counts_add_up(result, args.drain) for result in passes):
        sys.exit(1)  # a run lost, started twice or not finished: the figures are not of every run


if __name__ == "__main__":
    main()
