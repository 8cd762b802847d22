"""Benchmark of the embedded node: SQLite store + in-process delay queue, one process.

Three phases, each in a fresh process by default (so peak RSS and CPU time are per phase):

- ``throughput``: N ``now`` jobs of a no-op task are submitted with ``app.schedule`` before the node
  starts (that is the submission rate), then a ``Node`` (scheduler + worker, as ``onbeat up`` runs
  them) is started and timed until every run is recorded ``succeeded``.
- ``burst``: with the node running, N one-shot jobs are submitted for the same second T
  (``--burst-lead``, 15 s ahead); each run records its start delay (``time.time()`` at start minus
  its ``scheduled_for``). Reports p50/p99/max delay, the time until all had started and how many
  runs were lost (checked in the database at the end: must be 0).
- ``cron`` (only when named: it takes minutes): ``--cron-jobs`` (100,000) every-minute cron jobs are
  submitted (through a second ``App``, the node running), then the ``--minutes`` (3) minute
  boundaries after the submission are measured, each on its own. Per boundary: start delay
  p50/p99/max from the fire time, how many started within 5 s and 60 s, lost (fire times with
  no record at all) and duplicated (an execution started twice).

All also report CPU time, peak RSS, event-loop lag and the time spent in the node's store calls
(``--sql-stats``: per SQL statement). See bench/README.md for figures and the analysis.

Examples::

    .venv/bin/python bench/embedded.py                   # both phases, async no-op task
    .venv/bin/python bench/embedded.py --sync            # both phases, sync no-op (thread pool)
    .venv/bin/python bench/embedded.py --phase burst --burst 10000 --concurrency 256
    .venv/bin/python bench/embedded.py --phase cron --cron-jobs 100000 --minutes 3

Settings are onbeat's defaults (``ONBEAT_*`` environment variables apply) unless a flag overrides
them. The SQLite file lives in a temporary directory that is removed afterwards (``--keep-db``).
Every run prints a table and one ``BENCH_JSON {...}`` line with all figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onbeat import App, TaskContext
from onbeat.cli.fleet import event_loop_factory, tune_gc
from onbeat.node import Node

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

PHASES = ("throughput", "burst")
"""What ``--phase all`` runs; ``cron`` (several minutes) runs only when asked for."""
EVERY_MINUTE = "* * * * *"
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


STORE_OPS = (
    "execution_dispatch",
    "execution_claim",
    "execution_finish_many",
    "execution_heartbeat",
    "execution_sweep",
    "execution_reap",
    "shard_acquire",
)


class StoreTimer:
    """Wraps the node's hot store methods (on the instance) to total their calls, time and rows.

    The time is measured in the calling thread (the node calls the store through
    ``asyncio.to_thread``), so it includes waiting for the store's lock and for the GIL: calls that
    overlap (a claim waiting while a flush writes) can add up to more than the wall time. The
    share of wall time the store's one connection lock was *held* is the serialised part.
    """

    def __init__(self, store: Any) -> None:
        self.calls: dict[str, int] = dict.fromkeys(STORE_OPS, 0)
        self.seconds: dict[str, float] = dict.fromkeys(STORE_OPS, 0.0)
        self.rows: dict[str, int] = dict.fromkeys(STORE_OPS, 0)
        self._lock = threading.Lock()
        for name in STORE_OPS:
            setattr(store, name, self._wrap(name, getattr(store, name)))
        # SQLiteStore serialises every call on one connection lock: time how long it is held.
        self.store_lock = (
            HeldTimer(store._lock) if isinstance(getattr(store, "_lock", None), _LOCK) else None
        )
        if self.store_lock is not None:
            store._lock = self.store_lock

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
            rows = len(result.started) if hasattr(result, "started") else _len(result)
            with self._lock:
                self.calls[name] += 1
                self.seconds[name] += elapsed
                self.rows[name] += rows
            return result

        return timed

    def reset(self) -> None:
        with self._lock:
            for name in STORE_OPS:
                self.calls[name], self.seconds[name], self.rows[name] = 0, 0.0, 0
        if self.store_lock is not None:
            self.store_lock.held = 0.0

    def report(self, wall: float) -> dict[str, Any]:
        """Per store operation: calls, rows, ms per call, us per row, share of ``wall``."""
        out: dict[str, Any] = {}
        for name in STORE_OPS:
            calls, secs, rows = self.calls[name], self.seconds[name], self.rows[name]
            if not calls:
                continue
            out[name.removeprefix("execution_")] = {
                "calls": calls,
                "rows": rows,
                "ms_per_call": round(secs / calls * 1e3, 2),
                "us_per_row": round(secs / rows * 1e6, 1) if rows else None,
                "share_of_wall": round(secs / wall, 3) if wall > 0 else None,
            }
        out["calls_share_of_wall"] = round(sum(self.seconds.values()) / wall, 3) if wall else None
        if self.store_lock is not None:
            out["lock_held_share_of_wall"] = round(self.store_lock.held / wall, 3) if wall else None
        return out


_LOCK = type(threading.Lock())


class HeldTimer:
    """A stand-in for a ``threading.Lock`` used as a context manager; totals the time held."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._since = 0.0
        self.held = 0.0

    def __enter__(self) -> HeldTimer:
        self._lock.acquire()
        self._since = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.held += time.perf_counter() - self._since
        self._lock.release()


