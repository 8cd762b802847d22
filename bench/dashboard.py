"""Benchmark of the web dashboard on a large store: time to first byte of its pages.

Fills a fresh SQLite store directly (``executemany``, seconds rather than hours) with ``--jobs``
jobs (100,000) and ``--executions`` executions (1,000,000) spread over three tenants and the
last week, ``--last-hour`` of them (7 %: ~20 runs/s) ended in the last hour, one pending run per
active cron job, 40 running, 3 % failed (half of them still dead letters), and one busy job that
fired every second for ``--busy-runs`` (100,000) runs. Then it serves the store's web app (the REST API
and the dashboard, as ``onbeat up`` does, without the scheduler and workers, so that nothing
else competes for the store) with uvicorn on a free port, and times each page with a real HTTP
client: the time to its response headers (the pages are rendered before the first byte goes
out), once cold and ``--repeat`` times warm, for every tenant at once (no API key exists) and
for one tenant (a reader key's session).

    .venv/bin/python bench/dashboard.py                    # 100,000 jobs, 1,000,000 executions
    .venv/bin/python bench/dashboard.py --jobs 10000 --executions 100000 --keep-db /tmp/d.db

Prints a table and one ``BENCH_JSON {...}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from onbeat import App
from onbeat.api import create_app
from onbeat.auth import Role
from onbeat.plan import shard_of
from onbeat.store.rows import to_us
from onbeat.store.sqlite import SQLiteStore

TASKS = [
    f"{area}.{verb}"
    for area in ("report", "billing", "mail", "sync")
    for verb in ("send", "build", "check", "purge", "export")
]
TENANTS = (("default", 0.5), ("acme", 0.3), ("rival", 0.2))
CRONS = ("*/5 * * * *", "0 * * * *", "30 2 * * *", "*/15 * * * *", "0 9 * * MON-FRI")
WORKERS = ("worker-bench-1", "worker-bench-2")
SHARDS = 16
READER_TENANT = "acme"
"""The tenant whose reader key times the pages a second time (its typical job is one of its own)."""
_MIN = 60_000_000  # microseconds


@dataclass(frozen=True)
class Filled:
    """What a page visit needs to know about the data."""

    typical_job: str
    busy_job: str | None
    seconds: float


def fill(
    path: Path,
    *,
    jobs: int,
    executions: int,
    now: datetime,
    tenants: Sequence[tuple[str, float]] = TENANTS,
    last_hour: float = 0.07,
    busy_runs: int = 0,
    running: int = 40,
    failed: float = 0.03,
    seed: int = 1,
) -> Filled:
    """Add ``jobs`` jobs (spread over ``tenants`` by weight) and ``executions`` executions, with
    their attempts, dead letters and job events, to the SQLite store at ``path``, as the engine
    would have written them: ``last_hour`` of the runs ended in the hour before ``now``, the rest
    in the week before; ``failed`` of them failed (half of those are still dead letters)."""
    started = time.perf_counter()
    SQLiteStore(path, shard_count=SHARDS).close()  # the schema, by the store's own migrations
    rng = random.Random(seed)
    now_us = to_us(now)
    week = 7 * 24 * 60 * _MIN
    rows: dict[str, list[dict[str, Any]]] = {t: [] for t in _INSERTS}
    fired: set[tuple[str, int]] = set()

    def job(created_us: int, tenant: str, status: str, expression: str | None) -> dict[str, Any]:
        job_id = _id(created_us, rng)
        row = {
            "id": job_id,
            "tenant": tenant,
            "task": rng.choice(TASKS),
            "params": '{"to": "ops@example.com"}',
            "schedule_kind": "cron" if expression else "once",
            "schedule_expression": expression,
            "schedule_at": None if expression else created_us + _MIN,
            "status": status,
            "next_fire_at": now_us + rng.randrange(1, 60 * _MIN)
            if status in ("active", "paused")
            else None,
            "shard": shard_of(job_id, SHARDS),
            "created_at": created_us,
        }
        rows["jobs"].append(row)
        rows["job_events"].append({**row, "kind": "created"})
        return row

    def run(job: dict[str, Any], fire_us: int, status: str, worker: str | None = None) -> None:
        if (job["id"], fire_us) in fired:  # one run per fire time, as the engine keeps it
            return
        fired.add((job["id"], fire_us))
        run_id = _id(fire_us, rng)
        starts = status in ("running", "succeeded", "failed")
        started_us = fire_us + rng.randrange(1_000, 400_000) if starts else None
        ended = status in ("succeeded", "failed", "skipped")
        finished_us = (started_us or fire_us) + rng.randrange(5_000, 2_000_000) if ended else None
        error = "RuntimeError: upstream timed out" if status == "failed" else None
        rows["executions"].append(
            {
                "id": run_id,
                "job_id": job["id"],
                "shard": job["shard"],
                "scheduled_for": fire_us,
                "status": status,
                "attempt": int(starts),
                "lease_owner": worker,
                "lease_expires_at": now_us + 30_000_000 if worker else None,
                "error": error,
                "reason": "overlapped a run still running" if status == "skipped" else None,
                "started_at": started_us,
                "finished_at": finished_us,
            }
        )
        if starts:
            rows["attempts"].append(
                {
                    "execution_id": run_id,
                    "scheduled_for": fire_us,
                    "worker": worker or rng.choice(WORKERS),
                    "started_at": started_us,
                    "finished_at": finished_us,
                    "outcome": status,
                    "error": error,
                }
            )
        if status == "failed" and rng.random() < 0.5:
            rows["dead_letters"].append(
                {
                    "execution_id": run_id,
                    **job,
                    "error": error,
                    "created_at": finished_us,
                    "scheduled_for": fire_us,
                }
            )

    names, weights = [t for t, _ in tenants], [w for _, w in tenants]
    for created_us in sorted(now_us - rng.randrange(2 * week) for _ in range(jobs)):
        roll = rng.random()
        status = (roll < 0.9 and "active") or (roll < 0.95 and "paused") or "cancelled"
        if roll >= 0.98:
            job(created_us, rng.choices(names, weights)[0], "completed", None)
        else:
            job(created_us, rng.choices(names, weights)[0], status, rng.choice(CRONS))
    active = [j for j in rows["jobs"] if j["status"] == "active"]
    for planned in active:
        run(planned, planned["next_fire_at"], "scheduled")
    for i in range(running):
        run(
            rng.choice(active), now_us - rng.randrange(1, 30) * 1_000_000, "running", WORKERS[i % 2]
        )
    target = max(executions - busy_runs, len(rows["executions"]))
    recent = len(rows["executions"]) + int((target - len(rows["executions"])) * last_hour)
    while len(rows["executions"]) < target:
        chosen = rng.choice(rows["jobs"])
        if len(rows["executions"]) < recent:
            low, high = now_us - 60 * _MIN, now_us - _MIN
        else:
            low, high = max(chosen["created_at"], now_us - week), now_us - 60 * _MIN
        if low >= high:
            continue
        roll = rng.random()
        status = "skipped" if roll < 0.01 else "failed" if roll < 0.01 + failed else "succeeded"
        fire_us = rng.randrange(low, high)
        run(chosen, fire_us - fire_us % _MIN, status)
    busy = None
    if busy_runs:  # a job that fired every second for busy_runs seconds, until now
        owner = READER_TENANT if READER_TENANT in names else names[0]
        busy = job(now_us - (busy_runs + 60) * 1_000_000, owner, "active", "* * * * * *")
        for k in range(busy_runs, 0, -1):
            run(busy, now_us - k * 1_000_000, "succeeded")
    with closing(sqlite3.connect(path)) as db, db:
        for table, insert in _INSERTS.items():
            if table != "executions":
                db.executemany(insert, rows[table])
                continue
            pending = ("scheduled", "queued", "running")  # the hot table; the rest is history
            runs = [r for r in rows[table] if r["status"] in pending]
            db.executemany(insert.format(table="runs"), runs)
            final = [r for r in rows[table] if r["status"] not in pending]
            db.executemany(insert.format(table="execution_history"), final)
        db.execute("INSERT OR REPLACE INTO schedulers VALUES ('scheduler-bench', ?)", (now_us,))
        db.execute(
            "UPDATE shard_leases SET owner = 'scheduler-bench', lease_expires_at = ?, epoch = 1",
            (now_us + 15_000_000,),
        )
    typical = next(
        j["id"]
        for j in sorted(active, key=lambda j: j["tenant"] != READER_TENANT)
        if j["schedule_expression"] == "*/5 * * * *"
    )
    return Filled(typical, busy["id"] if busy else None, time.perf_counter() - started)


_INSERTS = {
    "jobs": "INSERT INTO jobs VALUES (:id, :tenant, :task, :params, :schedule_kind,"
    " :schedule_expression, :schedule_at, 'UTC', 3, 1.0, 300.0, NULL, 'skip', 'run_once', 3600.0,"
    " 0, 0.0, :status, :next_fire_at, :shard, :created_at, :created_at)",
    "job_events": "INSERT INTO job_events VALUES (:id, :created_at, :kind, :schedule_kind,"
    " :schedule_expression, :schedule_at, 'UTC')",
    "executions": "INSERT INTO {table} (id, job_id, shard, trigger, scheduled_for, due_at,"
    " status, attempt, priority, lease_owner, lease_expires_at, fencing_token, last_error,"
    " reason, created_at, started_at, finished_at, queued_at) VALUES (:id, :job_id, :shard,"
    " 'schedule', :scheduled_for, :scheduled_for, :status, :attempt, 0, :lease_owner,"
    " :lease_expires_at, :attempt, :error, :reason, :scheduled_for, :started_at, :finished_at,"
    " CASE WHEN :attempt THEN :scheduled_for END)",
    "attempts": "INSERT INTO attempts VALUES (:execution_id, :scheduled_for, 1, :worker, 1,"
    " :started_at,"
    " :finished_at, :outcome, :error)",
    "dead_letters": "INSERT INTO dead_letters VALUES (:execution_id, :id, :tenant, 1, :error,"
    " :created_at, :scheduled_for)",
}
"""Rows as the engine writes them (columns the pages do not read keep their defaults)."""


def _id(moment_us: int, rng: random.Random) -> str:
    """An id like ``plan.new_id``'s: its creation millisecond, then random bits."""
    return f"{moment_us // 1000:012x}{rng.getrandbits(80):020x}"


