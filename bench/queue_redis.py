"""Benchmark of the Redis delay queue (``onbeat.queue.redis``) on its own, without a store.

1. **enqueue**: ``--items`` (100,000) ids, spread over ``--shards`` (1,024) shards and
   ``--tiers`` priority tiers, all due now, enqueued in batches of ``--enqueue-batch`` (1,000,
   about what one scheduler dispatch pass hands over) from one process.
2. **claim**: ``--claimers`` (2) processes, each with its own queue object, claim batches of
   ``--batch`` (256) until the queue is empty. Reports items/s (all claimed over the wall time
   from the start signal to the last claimer's end), claim latency p50/p99/max, and checks that
   every id was claimed exactly once.
3. **wake**: a process loops ``wait(10)`` + ``claim_due`` like a worker while this one enqueues
   one id due now every 20 ms, ``--wakes`` (200) times: time from the enqueue's start to the
   other process's claim (pub/sub wake-up across processes).

Also reports the CPU seconds of Redis (``INFO cpu``) and of the claimers, and Redis memory per
held id. Keys live under a fresh prefix that is dropped afterwards. Prints a table and one
``BENCH_JSON {...}`` line. Example::

    .venv/bin/python bench/queue_redis.py
    .venv/bin/python bench/queue_redis.py --items 20000 --shards 16 --claimers 4
    .venv/bin/python bench/queue_redis.py --per-shard-calls   # the calls a Redis Cluster needs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import multiprocessing.synchronize
import resource
import statistics
import time
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from onbeat.clock import SystemClock
from onbeat.queue import QueueItem, open_queue
from onbeat.testing.redis_queue import drop_prefix, fresh_queue_url


async def _redis_stats(base: str) -> dict[str, float]:
    client = aioredis.Redis.from_url(base)
    try:
        cpu = await client.info("cpu")
        memory = await client.info("memory")
    finally:
        await client.aclose()
    return {
        "cpu": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "memory": float(memory["used_memory"]),
    }


async def _enqueue(url: str, args: argparse.Namespace) -> dict[str, float]:
    clock = SystemClock()
    queue = open_queue(url, clock)
    due = clock.now() - timedelta(seconds=1)
    items = [
        QueueItem(f"{i:032x}", due + timedelta(microseconds=i), i % args.tiers, i % args.shards)
        for i in range(args.items)
    ]
    latencies = []
    started = time.perf_counter()
    for start in range(0, len(items), args.enqueue_batch):
        before = time.perf_counter()
        await queue.enqueue(items[start : start + args.enqueue_batch])
        latencies.append(time.perf_counter() - before)
    elapsed = time.perf_counter() - started
    held = await queue.size()
    await queue.close()
    assert held == args.items, f"queue holds {held} of {args.items}"
    return {"seconds": elapsed, "batch_p99": _quantile(latencies, 0.99)}


def _claimer(
    url: str, batch: int, go: multiprocessing.synchronize.Event, out: Any, index: int
) -> None:
    async def run() -> None:
        queue = open_queue(url, SystemClock())
        await queue.size()  # connected before the start signal
        go.wait()
        claimed: list[str] = []
        latencies: list[float] = []
        started = time.perf_counter()
        while True:
            before = time.perf_counter()
            ids = await queue.claim_due(batch)
            latencies.append(time.perf_counter() - before)
            if not ids:
                break
            claimed += ids
        ended = time.perf_counter()
        await queue.close()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out.put(
            {
                "index": index,
                "ids": claimed,
                "latencies": latencies,
                "started": started,
                "ended": ended,
                "cpu": usage.ru_utime + usage.ru_stime,
            }
        )

    asyncio.run(run())


def _waker(url: str, count: int, ready: multiprocessing.synchronize.Event, out: Any) -> None:
    """Waits and claims like a worker; each id carries the ns time it was enqueued at."""

    async def run() -> None:
        queue = open_queue(url, SystemClock())
        await queue.wait(0)  # subscribed before the first enqueue
        ready.set()
        delays: list[float] = []
        while len(delays) < count:
            await queue.wait(10)
            ids = await queue.claim_due(100)
            delays += [time.time() - int(eid.split("-")[1]) / 1e9 for eid in ids]
        await queue.close()
        out.put(delays)

    asyncio.run(run())


async def _wake_enqueues(url: str, count: int) -> None:
    clock = SystemClock()
    queue = open_queue(url, clock)
    for _ in range(count):
        await queue.enqueue([QueueItem(f"wake-{time.time_ns()}", clock.now(), shard=7)])
        await asyncio.sleep(0.02)  # load generation: one id every 20 ms
    await queue.close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=1024)
    parser.add_argument("--tiers", type=int, default=1)
    parser.add_argument("--enqueue-batch", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument(
        "--per-shard-calls", action="store_true", help="one shard per script call, as on a Cluster"
    )
    args = parser.parse_args()

    options = {"per_shard_calls": 1} if args.per_shard_calls else {}
    url, prefix = fresh_queue_url(args.url, **options)
    try:
        before = asyncio.run(_redis_stats(args.url))
        enqueue = asyncio.run(_enqueue(url, args))
        loaded = asyncio.run(_redis_stats(args.url))

        spawn = multiprocessing.get_context("spawn")
        go, out = spawn.Event(), spawn.Queue()
        workers = [
            spawn.Process(target=_claimer, args=(url, args.batch, go, out, i))
            for i in range(args.claimers)
        ]
        for worker in workers:
            worker.start()
        time.sleep(2.0)  # let every claimer import and connect before the start signal
        go.set()
        results = [out.get(timeout=600) for _ in workers]
        for worker in workers:
            worker.join()
        after = asyncio.run(_redis_stats(args.url))

        ready = spawn.Event()
        waker = spawn.Process(target=_waker, args=(url, args.wakes, ready, out))
        waker.start()
        ready.wait(60)
        asyncio.run(_wake_enqueues(url, args.wakes))
        wake_delays: list[float] = out.get(timeout=120)
        waker.join()
    finally:
        asyncio.run(drop_prefix(prefix, args.url))

    claimed = [eid for r in results for eid in r["ids"]]
    latencies = [lat for r in results for lat in r["latencies"]]
    claim_wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    figures = {
        "items": args.items,
        "shards": args.shards,
        "tiers": args.tiers,
        "claimers": args.claimers,
        "per_shard_calls": args.per_shard_calls,
        "batch": args.batch,
        "enqueue_per_s": args.items / enqueue["seconds"],
        "enqueue_batch_p99_ms": enqueue["batch_p99"] * 1e3,
        "claim_per_s": len(claimed) / claim_wall,
        "claim_p50_ms": statistics.median(latencies) * 1e3,
        "claim_p99_ms": _quantile(latencies, 0.99) * 1e3,
        "claim_max_ms": max(latencies) * 1e3,
        "claims": len(latencies),
        "claimed_per_claimer": [len(r["ids"]) for r in results],
        "claimer_cpu_s": [round(r["cpu"], 2) for r in results],
        "wake_p50_ms": statistics.median(wake_delays) * 1e3,
        "wake_p99_ms": _quantile(wake_delays, 0.99) * 1e3,
        "redis_cpu_enqueue_s": loaded["cpu"] - before["cpu"],
        "redis_cpu_claim_s": after["cpu"] - loaded["cpu"],
        "redis_bytes_per_item": (loaded["memory"] - before["memory"]) / args.items,
        "lost": args.items - len(set(claimed)),
        "duplicated": len(claimed) - len(set(claimed)),
    }
    for name, value in figures.items():
        shown = f"{value:,.1f}" if isinstance(value, float) else str(value)
        print(f"{name:24} {shown}")
    print("BENCH_JSON " + json.dumps(figures))
    if figures["lost"] or figures["duplicated"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