def _len(result: Any) -> int:
    try:
        return len(result)
    except TypeError:
        return 0


class SqlTimer:
    """``--sql-stats``: times every statement the SQLite store executes, by its name in the
    store's query file. A benchmark-only hack: it swaps the store's private connection for a
    proxy, so it needs ``SQLiteStore`` and costs a few microseconds per statement."""

    def __init__(self, store: Any) -> None:
        from onbeat.store import sqlite as sqlite_store

        self.names = {sql: name for name, sql in sqlite_store.Q.items()}
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._conn = store._conn
        store._conn = self

    def execute(self, sql: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._conn.execute(sql, *args)
        finally:
            self._count(sql, time.perf_counter() - t0)

    def executemany(self, sql: str, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._conn.executemany(sql, *args)
        finally:
            self._count(sql, time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _count(self, sql: str, elapsed: float) -> None:
        # Every call happens under the store's lock: no lock of our own is needed.
        name = self.names.get(sql) or " ".join(sql.split()[:3])
        self.calls[name] = self.calls.get(name, 0) + 1
        self.seconds[name] = self.seconds.get(name, 0.0) + elapsed

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()

    def report(self, executions: int) -> dict[str, Any]:
        """Per statement: calls, us per call, us per execution; biggest total first. The time is
        that of ``execute()`` (for RETURNING and SELECT, rows fetched later are not in it)."""
        per = max(executions, 1)
        ordered = sorted(self.seconds, key=lambda k: -self.seconds[k])
        out: dict[str, Any] = {
            name: {
                "calls": self.calls[name],
                "us_per_call": round(self.seconds[name] / self.calls[name] * 1e6, 1),
                "us_per_exec": round(self.seconds[name] / per * 1e6, 1),
            }
            for name in ordered
        }
        out["_total_us_per_exec"] = round(sum(self.seconds.values()) / per * 1e6, 1)
        out["_statements_per_exec"] = round(sum(self.calls.values()) / per, 2)
        return out


class LoopMonitor:
    """Samples the event loop's lateness (a 5 ms sleep that overslept) while running."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self.watch: list[tuple[Callable[[], bool], list[float]]] = []
        """(condition, out): the first monotonic time ``condition()`` was seen true goes to out."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval)
            now = time.perf_counter()
            self.lags.append(now - t0 - self.interval)
            for condition, out in self.watch:
                if not out and condition():
                    out.append(time.time())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def report(self) -> dict[str, Any]:
        lags = sorted(self.lags)
        return {
            "loop_lag_p50_ms": round(percentile(lags, 50) * 1e3, 2),
            "loop_lag_p99_ms": round(percentile(lags, 99) * 1e3, 2),
            "loop_lag_max_ms": round(lags[-1] * 1e3, 2) if lags else None,
        }


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
def outcome_figures(
    n: int, task_calls: int, counts: dict[str, int], timed_out: bool, node: Node
) -> dict[str, Any]:
    """What happened to the ``n`` runs of a phase: the database's account and the task's own."""
    succeeded = counts.get("succeeded", 0)
    return {
        "task_calls": task_calls,
        "db_succeeded": succeeded,
        "db_other": {k: v for k, v in counts.items() if k != "succeeded"},
        "lost": n - succeeded,
        "duplicates": max(0, task_calls - n),
        "timed_out": timed_out,
        "worker_stats": vars(node.worker.stats),
    }


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

    timer = StoreTimer(app.store)
    sql = SqlTimer(app.store) if args.sql_stats else None
    monitor = LoopMonitor()
    node = Node(app)
    monitor.start()
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
    await monitor.stop()
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
        **outcome_figures(n, counter.count, counts, timed_out or not flushed, node),
        "store": timer.report(wall),
        **({"sql": sql.report(succeeded)} if sql else {}),
        **monitor.report(),
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

    timer = StoreTimer(app.store)
    sql = SqlTimer(app.store) if args.sql_stats else None
    monitor = LoopMonitor()
    dispatched_at: list[float] = []
    node = Node(app)
    monitor.watch.append((lambda: node.scheduler.stats.dispatched >= n, dispatched_at))
    monitor.start()
    runner = asyncio.create_task(node.run())
    await node.scheduler.started.wait()

    # Submit from a thread, as an API handler or a script would: through a second App on the same
    # file (its own connection; the node notices new runs within poll_interval), or with
    # --submit-via node through the node's own App (each submission wakes the scheduler).
    submitter = app
    if args.submit_via == "other":
        submitter = App(app.settings.database_url)
        submitter.registry = app.registry

    def submit_all() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            submitter.schedule(TASK_NAME, at=due)
        return time.perf_counter() - t0

    submit_s = await asyncio.to_thread(submit_all)
    if submitter is not app:
        submitter.close()
    submitted_before_due_s = due.timestamp() - time.time()
    if submitted_before_due_s < 1:
        print(
            f"WARNING: submission ended {submitted_before_due_s:.2f}s before T: raise --burst-lead"
        )

    # The measured part: from T until every run started and its outcome was recorded.
    await asyncio.sleep(max(0.0, due.timestamp() - time.time() - 0.05))
    timer.reset()
    if sql:
        sql.reset()
    monitor.lags.clear()
    cpu0 = cpu_seconds()
    timed_out = False
    try:
        await asyncio.wait_for(counter.done.wait(), timeout=args.timeout)
    except TimeoutError:
        timed_out = True
    flushed = not timed_out and await wait_flushed(node, n, timeout=args.timeout)
    all_succeeded_s = time.time() - due.timestamp()
    cpu = cpu_seconds() - cpu0
    rss_running = current_rss_mib()
    await monitor.stop()
    await stop_node(node, runner)
    counts = db_status_counts(db_path)

    ordered = sorted(delays)
    succeeded = counts.get("succeeded", 0)
    return {
        "runs": n,
        "due_lead_s": args.burst_lead,
        "submit_via": args.submit_via,
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
        "cpu_util": round(cpu / all_succeeded_s, 2),
        **outcome_figures(n, counter.count, counts, timed_out or not flushed, node),
        "scheduler_dispatched": node.scheduler.stats.dispatched,
        "all_dispatched_before_due_s": (
            round(due.timestamp() - dispatched_at[0], 3) if dispatched_at else None
        ),
        "store": timer.report(all_succeeded_s),
        **({"sql": sql.report(succeeded)} if sql else {}),
        **monitor.report(),
        "rss_running_mib": round(rss_running, 1),
    }


# --- phase 3: every-minute cron jobs over minute boundaries ---------------------------------------
async def cron_phase(app: App, db_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``--cron-jobs`` every-minute cron jobs submitted to a running node; then the ``--minutes``
    minute boundaries after the submission ended, when every job fires, are each measured on
    their own: start delay from the fire time, started within 5 s / 60 s, lost, duplicated."""
    n: int = args.cron_jobs
    starts: list[tuple[str, float, float]] = []  # (execution id, fire time, start); atomic append
    last_boundary = Counter(n, asyncio.get_running_loop())
    boundaries: list[float] = []

    def on_run(ctx: TaskContext) -> None:
        fire = ctx.scheduled_for.timestamp()
        starts.append((ctx.execution_id, fire, time.time()))
        if boundaries and fire == boundaries[-1]:
            last_boundary.hit()

    register_noop(app, args.sync, on_run)
    timer = StoreTimer(app.store)
    monitor = LoopMonitor()
    node = Node(app)
    monitor.start()
    cpu0 = cpu_seconds()
    node_started = time.time()
    runner = asyncio.create_task(node.run())
    await node.scheduler.started.wait()

    # Submitted from a thread through a second App on the same file, as a script or an API
    # handler would, while the node runs: every fire time falls while the node is up (jobs
    # created before a boundary that passes during the submission fire there: warm-up).
    submitter = App(app.settings.database_url)
    submitter.registry = app.registry

    def submit_all() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            submitter.schedule(TASK_NAME, cron=EVERY_MINUTE)
        return time.perf_counter() - t0

    submit_s = await asyncio.to_thread(submit_all)
    submitter.close()
    submitted_at = time.time()
    first = (int(submitted_at) // 60 + 1) * 60
    boundaries.extend(float(first + 60 * i) for i in range(args.minutes))
    # Until every run of the last boundary started, or 60 s after it (what "within 60 s" needs).
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(last_boundary.done.wait(), boundaries[-1] + 60 - time.time())
    await wait_flushed(node, len(starts), timeout=30)
    ended = time.time()
    cpu = cpu_seconds() - cpu0
    await monitor.stop()
    node.stop.set()
    done, _ = await asyncio.wait([runner], timeout=60)
    if not done:  # a node that cannot even stop is part of the result, not a crash of the bench
        runner.cancel()

    records = db_fire_time_counts(db_path)
    times_started = start_counts(starts)
    figures = [
        boundary_figures(at, n, starts, records.get(at, {}), times_started) for at in boundaries
    ]
    wall = ended - node_started
    return {
        "jobs": n,
        "minutes": args.minutes,
        "submit_s": round(submit_s, 3),
        "submit_per_s": round(n / submit_s, 1),
        "submitted_before_first_boundary_s": round(first - submitted_at, 3),
        "boundaries": figures,
        "warm_up_runs": sum(1 for _, fire, _ in starts if fire < first),
        "duplicates": sum(b["duplicated"] for b in figures),
        "lost": sum(b["lost"] for b in figures),
        "timed_out": any(b["not_started"] for b in figures),
        "node_stopped_within_60s": bool(done),
        "scheduler_stats": vars(node.scheduler.stats),
        "worker_stats": vars(node.worker.stats),
        "cpu_s": round(cpu, 3),
        "cpu_util": round(cpu / wall, 2),
        "store": timer.report(wall),
        **monitor.report(),
    }


def start_counts(starts: Sequence[tuple[str, float, float]]) -> dict[str, int]:
    """How many times each execution id was started."""
    counts: dict[str, int] = {}
    for eid, _, _ in starts:
        counts[eid] = counts.get(eid, 0) + 1
    return counts


def db_fire_time_counts(db_path: Path) -> dict[float, dict[str, int]]:
    """Per fire time (epoch seconds): executions by status, read after the node stopped."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(
            "SELECT scheduled_for, status, count(*) FROM executions"
            " WHERE trigger = 'schedule' GROUP BY scheduled_for, status"
        ).fetchall()
    finally:
        conn.close()
    out: dict[float, dict[str, int]] = {}
    for fire_us, status, count in rows:
        out.setdefault(fire_us / 1e6, {})[str(status)] = int(count)
    return out


def boundary_figures(
    at: float,
    n: int,
    starts: Sequence[tuple[str, float, float]],
    records: dict[str, int],
    started_times: dict[str, int],
) -> dict[str, Any]:
    """The ``n`` runs of one fire time ``at``: start delays (first start of each execution),
    how many started within 5 s / 60 s, and what the database says of the others."""
    first_start: dict[str, float] = {}
    for eid, fire, start in starts:
        if fire == at and eid not in first_start:
            first_start[eid] = start - at
    delays = sorted(first_start.values())
    return {
        "at": datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S"),
        "expected": n,
        "started": len(delays),
        "delay_p50_s": round(percentile(delays, 50), 3),
        "delay_p99_s": round(percentile(delays, 99), 3),
        "delay_max_s": round(delays[-1], 3) if delays else None,
        "within_5s": sum(1 for d in delays if d <= 5),
        "within_60s": sum(1 for d in delays if d <= 60),
        "not_started": n - len(delays),
        "db": records,
        # No record at all for a fire time: nobody will ever run it, nor say why (a skipped
        # misfire is recorded with its reason, so it is not lost).
        "lost": max(0, n - sum(records.values())),
        "duplicated": sum(1 for eid in first_start if started_times[eid] > 1),
    }


# --- running one phase in this process ------------------------------------------------------------
PHASE_FUNCTIONS = {"throughput": throughput_phase, "burst": burst_phase, "cron": cron_phase}


def run_phase(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="onbeat-bench-"))
    db_path = tmp / "onbeat.db"
    app = make_app(db_path, args)
    try:
        tune_gc(app.settings)  # the event loop and the collector of `onbeat up`
        with asyncio.Runner(loop_factory=event_loop_factory(app.settings)) as runner:
            figures = runner.run(PHASE_FUNCTIONS[phase](app, db_path, args))
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
        (
            "submitted / all dispatched, before T",
            "submitted_before_due_s|all_dispatched_before_due_s",
            "s",
        ),
        ("start delay p50 / p99 / max", "delay_p50_s|delay_p99_s|delay_max_s", "s"),
        ("all started after T", "all_started_s", "s"),
        ("all succeeded after T", "all_succeeded_s", "s"),
        ("start rate during the burst", "started_per_s", "runs/s"),
        ("CPU utilisation (2 cores = 2.0)", "cpu_util", ""),
        ("lost / duplicates", "lost|duplicates", ""),
        ("peak RSS", "peak_rss_mib", "MiB"),
    ],
    "cron": [
        ("submission rate (node running)", "submit_per_s", "jobs/s"),
        ("submitted before the first boundary", "submitted_before_first_boundary_s", "s"),
        ("warm-up runs (fire time before it)", "warm_up_runs", ""),
        ("node stopped within 60 s when asked", "node_stopped_within_60s", ""),
        ("lost / duplicates", "lost|duplicates", ""),
        ("CPU utilisation (2 cores = 2.0)", "cpu_util", ""),
        ("peak RSS", "peak_rss_mib", "MiB"),
    ],
}
BOUNDARY_COLUMNS = (
    ("fire time", "at"),
    ("started", "started"),
    ("p50 s", "delay_p50_s"),
    ("p99 s", "delay_p99_s"),
    ("max s", "delay_max_s"),
    ("<=5 s", "within_5s"),
    ("<=60 s", "within_60s"),
    ("lost", "lost"),
    ("dup", "duplicated"),
)