# --- timing the pages over HTTP -------------------------------------------------------------------
@contextmanager
def serving(app: App) -> Iterator[str]:
    """The web app of ``app`` on uvicorn, in a thread, until the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(create_app(app), port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def ttfb(client: httpx.Client, path: str) -> float:
    """Seconds from sending the request to its response headers; the page must be a 200."""
    started = time.perf_counter()
    with client.stream("GET", path) as response:
        first_byte = time.perf_counter() - started
        response.read()
    if response.status_code != 200:
        raise RuntimeError(f"GET {path}: {response.status_code}")
    return first_byte


def time_pages(
    base_url: str, paths: dict[str, str], repeat: int, key: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=120) as client:
        if key is not None:
            form = client.get("/login").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', form)
            assert csrf, "no login form"
            client.post("/login", data={"key": key, "csrf": csrf.group(1), "next": "/"})
        for name, path in paths.items():
            cold = ttfb(client, path)
            warm = sorted(ttfb(client, path) for _ in range(repeat))
            out[name] = {
                "path": path,
                "cold_ms": round(cold * 1000, 1),
                "p50_ms": round(statistics.median(warm) * 1000, 1),
                "max_ms": round(warm[-1] * 1000, 1),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--last-hour", type=float, default=0.07)
    parser.add_argument("--busy-runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--keep-db", type=Path, default=None, help="a new file to fill and keep")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="onbeat-dash-") as directory:
        path = args.keep_db or Path(directory) / "onbeat.db"
        now = datetime.now(UTC)
        filled = fill(
            path,
            jobs=args.jobs,
            executions=args.executions,
            now=now,
            last_hour=args.last_hour,
            busy_runs=args.busy_runs,
        )
        app = App(f"sqlite:///{path}")
        with closing(sqlite3.connect(path)) as db:
            counts = {
                t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("jobs", "executions", "attempts", "dead_letters")
            }
        paths = {
            "overview": "/",
            "jobs": "/jobs",
            "jobs: paused": "/jobs?status=paused",
            "jobs: search task": "/jobs?q=billing.exp",
            "jobs: page 2": f"/jobs?after={filled.typical_job}",
            "job: */5 cron": f"/jobs/{filled.typical_job}",
            "dead letters": "/dead-letters",
        }
        if filled.busy_job:
            paths[f"job: every second, {args.busy_runs:,} runs"] = f"/jobs/{filled.busy_job}"
        with serving(app) as base_url:
            every_tenant = time_pages(base_url, paths, args.repeat, key=None)
            _, key = app.create_api_key(READER_TENANT, Role.READER)
            one_tenant = time_pages(base_url, paths, args.repeat, key=key)
        total = ", ".join(f"{n:,} {t}" for t, n in counts.items())
        print(f"filled in {filled.seconds:.1f} s: {total}")
        print(f"time to first byte, ms: cold / warm p50 / warm max ({args.repeat} warm requests)")
        print(f"{'page':<32}{'every tenant (no key)':>26}{f'tenant {READER_TENANT} (reader)':>28}")
        for name in paths:
            cells = [
                f"{t['cold_ms']} / {t['p50_ms']} / {t['max_ms']}"
                for t in (every_tenant[name], one_tenant[name])
            ]
            print(f"{name:<32}{cells[0]:>26}{cells[1]:>28}")
        print(
            "BENCH_JSON "
            + json.dumps(
                {
                    "counts": counts,
                    "fill_seconds": round(filled.seconds, 1),
                    "every_tenant": every_tenant,
                    "one_tenant": one_tenant,
                    "load": os.getloadavg(),
                }
            )
        )
        app.close()


if __name__ == "__main__":
    main()
