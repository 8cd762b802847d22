"""Redis vs the PostgreSQL table as the delay queue, under the same load: when does Redis pay?

Per queue (``--queues``: ``redis``, ``postgres`` (the table queue), ``failover`` (Redis up,
the table as fallback: what the fleet runs by default) and ``failover-down`` (Redis down
throughout: the path while Redis is out)):

- ``enqueue``: ``--items`` (100,000) ids, all due, three priority tiers, 1,024 shards, in
  batches of 5,000 (the dispatch batch) from one queue object.
- ``claim``: ``--claimers`` (2) processes, each its own queue object, ``claim_due(256)`` until
  empty; every id must come out exactly once.
- ``idle``: ``--idle-workers`` (8) worker loops (``claim_due(256)`` then ``wait(0.2)``: the
  worker's loop with the default ``poll_interval``), each its own queue object, on an empty
  queue for ``--idle-seconds`` (20): the statements each server receives per second (Redis:
  commands, counting those its Lua scripts run; each Redis queue object also runs ``repair()``
  every 10 s, which reads every registered shard).

For each phase, the CPU seconds the servers spent on it: PostgreSQL, the backends of this
benchmark's connections only (found by ``application_name``; other work on the database is not
counted); Redis, a private ``redis-server`` on ``--redis-port`` (18701). Statements: Redis from
``INFO commandstats``; PostgreSQL counted at the driver (one per driver call).

Run::

    .venv/bin/python bench/queue_compare.py
    .venv/bin/python bench/queue_compare.py --items 20000 --queues redis,postgres

Prints a table and one ``BENCH_JSON {...}`` line. Timings on a shared box are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Event as EventType
from typing import Any

import psycopg
import redis
from psycopg import sql

from onbeat.clock import SystemClock
from onbeat.queue import DelayQueue, open_failover_queue, open_queue
from onbeat.queue.base import QueueItem
from onbeat.queue.failover import FailoverDelayQueue
from onbeat.queue.table import TableDelayQueue
from onbeat.testing.postgres import TEST_SERVER

TICK = os.sysconf("SC_CLK_TCK")
DEAD_REDIS = "redis://127.0.0.1:18749/0"
"""Nothing listens there: the primary of ``failover-down``."""


# -- measuring the servers -----------------------------------------------------------------


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each live process has used so far."""
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        used[pid] = (int(fields[11]) + int(fields[12])) / TICK
    return used


def _backends(admin_url: str, app_name: str) -> list[int]:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        ).fetchall()
    return [row[0] for row in rows]


class Servers:
    """The CPU the servers spend between ``mark()`` and ``take()``, and Redis's commands."""

    def __init__(self, admin_url: str, app_name: str, redis_pid: int, redis_url: str) -> None:
        self.admin_url, self.app_name = admin_url, app_name
        self.redis_pid = redis_pid
        self.redis = redis.Redis.from_url(redis_url)
        self._pg: dict[int, float] = {}
        self._redis_cpu = 0.0
        self._redis_calls = 0

    def _redis_commands(self) -> int:
        stats = self.redis.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    def mark(self) -> None:
        self._pg = _cpu_of(_backends(self.admin_url, self.app_name))
        self._redis_cpu = _cpu_of([self.redis_pid])[self.redis_pid]
        self._redis_calls = self._redis_commands()

    def take(self) -> dict[str, float]:
        """Call while the phase's connections are still open (a closed backend is gone)."""
        now = _cpu_of(_backends(self.admin_url, self.app_name))
        pg = sum(used - self._pg.get(pid, 0.0) for pid, used in now.items())
        return {
            "pg_cpu_s": round(pg, 3),
            "redis_cpu_s": round(_cpu_of([self.redis_pid])[self.redis_pid] - self._redis_cpu, 3),
            "redis_commands": self._redis_commands() - self._redis_calls,
        }


# -- the queues ----------------------------------------------------------------------------