def print_table(results: Sequence[dict[str, Any]]) -> None:
    print()
    for result in results:
        figures = result["figures"]
        size = figures.get("jobs", figures.get("runs"))
        print(f"== {result['phase']} ({result['task']} no-op, N={size}) ==")
        for label, keys, unit in TABLE_ROWS[result["phase"]]:
            value = " / ".join(str(figures.get(k)) for k in keys.split("|"))
            print(f"  {label:<38} {value:>24} {unit}")
        if "boundaries" in figures:
            print("  " + " ".join(f"{title:>9}" for title, _ in BOUNDARY_COLUMNS))
            for boundary in figures["boundaries"]:
                print("  " + " ".join(f"{boundary[key]!s:>9}" for _, key in BOUNDARY_COLUMNS))
            print(f"  scheduler: {figures['scheduler_stats']}")
        store = figures.get("store", {})
        ops = ", ".join(
            f"{name} {op['us_per_row']}us/row {op['share_of_wall']:.0%}"
            for name, op in store.items()
            if isinstance(op, dict) and op["rows"] and op["share_of_wall"] is not None
        )
        busy = (store.get(k) for k in ("lock_held_share_of_wall", "calls_share_of_wall"))
        print(
            f"  {'store lock held / in store calls':<38} {' / '.join(map(str, busy)):>24} of wall"
        )
        print(f"    {ops}")
        lag = (figures.get(k) for k in ("loop_lag_p50_ms", "loop_lag_p99_ms", "loop_lag_max_ms"))
        print(f"  {'event-loop lag p50 / p99 / max':<38} {' / '.join(map(str, lag)):>24} ms")
        if "sql" in figures:
            sql = figures["sql"]
            print(
                f"  SQL: {sql['_statements_per_exec']} execute calls and "
                f"{sql['_total_us_per_exec']} us per execution; top statements (us/exec, us/call):"
            )
            for name, stat in list(sql.items())[:8]:
                if not name.startswith("_"):
                    print(f"    {name:<34} {stat['us_per_exec']:>8} {stat['us_per_call']:>10}")
        if figures.get("timed_out"):
            print(f"  TIMED OUT; database: {figures.get('db_other', 'see the boundaries')}")
    if results:
        print(f"settings: {json.dumps(results[0]['settings'], sort_keys=True)}")


