"""Benchmark of the embedded node: SQLite store + in-process delay queue, one process.

Two phases, each in a fresh process by default (so peak RSS and CPU time are per phase):

- ``throughput``: N ``now`` jobs of a no-op task are submitted with ``app.schedule`` before the node
  starts (that is the submission rate), then a ``Node`` (scheduler + worker, as ``onbeat up`` runs
  them) is started and timed until every run is recorded ``succeeded``.
- ``burst``: with the node running, N one-shot jobs are submitted for the same second T (a few
  seconds ahead); each run records its start delay (``time.time()`` at start minus its
  ``scheduled_for``). Reports p50/p99/max delay, the time until all had started and how many runs
  were lost (checked in the database at the end: must be 0).

Examples::

    .venv/bin/python bench/embedded.py                   # both phases, async no-op task
    .venv/bin/python bench/embedded.py --sync            # both phases, sync no-op (thread pool)
    .venv/bin/python bench/embedded.py --phase burst --burst 10000 --concurrency 256

Settings are onbeat's defaults (``ONBEAT_*`` environment variables apply) unless a flag overrides
them. The SQLite file lives in a temporary directory that is removed afterwards (``--keep-db``).
Every run prints a table and one ``BENCH_JSON {...}`` line with all figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from onbeat import App, TaskContext
from onbeat.node import Node

PHASES = ("throughput", "burst")
TASK_NAME = "bench.noop"


# --- measuring ------------------------------------------------------------------------------------
def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


class Counter:
    """Counts task runs from the event loop or from task threads; sets ``done`` at ``target``."""

    def __init__(self, target: int, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.count = 0
        self.done = asyncio.Event()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._loop = loop
        self._lock = threading.Lock()

    def hit(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self.count += 1
            if self.first_at is None:
                self.first_at = now
            reached = self.count == self.target
            if reached:
                self.last_at = now
        if reached:
            if threading.current_thread() is threading.main_thread():
                self.done.set()
            else:
                self._loop.call_soon_threadsafe(self.done.set)


# --- the app under test ---------------------------------------------------------------------------
def make_app(db_path: Path, args: argparse.Namespace) -> App:
    overrides: dict[str, Any] = {}
    for name in ("concurrency", "claim_batch", "window", "poll_interval", "dispatch_batch"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    return App(f"sqlite:///{db_path}", **overrides)


def register_noop(app: App, sync: bool, on_run: Callable[[TaskContext], None]) -> None:
    if sync:

        @app.task(name=TASK_NAME)
        def noop_sync(ctx: TaskContext) -> None:
            on_run(ctx)

    else:

        @app.task(name=TASK_NAME)
        async def noop_async(ctx: TaskContext) -> None:
            on_run(ctx)


def db_status_counts(db_path: Path) -> dict[str, int]:
    """Execution count by status, read with a separate connection after the node stopped."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT status, count(*) FROM executions GROUP BY status").fetchall()
        counts = {str(status): int(n) for status, n in rows}
        counts["_attempts"] = int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
        counts["_retried"] = int(
            conn.execute("SELECT count(*) FROM executions WHERE attempt > 1").fetchone()[0]
        )
    finally:
        conn.close()
    return counts


async def wait_flushed(node: Node, target: int, timeout: float) -> bool:
    """Wait until the worker has recorded ``target`` successes (an in-memory counter, not the DB)."""
    deadline = time.perf_counter() + timeout
    while node.worker.stats.succeeded < target:
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def stop_node(node: Node, runner: asyncio.Task[None]) -> None:
    node.stop.set()
    await asyncio.wait_for(runner, timeout=60)