def _open(kind: str, urls: dict[str, str]) -> DelayQueue:
    clock = SystemClock()
    if kind == "redis":
        return open_queue(urls["redis"], clock)
    if kind == "postgres":
        return open_queue(urls["table"], clock)
    primary = DEAD_REDIS if kind == "failover-down" else urls["redis"]
    return open_failover_queue(primary, urls["table"], clock)


def _table_of(queue: DelayQueue) -> TableDelayQueue | None:
    if isinstance(queue, TableDelayQueue):
        return queue
    if isinstance(queue, FailoverDelayQueue):
        return queue._fallback
    return None


def _count_statements(queue: DelayQueue, counter: list[int]) -> None:
    """Count the table driver's calls (one statement each) into ``counter[0]``."""
    table = _table_of(queue)
    if table is None:
        return
    driver = table._driver
    for name in ("enqueue", "claim", "remove", "missing", "earliest", "size"):
        method = getattr(driver, name)

        def counted(*args: Any, _method: Callable[..., Any] = method) -> Any:
            counter[0] += 1
            return _method(*args)

        setattr(driver, name, counted)


async def _enqueue(kind: str, urls: dict[str, str], items: int, servers: Servers) -> dict[str, Any]:
    queue = _open(kind, urls)
    await queue.size()  # connected
    due = datetime.now(UTC) - timedelta(seconds=10)
    work = [
        QueueItem(f"b-{i:07d}", due + timedelta(microseconds=i * 97), i % 3, i % 1024)
        for i in range(items)
    ]
    servers.mark()
    started = time.perf_counter()
    for start in range(0, items, 5000):
        await queue.enqueue(work[start : start + 5000])
    elapsed = time.perf_counter() - started
    figures = {"enqueue_per_s": round(items / elapsed), **_prefixed("enqueue", servers.take())}
    await queue.close()
    return figures


def _claimer(
    kind: str, urls: dict[str, str], ready: EventType, go: EventType, close: EventType, out: Any
) -> None:
    async def claim() -> None:
        queue = _open(kind, urls)
        await queue.claim_due(0)
        await queue.size()
        ready.set()
        await asyncio.to_thread(go.wait)
        claimed: list[str] = []
        started = time.perf_counter()
        while got := await queue.claim_due(256):
            claimed += got
        out.put({"claimed": claimed, "started": started, "finished": time.perf_counter()})
        await asyncio.to_thread(close.wait)
        await queue.close()

    asyncio.run(claim())


def _claim(kind: str, urls: dict[str, str], claimers: int, servers: Servers) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    out, go, close = ctx.Queue(), ctx.Event(), ctx.Event()
    readies = [ctx.Event() for _ in range(claimers)]
    procs = [
        ctx.Process(target=_claimer, args=(kind, urls, ready, go, close, out)) for ready in readies
    ]
    for proc in procs:
        proc.start()
    for ready in readies:
        if not ready.wait(60):
            raise SystemExit("a claimer did not start")
    servers.mark()
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    server_use = servers.take()
    close.set()
    for proc in procs:
        proc.join()
    claimed = [eid for r in results for eid in r["claimed"]]
    wall = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return {
        "claim_per_s": round(len(claimed) / wall),
        "claimed": len(claimed),
        "duplicates": len(claimed) - len(set(claimed)),
        **_prefixed("claim", server_use),
    }


