"""Benchmark of the table delay queue (``onbeat.queue.table``) on PostgreSQL and SQLite.

Per driver, on a fresh table:

- ``enqueue``: ``--items`` (100,000) ids, all already due, in three priority tiers, enqueued in
  batches of ``--enqueue-batch`` (5,000: the scheduler's dispatch batch) by one queue object.
- ``claim``: ``--claimers`` (2) processes, each with its own queue object (as two workers), start
  together and call ``claim_due(--batch)`` (256) until the table is empty. Reports items/s (from
  the start signal until the last claimer finished), per-call latency p50/p99/max, and checks that
  every id was handed out exactly once.
- ``wake``: one process waits (``wait(10)`` then ``claim_due``) while this one enqueues one id due
  now, ``--wake-samples`` (200) times, 20 ms apart: the time from the enqueue's return to the other
  process's claim (PostgreSQL: by NOTIFY; SQLite: by the 50 ms poll).

Run::

    .venv/bin/python bench/queue_table.py                       # both drivers
    .venv/bin/python bench/queue_table.py --drivers postgres --items 20000

PostgreSQL: ``--postgres-url`` (default ``$ONBEAT_BENCH_POSTGRES_URL`` or the local ``test``
database); the table (random name) is dropped afterwards. SQLite: a file in a temporary
directory. Prints a table and one ``BENCH_JSON {...}`` line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event as EventType
from typing import Any

import psycopg
from psycopg import sql

from onbeat.clock import SystemClock
from onbeat.queue.base import QueueItem
from onbeat.queue.table import TableDelayQueue, open_table_queue

DEFAULT_POSTGRES_URL = os.environ.get(
    "ONBEAT_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


def _open(url: str) -> TableDelayQueue:
    return open_table_queue(url, SystemClock())


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


# -- claimers (child processes) ------------------------------------------------------------


def _claimer(url: str, batch: int, ready: EventType, go: EventType, out: Any) -> None:
    out.put(asyncio.run(_claim_until_empty(url, batch, ready, go)))


async def _claim_until_empty(
    url: str, batch: int, ready: EventType, go: EventType
) -> dict[str, Any]:
    queue = _open(url)
    await queue.open()
    await queue.claim_due(0)  # warm the pool's first connection
    ready.set()
    await asyncio.to_thread(go.wait)
    claimed: list[str] = []
    latencies: list[float] = []
    cpu = time.process_time()
    started = time.perf_counter()
    while True:
        before = time.perf_counter()
        got = await queue.claim_due(batch)
        latencies.append(time.perf_counter() - before)
        if not got:
            break
        claimed.extend(got)
    finished = time.perf_counter()
    cpu = time.process_time() - cpu
    await queue.close()
    return {
        "claimed": claimed,
        "latencies": latencies,
        "started": started,
        "finished": finished,
        "cpu": cpu,
    }


def _waiter(url: str, samples: int, ready: EventType, out: Any) -> None:
    out.put(asyncio.run(_wait_and_claim(url, samples, ready)))


async def _wait_and_claim(url: str, samples: int, ready: EventType) -> dict[str, float]:
    """Claim ``samples`` ids as soon as they arrive; each id carries its enqueue time."""
    queue = _open(url)
    await queue.open()
    await queue.wait(0)  # start listening before saying ready
    ready.set()
    delays: dict[str, float] = {}
    while len(delays) < samples:
        for eid in await queue.claim_due(16):
            delays[eid] = time.time() - float(eid.split("@", 1)[1])
        await queue.wait(10)
    await queue.close()
    return delays


# -- phases --------------------------------------------------------------------------------


async def _enqueue_phase(url: str, items: int, batch: int) -> dict[str, float]:
    queue = _open(url)
    await queue.open()
    due = datetime.now(UTC) - timedelta(seconds=10)
    work = [
        QueueItem(
            f"bench-{i:07d}", due + timedelta(microseconds=i * 97), priority=i % 3, shard=i % 1024
        )
        for i in range(items)
    ]
    started = time.perf_counter()
    cpu = time.process_time()
    for start in range(0, items, batch):
        await queue.enqueue(work[start : start + batch])
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    held = await queue.size()
    await queue.close()
    if held != items:
        raise SystemExit(f"enqueue: the table holds {held} ids, expected {items}")
    return {"enqueue_s": elapsed, "enqueue_per_s": items / elapsed, "enqueue_cpu_s": cpu}


def _claim_phase(url: str, items: int, batch: int, claimers: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(claimers)]
    procs = [ctx.Process(target=_claimer, args=(url, batch, ready, go, out)) for ready in readies]
    for proc in procs:
        proc.start()
    for ready in readies:
        if not ready.wait(60):
            raise SystemExit("a claimer did not start")
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    claimed = [eid for result in results for eid in result["claimed"]]
    latencies = [lat for result in results for lat in result["latencies"][:-1]]  # not the empty
    wall = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return {
        "claimed": len(claimed),
        "duplicates": len(claimed) - len(set(claimed)),
        "lost": items - len(set(claimed)),
        "per_claimer": [len(r["claimed"]) for r in results],
        "claim_s": wall,
        "claim_per_s": len(claimed) / wall,
        "claim_calls": len(latencies),
        "claim_p50_ms": _percentile(latencies, 0.50) * 1000,
        "claim_p99_ms": _percentile(latencies, 0.99) * 1000,
        "claim_max_ms": max(latencies, default=float("nan")) * 1000,
        "claimer_cpu_s": [round(r["cpu"], 3) for r in results],
    }


async def _wake_phase(url: str, samples: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Event()
    proc = ctx.Process(target=_waiter, args=(url, samples, ready, out))
    proc.start()
    if not await asyncio.to_thread(ready.wait, 60):
        raise SystemExit("the waiter did not start")
    queue = _open(url)
    for n in range(samples):
        await queue.enqueue([QueueItem(f"wake-{n}@{time.time()!r}", datetime.now(UTC))])
        await asyncio.sleep(0.02)  # one arrival at a time: the waiter is asleep again
    delays = list((await asyncio.to_thread(out.get, True, 120)).values())
    await asyncio.to_thread(proc.join)
    await queue.close()
    return {
        "wake_p50_ms": statistics.median(delays) * 1000,
        "wake_p99_ms": _percentile(delays, 0.99) * 1000,
        "wake_max_ms": max(delays) * 1000,
    }


async def _drop_postgres_table(url: str, table: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def run_driver(driver: str, args: argparse.Namespace, directory: str) -> dict[str, Any]:
    table = f"onbeat_queue_bench_{uuid.uuid4().hex[:10]}"
    if driver == "postgres":
        url = f"{args.postgres_url}?table={table}"
    else:
        url = f"sqlite:///{directory}/{table}.db?table={table}"
    try:
        figures: dict[str, Any] = {"driver": driver}
        figures |= asyncio.run(_enqueue_phase(url, args.items, args.enqueue_batch))
        figures |= _claim_phase(url, args.items, args.batch, args.claimers)
        if args.wake_samples:
            figures |= asyncio.run(_wake_phase(url, args.wake_samples))
        return figures
    finally:
        if driver == "postgres":
            asyncio.run(_drop_postgres_table(args.postgres_url, table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drivers", default="postgres,sqlite")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--enqueue-batch", type=int, default=5_000)
    parser.add_argument("--batch", type=int, default=256, help="claim_due limit")
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--wake-samples", type=int, default=200)
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="onbeat-bench-queue-") as directory:
        rows = [run_driver(driver.strip(), args, directory) for driver in args.drivers.split(",")]

    print(
        f"{'driver':<9}{'enqueue/s':>11}{'claim/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{'wake p50':>9}{'wake p99':>9}  lost dup split"
    )
    for r in rows:
        print(
            f"{r['driver']:<9}{r['enqueue_per_s']:>11,.0f}{r['claim_per_s']:>10,.0f}"
            f"{r['claim_p50_ms']:>8.2f}{r['claim_p99_ms']:>8.2f}{r['claim_max_ms']:>8.1f}"
            f"{r.get('wake_p50_ms', float('nan')):>9.1f}{r.get('wake_p99_ms', float('nan')):>9.1f}"
            f"  {r['lost']:>4} {r['duplicates']:>3} {'/'.join(map(str, r['per_claimer']))}"
        )
    env = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "psycopg": psycopg.__version__,
        "loadavg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    settings = {k: v for k, v in vars(args).items() if k != "postgres_url"}
    print("BENCH_JSON " + json.dumps({"runs": rows, "env": env, "settings": settings}))
    if any(r["lost"] or r["duplicates"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