def environment() -> dict[str, Any]:
    import onbeat

    src = Path(onbeat.__file__).resolve().parent
    return {
        "onbeat": str(src),
        "git": _git(src, "rev-parse", "--short", "HEAD"),
        "src_modified": bool(_git(src, "status", "--porcelain", "--", ".")),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "python_loop_us": python_loop_us(),
        "platform": platform.platform(),
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--phase",
        choices=[*PHASES, "cron", "all"],
        default="all",
        help="all = throughput + burst; cron runs only when named (several minutes)",
    )
    p.add_argument("--sync", action="store_true", help="a sync no-op task (thread pool)")
    p.add_argument("--jobs", type=int, default=20_000, help="throughput: jobs submitted")
    p.add_argument("--burst", type=int, default=10_000, help="burst: runs due at one second")
    p.add_argument(
        "--burst-lead", type=float, default=15.0, help="burst: seconds from node start to T"
    )
    p.add_argument(
        "--cron-jobs", type=int, default=100_000, help="cron: every-minute cron jobs submitted"
    )
    p.add_argument("--minutes", type=int, default=3, help="cron: minute boundaries measured")
    p.add_argument(
        "--submit-via",
        choices=["other", "node"],
        default="other",
        help="burst: submit through a second App (default) or the node's own App",
    )
    p.add_argument("--timeout", type=float, default=150.0, help="give up on a phase after this")
    p.add_argument("--concurrency", type=int, help="Settings.concurrency (default 64)")
    p.add_argument("--claim-batch", type=int, help="Settings.claim_batch (default 256)")
    p.add_argument("--window", type=float, help="Settings.window (default 30 s)")
    p.add_argument("--poll-interval", type=float, help="Settings.poll_interval (default 0.2 s)")
    p.add_argument("--dispatch-batch", type=int, help="Settings.dispatch_batch (default 5000)")
    p.add_argument(
        "--sql-stats", action="store_true", help="time each SQL statement (SQLite store only)"
    )
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