# --- phase 1: throughput --------------------------------------------------------------------------
async def throughput_phase(app: App, db_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    n: int = args.jobs
    counter = Counter(n, asyncio.get_running_loop())
    register_noop(app, args.sync, lambda ctx: counter.hit())

    # Submission: the plain synchronous API, one transaction per job, before the node runs.
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for _ in range(n):
        app.schedule(TASK_NAME)
    submit_s = time.perf_counter() - t0
    submit_cpu = cpu_seconds() - cpu0
    rss_after_submit = current_rss_mib()

    node = Node(app)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    runner = asyncio.create_task(node.run())
    timed_out = False
    try:
        await asyncio.wait_for(counter.done.wait(), timeout=args.timeout)
    except TimeoutError:
        timed_out = True
    flushed = not timed_out and await wait_flushed(node, n, timeout=args.timeout)
    t_done = time.perf_counter()
    cpu = cpu_seconds() - cpu0
    rss_running = current_rss_mib()
    await stop_node(node, runner)
    counts = db_status_counts(db_path)

    wall = t_done - t0
    succeeded = counts.get("succeeded", 0)
    first = (counter.first_at - t0) if counter.first_at is not None else float("nan")
    ran = (counter.last_at - t0) if counter.last_at is not None else float("nan")
    return {
        "jobs": n,
        "submit_s": round(submit_s, 3),
        "submit_per_s": round(n / submit_s, 1),
        "submit_cpu_us_per_job": round(submit_cpu / n * 1e6, 1),
        "first_run_s": round(first, 3),
        "all_ran_s": round(ran, 3),
        "all_succeeded_s": round(wall, 3),
        "exec_per_s": round(succeeded / wall, 1) if flushed else None,
        "cpu_s": round(cpu, 3),
        "cpu_us_per_exec": round(cpu / max(succeeded, 1) * 1e6, 1),
        "cpu_util": round(cpu / wall, 2),
        "task_calls": counter.count,
        "db_succeeded": succeeded,
        "db_other": {k: v for k, v in counts.items() if k != "succeeded"},
        "lost": n - succeeded,
        "duplicates": max(0, counter.count - n),
        "timed_out": timed_out or not flushed,
        "worker_stats": vars(node.worker.stats),
        "rss_after_submit_mib": round(rss_after_submit, 1),
        "rss_running_mib": round(rss_running, 1),
    }


# --- phase 2: burst at one second -----------------------------------------------------------------
async def burst_phase(app: App, db_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    n: int = args.burst
    loop = asyncio.get_running_loop()
    counter = Counter(n, loop)
    delays: list[float] = []  # list.append is atomic: safe from the sync task threads
    start_times: list[float] = []

    def on_run(ctx: TaskContext) -> None:
        now = time.time()
        delays.append(now - ctx.scheduled_for.timestamp())
        start_times.append(now)
        counter.hit()

    register_noop(app, args.sync, on_run)
    # T: a whole second far enough ahead that submission ends first.
    due = datetime.fromtimestamp(int(time.time() + args.burst_lead), UTC)

    node = Node(app)
    runner = asyncio.create_task(node.run())
    await node.scheduler.started.wait()

    # Submit from a thread, as an API handler or script would, through a second App on the same
    # file (its own connection; the node notices the new runs within poll_interval).
    submitter = App(app.settings.database_url)
    submitter.registry = app.registry

    def submit_all() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            submitter.schedule(TASK_NAME, at=due)
        return time.perf_counter() - t0

    cpu0 = cpu_seconds()
    submit_s = await asyncio.to_thread(submit_all)
    submitter.close()
    submitted_before_due_s = due.timestamp() - time.time()

    timed_out = False
    try:
        await asyncio.wait_for(
            counter.done.wait(), timeout=max(1.0, due.timestamp() - time.time()) + args.timeout
        )
    except TimeoutError:
        timed_out = True
    flushed = not timed_out and await wait_flushed(node, n, timeout=args.timeout)
    all_succeeded_s = time.time() - due.timestamp()
    cpu = cpu_seconds() - cpu0
    rss_running = current_rss_mib()
    await stop_node(node, runner)
    counts = db_status_counts(db_path)

    ordered = sorted(delays)
    succeeded = counts.get("succeeded", 0)
    return {
        "runs": n,
        "due_lead_s": args.burst_lead,
        "submit_s": round(submit_s, 3),
        "submit_per_s": round(n / submit_s, 1),
        "submitted_before_due_s": round(submitted_before_due_s, 3),
        "delay_p50_s": round(percentile(ordered, 50), 3),
        "delay_p90_s": round(percentile(ordered, 90), 3),
        "delay_p99_s": round(percentile(ordered, 99), 3),
        "delay_max_s": round(ordered[-1], 3) if ordered else None,
        "delay_min_s": round(ordered[0], 3) if ordered else None,
        "delay_mean_s": round(statistics.fmean(ordered), 3) if ordered else None,
        "all_started_s": round(max(start_times) - due.timestamp(), 3) if start_times else None,
        "all_succeeded_s": round(all_succeeded_s, 3) if flushed else None,
        "started_per_s": (
            round(n / (max(start_times) - min(start_times)), 1)
            if len(start_times) > 1 and max(start_times) > min(start_times)
            else None
        ),
        "cpu_s": round(cpu, 3),
        "task_calls": counter.count,
        "db_succeeded": succeeded,
        "db_other": {k: v for k, v in counts.items() if k != "succeeded"},
        "lost": n - succeeded,
        "duplicates": max(0, counter.count - n),
        "timed_out": timed_out or not flushed,
        "worker_stats": vars(node.worker.stats),
        "scheduler_dispatched": node.scheduler.stats.dispatched,
        "rss_running_mib": round(rss_running, 1),
    }


# --- running one phase in this process ------------------------------------------------------------
def run_phase(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="onbeat-bench-"))
    db_path = tmp / "onbeat.db"
    app = make_app(db_path, args)
    try:
        fn = throughput_phase if phase == "throughput" else burst_phase
        figures = asyncio.run(fn(app, db_path, args))
    finally:
        app.close()
        if args.keep_db:
            print(f"database kept: {db_path}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    figures["peak_rss_mib"] = round(peak_rss_mib(), 1)
    figures["process_cpu_s"] = round(cpu_seconds(), 3)
    return {
        "phase": phase,
        "task": "sync" if args.sync else "async",
        "settings": app.settings.model_dump(
            include={
                "concurrency",
                "claim_batch",
                "window",
                "poll_interval",
                "dispatch_batch",
                "shards",
                "lease_ttl",
                "heartbeat_interval",
            }
        ),
        "figures": figures,
    }


def run_phase_in_child(phase: str, argv: Sequence[str]) -> dict[str, Any]:
    """Run one phase in a fresh interpreter, so its peak RSS and CPU time are its own."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    try:
        cmd = [sys.executable, __file__, *argv, "--phase", phase, "--result-file", str(out)]
        subprocess.run(cmd, check=True)
        result: dict[str, Any] = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return result


# --- output -------------------------------------------------------------------------------------
TABLE_ROWS: dict[str, list[tuple[str, str, str]]] = {
    "throughput": [
        ("submission rate (app.schedule)", "submit_per_s", "jobs/s"),
        ("executions (start -> all succeeded)", "exec_per_s", "exec/s"),
        ("first run after node start", "first_run_s", "s"),
        ("all ran / all succeeded", "all_ran_s|all_succeeded_s", "s"),
        ("CPU per execution", "cpu_us_per_exec", "us"),
        ("CPU utilisation (2 cores = 2.0)", "cpu_util", ""),
        ("lost / duplicates", "lost|duplicates", ""),
        ("peak RSS", "peak_rss_mib", "MiB"),
    ],
    "burst": [
        ("submission rate (node running)", "submit_per_s", "jobs/s"),
        ("submitted ahead of T", "submitted_before_due_s", "s"),
        ("start delay p50 / p99 / max", "delay_p50_s|delay_p99_s|delay_max_s", "s"),
        ("all started after T", "all_started_s", "s"),
        ("all succeeded after T", "all_succeeded_s", "s"),
        ("start rate during the burst", "started_per_s", "runs/s"),
        ("lost / duplicates", "lost|duplicates", ""),
        ("peak RSS", "peak_rss_mib", "MiB"),
    ],
}


def print_table(results: Sequence[dict[str, Any]]) -> None:
    print()
    for result in results:
        figures = result["figures"]
        size = figures.get("jobs", figures.get("runs"))
        print(f"== {result['phase']} ({result['task']} no-op, N={size}) ==")
        for label, keys, unit in TABLE_ROWS[result["phase"]]:
            value = " / ".join(str(figures.get(k)) for k in keys.split("|"))
            print(f"  {label:<38} {value:>24} {unit}")
        if figures.get("timed_out"):
            print(f"  TIMED OUT; database: {figures['db_other']}")
    if results:
        print(f"settings: {json.dumps(results[0]['settings'], sort_keys=True)}")


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--phase", choices=[*PHASES, "all"], default="all")
    p.add_argument("--sync", action="store_true", help="a sync no-op task (thread pool)")
    p.add_argument("--jobs", type=int, default=20_000, help="throughput: jobs submitted")
    p.add_argument("--burst", type=int, default=10_000, help="burst: runs due at one second")
    p.add_argument(
        "--burst-lead", type=float, default=12.0, help="burst: seconds from node start to T"
    )
    p.add_argument("--timeout", type=float, default=150.0, help="give up on a phase after this")
    p.add_argument("--concurrency", type=int, help="Settings.concurrency (default 64)")
    p.add_argument("--claim-batch", type=int, help="Settings.claim_batch (default 256)")
    p.add_argument("--window", type=float, help="Settings.window (default 10 s)")
    p.add_argument("--poll-interval", type=float, help="Settings.poll_interval (default 0.2 s)")
    p.add_argument("--dispatch-batch", type=int, help="Settings.dispatch_batch (default 5000)")
    p.add_argument("--keep-db", action="store_true", help="keep the SQLite file")
    p.add_argument("--in-process", action="store_true", help="run all phases in this process")
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def drop_option(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(raw)
    if args.phase == "all" and not args.in_process:
        forwarded = drop_option(raw, "--phase")
        results = [run_phase_in_child(phase, forwarded) for phase in PHASES]
    else:
        phases = PHASES if args.phase == "all" else (args.phase,)
        results = []
        for phase in phases:
            print(f"running {phase} ({'sync' if args.sync else 'async'} no-op) ...", flush=True)
            results.append(run_phase(phase, args))
        if args.result_file:  # a child of a run of every phase: the parent prints the summary
            Path(args.result_file).write_text(json.dumps(results[0]))
            return 0
    print_table(results)
    summary = {"bench": "embedded", "env": environment(), "results": results}
    print("BENCH_JSON " + json.dumps(summary, sort_keys=True))
    bad = [r["phase"] for r in results if r["figures"]["lost"] or r["figures"]["timed_out"]]
    if bad:
        print(f"FAILED: runs lost or not finished in {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
