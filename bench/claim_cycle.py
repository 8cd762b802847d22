"""What a worker's store transactions cost per transaction and per run on PostgreSQL: the claim
(``Store.execution_claim``) and the outcome write (``Store.execution_finish_many``) at several
batch sizes, in client CPU, server CPU and wall time.

    .venv/bin/python bench/claim_cycle.py                          # batches of 8, 64, 256
    .venv/bin/python bench/claim_cycle.py --batches 16,32,64 --runs 20000

W1 costs about 170 us per run plus 6.4 ms per claim cycle in all processes (docs/performance.md,
"A claim cycle's fixed cost"): this splits the store's part of both. For each batch size, on a
fresh schema committing synchronously as the fleet does, ``--runs`` one-shot jobs due now are
created and dispatched, claimed in batches of that size, then finished (succeeded) in batches of
that size. The server's CPU is read from ``/proc`` for the store's own backends (found by their
``application_name``). Each line of the fit is least squares over the batch sizes:
``per transaction + per run x batch``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from onbeat import App, TaskContext
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.store.base import ClaimedRun, Completion
from onbeat.testing import FakeClock
from onbeat.testing.postgres import TEST_SERVER, fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WORKER = "bench-worker"
TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these server processes (those gone count 0)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def backends(app_name: str) -> list[int]:
    with psycopg.connect(TEST_SERVER) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        )
        return [row[0] for row in rows]


class Meter:
    """Client CPU, server CPU and wall time of a stretch of work."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = pids
        self._began = (time.process_time(), backend_cpu_s(pids), time.perf_counter())

    def read(self) -> tuple[float, float, float]:
        cpu, server, wall = self._began
        return (
            time.process_time() - cpu,
            backend_cpu_s(self._pids) - server,
            time.perf_counter() - wall,
        )


async def measure(batch: int, runs: int) -> dict[str, Any]:
    app_name = f"onbeat-claim-cycle-{os.getpid()}-{batch}"
    with fresh_schema() as url:
        url = url.replace("%20-csynchronous_commit%3Doff", "")  # commit as the fleet does
        app = App(f"{url}&application_name={app_name}", clock=(clock := FakeClock()))

        @app.task(name="noop")
        async def noop(ctx: TaskContext, i: int) -> None:
            pass

        app.submit_many([app.prepare("noop", {"i": i}) for i in range(runs + batch)])
        queue = MemoryDelayQueue(clock)
        scheduler = Scheduler(app.store, queue, app.settings, clock)
        await scheduler.renew_shards()
        await scheduler.dispatch()
        ids = await queue.claim_due(runs + batch)

        def claim(some: Sequence[str]) -> list[ClaimedRun]:
            s = app.settings
            return app.store.execution_claim(some, WORKER, s.lease_ttl, s.misfire_grace).started

        def finish(some: Sequence[ClaimedRun]) -> int:
            done = [Completion(r.execution.id, r.execution.fencing_token, True) for r in some]
            return len(app.store.execution_finish_many(done))

        finish(claim(ids[:batch]))  # warm: the pool's connections, prepared statements
        pids = backends(app_name)
        rest = ids[batch:]
        meter, started = Meter(pids), []
        for k in range(0, len(rest), batch):
            started += claim(rest[k : k + batch])
        claimed = meter.read()
        meter, finished = Meter(pids), 0
        for k in range(0, len(started), batch):
            finished += finish(started[k : k + batch])
        ended = meter.read()
        app.close()
    transactions = -(-len(rest) // batch)
    figures: dict[str, Any] = {"batch": batch, "runs": len(rest), "transactions": transactions}
    figures["started"], figures["finished"] = len(started), finished
    for name, (client, server, wall) in (("claim", claimed), ("finish", ended)):
        figures[name] = {
            "client_ms_per_tx": round(client / transactions * 1e3, 3),
            "server_ms_per_tx": round(server / transactions * 1e3, 3),
            "wall_ms_per_tx": round(wall / transactions * 1e3, 3),
        }
    return figures


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of ms per transaction against batch size: (ms fixed, us per run)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
    return round(mean_y - slope * mean_x, 3), round(slope * 1e3, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="8,64,256", help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=12_800, help="runs measured per batch size")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    results = [asyncio.run(measure(b, args.runs)) for b in sizes]
    print(f"{'batch':>6} {'':8} {'client ms/tx':>13} {'server ms/tx':>13} {'wall ms/tx':>11}")
    for r in results:
        for name in ("claim", "finish"):
            f = r[name]
            print(
                f"{r['batch']:6d} {name:8} {f['client_ms_per_tx']:13.3f} "
                f"{f['server_ms_per_tx']:13.3f} {f['wall_ms_per_tx']:11.3f}"
            )
    fits: dict[str, dict[str, tuple[float, float]]] = {}
    if len(sizes) > 1:
        print("fit: ms per transaction + us per run")
        for name in ("claim", "finish"):
            fits[name] = {}
            for side in ("client", "server"):
                key = f"{side}_ms_per_tx"
                fits[name][side] = fit([(r["batch"], r[name][key]) for r in results])
                fixed, per_run = fits[name][side]
                print(f"  {name:8} {side:6} {fixed:7.3f} ms + {per_run:6.1f} us per run")
    summary = {"bench": "claim_cycle", "python_loop_us": python_loop_us(), "results": results}
    print("BENCH_JSON", json.dumps({**summary, "fits": fits}))
    if any(not r["runs"] == r["started"] == r["finished"] for r in results):
        sys.exit(1)  # a run not claimed or not finished: the figures are not of every run


if __name__ == "__main__":
    main()