async def _idle(
    kind: str, urls: dict[str, str], workers: int, seconds: float, servers: Servers
) -> dict[str, Any]:
    queues = [_open(kind, urls) for _ in range(workers)]
    statements = [0]
    for queue in queues:
        await queue.claim_due(1)
        await queue.wait(0.01)  # subscribed, and a first repair() behind it (Redis)
        _count_statements(queue, statements)
    stop = time.monotonic() + seconds

    async def loop(queue: DelayQueue) -> int:
        claims = 0
        while time.monotonic() < stop:
            await queue.claim_due(256)
            claims += 1
            await queue.wait(min(0.2, max(0.0, stop - time.monotonic())))
        return claims

    servers.mark()
    claims = sum(await asyncio.gather(*(loop(q) for q in queues)))
    use = servers.take()
    for queue in queues:
        await queue.close()
    return {
        "idle_claims_per_s": round(claims / seconds, 1),
        "idle_pg_statements_per_s": round(statements[0] / seconds, 1),
        "idle_redis_commands_per_s": round(use["redis_commands"] / seconds, 1),
        "idle_pg_cpu_s": use["pg_cpu_s"],
        "idle_redis_cpu_s": use["redis_cpu_s"],
    }


def _prefixed(phase: str, figures: dict[str, float]) -> dict[str, float]:
    return {f"{phase}_{key}": value for key, value in figures.items()}


# -- running -------------------------------------------------------------------------------


def _start_redis(port: int, directory: str) -> subprocess.Popen[bytes]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", directory],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return server
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit(f"redis-server on port {port} did not answer")


def run_queue(kind: str, args: argparse.Namespace, redis_pid: int) -> dict[str, Any]:
    table = f"onbeat_queue_bench_{uuid.uuid4().hex[:10]}"
    app_name = f"onbeat-queue:{table}"  # what the table queue's connections call themselves
    sep = "&" if "?" in args.postgres_url else "?"
    redis_base = f"redis://127.0.0.1:{args.redis_port}/0"
    urls = {
        "table": f"{args.postgres_url}{sep}table={table}",
        "redis": f"{redis_base}?prefix=bench-{uuid.uuid4().hex[:8]}",
    }
    servers = Servers(args.postgres_url, app_name, redis_pid, redis_base)
    try:
        figures: dict[str, Any] = {"queue": kind}
        figures |= asyncio.run(_enqueue(kind, urls, args.items, servers))
        figures |= _claim(kind, urls, args.claimers, servers)
        figures |= asyncio.run(_idle(kind, urls, args.idle_workers, args.idle_seconds, servers))
        return figures
    finally:
        with psycopg.connect(args.postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        servers.redis.flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", default="redis,postgres,failover,failover-down")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--idle-workers", type=int, default=8)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--redis-port", type=int, default=18701)
    parser.add_argument("--postgres-url", default=TEST_SERVER)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="onbeat-bench-compare-") as directory:
        server = _start_redis(args.redis_port, directory)
        try:
            rows = [run_queue(kind.strip(), args, server.pid) for kind in args.queues.split(",")]
        finally:
            server.kill()
            server.wait()

    print(
        f"{'queue':<14}{'enq/s':>8}{'pg cpu':>7}{'rd cpu':>7}{'claim/s':>9}{'pg cpu':>7}"
        f"{'rd cpu':>7}  idle: {'pg q/s':>7}{'rd cmd/s':>9}{'pg cpu':>7}{'rd cpu':>7}  dup"
    )
    for r in rows:
        print(
            f"{r['queue']:<14}{r['enqueue_per_s']:>8,}{r['enqueue_pg_cpu_s']:>7.2f}"
            f"{r['enqueue_redis_cpu_s']:>7.2f}{r['claim_per_s']:>9,}{r['claim_pg_cpu_s']:>7.2f}"
            f"{r['claim_redis_cpu_s']:>7.2f}        {r['idle_pg_statements_per_s']:>7.1f}"
            f"{r['idle_redis_commands_per_s']:>9.1f}{r['idle_pg_cpu_s']:>7.2f}"
            f"{r['idle_redis_cpu_s']:>7.2f}  {r['duplicates']:>3}"
        )
    env = {"python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]}
    settings = {k: v for k, v in vars(args).items() if k != "postgres_url"}
    print("BENCH_JSON " + json.dumps({"runs": rows, "env": env, "settings": settings}))
    if any(r["duplicates"] or r["claimed"] != args.items for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
