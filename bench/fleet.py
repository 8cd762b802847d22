"""Benchmark of the distributed fleet: 1 ``onbeat scheduler`` + 2 ``onbeat worker`` processes on
PostgreSQL, with a Redis delay queue (a private ``redis-server`` this script starts and stops) or
the PostgreSQL table queue.

Phases, one per command (``--phase``), each on a fresh schema of the local PostgreSQL (created,
migrated, dropped afterwards):

- ``throughput`` (W1): ``--jobs`` (20,000) ``now`` jobs submitted with ``App.submit_many`` before
  any onbeat process runs; then the scheduler and the workers are started. Drain rate = first
  start -> last start; end to end = processes launched -> the store says all succeeded.
- ``steady``: with the fleet warm, a loader process submits one-shot jobs due ``--lead`` (2 s)
  ahead at ``--rate`` (2,000) runs/s for ``--duration`` (60 s), in batches through
  ``App.submit_many``. Start delay p50/p99/max, runs started more than 1 s late, lost, duplicated.
- ``burst`` (W2): with the fleet warm, ``--burst`` (10,000) one-shot jobs due at one whole second T,
  ``--burst-lead`` (30 s) ahead. Start delay p50/p95/p99/max, early starts, lost, duplicated.
- ``seconds``: with the fleet warm, ``--crons`` (100) every-second cron jobs (``* * * * * *``);
  after ``--settle`` (25 s: the dispatch's window and the claims ahead fill), the runs due
  in the next ``--duration`` seconds: start delays, lost, duplicated, and the fleet's CPU per run
  from then until the fleet stops (the cost of runs whose job's next runs are already queued).

The task (``bench/fleet_app.py``) appends ``execution_id scheduled_for start`` to a file per worker
process with one ``write()``: starts, lost (no start line) and duplicated runs (two lines) come
from those files; the store is checked at the end. Every phase reports the CPU seconds of each
process during the phase (each onbeat process, the loader, the fleet's PostgreSQL backends
together, PostgreSQL's background processes, redis-server), read from ``/proc``, and peak RSS.
``--profile DIR`` records each onbeat process with py-spy (raw, ``bench/pyspy_top.py`` reads it).

Examples::

    .venv/bin/python bench/fleet.py --phase throughput --queue redis
    .venv/bin/python bench/fleet.py --phase steady --queue table --rate 2000 --duration 60
    .venv/bin/python bench/fleet.py --phase burst --queue both
    .venv/bin/python bench/fleet.py --phase seconds --queue redis --crons 100 --duration 40

Prints a table and one ``BENCH_JSON {...}`` line per run; exits 1 if a run was lost, duplicated
or not started in time. See bench/README.md for figures and what limits them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script (and as the loader): import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402
from bench.fleet_measure import (  # noqa: E402
    CpuMonitor,
    PgSampler,
    Starts,
    drain_figures,
    start_figures,
)

APP = "bench.fleet_app:app"
TASK = "bench.noop"
SERVER = os.environ.get("ONBEAT_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
REDIS_PORTS = range(18750, 18800)
SUBMIT_BATCH = 1_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_redis_port() -> int:
    for port in REDIS_PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {REDIS_PORTS}")


# --- the fleet ------------------------------------------------------------------------------------
def stop_all(
    procs: dict[str, subprocess.Popen[bytes]], timeout: float, logs: Path | None = None
) -> dict[str, int | None]:
    """SIGTERM to the living, then each exit status by name (None: it had to be killed). A
    process still alive after ``timeout`` has its threads' stacks appended to its log in
    ``logs`` (``<name>.log``) before it is killed: where its shutdown hung."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    statuses: dict[str, int | None] = {}
    for name, proc in procs.items():
        try:
            statuses[name] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if logs is not None:
                dump_stacks(proc.pid, logs / f"{name}.log")
            proc.kill()
            proc.wait()
            statuses[name] = None
    return statuses


HUNG_STOP = re.compile("did not exit on SIGTERM|the graceful stop is not over")
"""The first line of a hung stop's stacks in a process's log."""


def dump_stacks(pid: int, log: Path) -> None:
    """Append ``py-spy dump`` of every thread of ``pid`` (with its locals) to ``log``."""
    py_spy = Path(sys.executable).parent / "py-spy"
    with log.open("ab") as out:
        out.write(f"--- {pid} did not exit on SIGTERM; its threads:\n".encode())
        out.flush()  # before py-spy writes to the same file
        subprocess.run(
            [str(py_spy), "dump", "--locals", "--pid", str(pid)],
            stdout=out, stderr=subprocess.STDOUT, timeout=30, check=False,
        )  # fmt: skip


@dataclass
class Fleet:
    """A schema, a queue, and the onbeat processes started on them; ``close`` ends them all."""

    queue: str
    workdir: Path
    args: argparse.Namespace
    schema: str = field(default_factory=lambda: f"onbeat_bench_{uuid.uuid4().hex[:10]}")
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Each worker's ``--metrics-port``."""
    redis: subprocess.Popen[bytes] | None = None
    redis_port: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    """More ``ONBEAT_*`` settings for every process (``bench/inflight.py``: the global cap)."""

    @property
    def app_name(self) -> str:
        return self.schema.replace("_", "-")

    @property
    def database_url(self) -> str:
        return self.url_for("bench")

    def url_for(self, role: str) -> str:
        """The schema's URL, its connections named ``<app_name>/<role>`` in pg_stat_activity."""
        options = quote(f"-csearch_path={self.schema}")
        return f"{SERVER}?options={options}&application_name={self.app_name}/{role}"

    @property
    def queue_table(self) -> str:
        return f"q_{self.schema[-10:]}"

    def queue_url_for(self, role: str) -> str:
        if self.queue == "redis":
            return f"redis://127.0.0.1:{self.redis_port}/0"
        return f"{self.url_for(role)}&table={self.queue_table}"

    @property
    def queue_url(self) -> str:
        return self.queue_url_for("bench")

    @property
    def pg_app_names(self) -> list[str]:
        """``LIKE`` patterns of the fleet's connections' application names."""
        return [f"{self.app_name}/%", f"onbeat-queue:{self.queue_table}%"]

    def env(self, role: str = "bench") -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
            "ONBEAT_DATABASE_URL": self.url_for(role),
            "ONBEAT_QUEUE_URL": self.queue_url_for(role),
            "ONBEAT_BENCH_STARTS_DIR": str(self.workdir),
            "ONBEAT_LOG_LEVEL": "WARNING",
            **self.extra_env,
        }

    def open(self) -> None:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')
        compile_sources()
        if self.queue == "redis":
            self.redis_port = free_redis_port()
            with (self.workdir / "redis.log").open("ab") as out:
                self.redis = subprocess.Popen(
                    ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            deadline = time.monotonic() + 10
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.2),
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        done = subprocess.run(
            [sys.executable, "-m", "onbeat", "migrate"],
            cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"onbeat migrate failed: {done.stderr}")

    def start(self, role: str, name: str, flags: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        extra: list[str] = list(flags)
        if role == "worker":
            self.metrics_ports[name] = free_port()
            extra += ["--app", APP, "--metrics-port", str(self.metrics_ports[name])]
            if self.args.concurrency:
                extra += ["--concurrency", str(self.args.concurrency)]
            if self.args.claim_batch:
                extra += ["--claim-batch", str(self.args.claim_batch)]
        with (self.workdir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "onbeat", role, "--no-migrate", *extra],
                cwd=REPO, env=self.env(name), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_all(self) -> None:
        self.start("scheduler", "scheduler")
        for i in range(self.args.workers):
            self.start("worker", f"worker-{i}")

    def wait_up(self, timeout: float = 60) -> None:
        """Until every process printed its banner (its store and queue are open)."""
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            log = self.workdir / f"{name}.log"
            while "onbeat " not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.05)

    def stop(self, timeout: float = 30) -> dict[str, int | None]:
        return stop_all(self.procs, timeout, self.workdir)

    def close(self) -> None:
        self.stop()
        if self.redis is not None and self.redis.poll() is None:
            self.redis.kill()
            self.redis.wait()
        if not self.args.keep:
            with psycopg.connect(SERVER, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def store_counts(self) -> dict[str, int]:
        """Executions by status."""
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM executions GROUP BY status"
            ).fetchall()
        return {str(status): int(n) for status, n in rows}

    def index_reads(self) -> dict[str, Any]:
        """PostgreSQL's counters for the schema's indexes and hot tables: scans and entries read
        per index (a partial index whose dead entries pile up shows as many entries per scan),
        updates (HOT or not), dead tuples and whether autovacuum ran."""
        with psycopg.connect(self.database_url) as conn:
            indexes = conn.execute(
                "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
                " WHERE schemaname = %s AND idx_scan > 0 ORDER BY idx_tup_read DESC LIMIT 8",
                (self.schema,),
            ).fetchall()
            tables = conn.execute(
                "SELECT relname, n_tup_upd, n_tup_hot_upd, n_dead_tup, autovacuum_count"
                " FROM pg_stat_user_tables WHERE schemaname = %s"
                " AND (relname IN ('runs', 'jobs', 'tenant_usage')"
                " OR relname LIKE 'attempts%%' OR relname LIKE 'execution_history%%')"
                " AND n_tup_ins + n_tup_upd + n_tup_del > 0",
                (self.schema,),
            ).fetchall()
        return {
            "indexes": {
                name: {"scans": scans, "read": read, "read_per_scan": round(read / scans)}
                for name, scans, read in indexes
            },
            "tables": {
                name: {"updates": upd, "hot": hot, "dead": dead, "autovacuums": vac}
                for name, upd, hot, dead, vac in tables
            },
        }

    def runs_per_claim(self) -> float | None:
        """Ids the workers' store claims took per claim (their ``onbeat_claim_size_runs``), read
        from each worker's ``/metrics`` while it runs; None from a version without it."""
        taken = claims = 0.0
        for port in self.metrics_ports.values():
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            for name, value in re.findall(
                r"^onbeat_claim_size_runs_(sum|count) (\S+)$", text, re.M
            ):
                if name == "sum":
                    taken += float(value)
                else:
                    claims += float(value)
        return round(taken / claims, 1) if claims else None

    def log_tail(self, lines: int = 10) -> str:
        """The last ``lines`` of each process's log, and all of a hung stop's stacks (written by
        the process itself, see ``onbeat.node.SHUTDOWN_OVERRUN``, or by ``stop_all``)."""
        tails = []
        for name in self.procs:
            log_lines = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
            hung = [i for i, line in enumerate(log_lines) if HUNG_STOP.search(line)]
            first = max(0, hung[0] - lines) if hung else -lines
            tails.append(f"--- {name}: " + "\n".join(log_lines[first:]))
        return "\n".join(tails)


# --- submitting -----------------------------------------------------------------------------------
def bench_app(database_url: str, queue_url: str) -> Any:
    """The workers' App (its task registered here too, so ``prepare`` needs no store read),
    pointed at the fleet's store and queue."""
    from bench.fleet_app import app

    app.settings = app.settings.with_overrides(
        {"database_url": database_url, "queue_url": queue_url, "migrate": False}
    )
    return app


def submit(app: Any, count: int, at: datetime | None) -> float:
    """``count`` jobs (``now``, or once at ``at``) in batches of SUBMIT_BATCH; returns seconds."""
    t0 = time.perf_counter()
    for first in range(0, count, SUBMIT_BATCH):
        n = min(SUBMIT_BATCH, count - first)
        app.submit_many([app.prepare(TASK, at=at) for _ in range(n)])
    return time.perf_counter() - t0


def loader(args: argparse.Namespace) -> int:
    """The steady phase's load, in its own process: every ``tick`` seconds, ``rate * tick``
    once jobs due ``lead`` seconds after the tick. Writes what it did to ``--result-file``."""
    app = bench_app(os.environ["ONBEAT_DATABASE_URL"], os.environ["ONBEAT_QUEUE_URL"])
    tick, per_tick = 0.1, max(1, round(args.rate * 0.1))
    started = time.time()
    ticks = round(args.duration / tick)
    submitted, behind_ticks, worst_lag = 0, 0, 0.0
    for i in range(ticks):
        planned = started + i * tick
        lag = time.time() - planned
        if lag < 0:
            time.sleep(-lag)
        else:
            worst_lag = max(worst_lag, lag)
            behind_ticks += lag > tick
        at = datetime.fromtimestamp(planned + args.lead, UTC)
        app.submit_many([app.prepare(TASK, at=at) for _ in range(per_tick)])
        submitted += per_tick
    took = time.time() - started
    app.close()
    result = {
        "submitted": submitted,
        "seconds": round(took, 2),
        "rate": round(submitted / took, 1),
        "ticks_behind": behind_ticks,
        "worst_lag_s": round(worst_lag, 3),
    }
    Path(args.result_file).write_text(json.dumps(result))
    return 0


def compile_sources() -> None:
    """Byte-compile onbeat and the bench app as an installed package is: with
    PYTHONDONTWRITEBYTECODE set (as in CI), each fleet process would otherwise compile ~65
    modules from source at start, ~0.2 s of CPU counted against the runs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "src"), str(REPO / "bench")],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


# --- phases ---------------------------------------------------------------------------------------
def throughput_phase(fleet: Fleet, monitor: CpuMonitor, starts: Starts) -> dict[str, Any]:
    n = fleet.args.jobs
    app = bench_app(fleet.database_url, fleet.queue_url)
    submit_s = submit(app, n, None)
    app.close()
    launched = time.time()
    fleet.start_all()
    for name, proc in fleet.procs.items():
        monitor.add(proc.pid, name, name)
    monitor.mark()
    all_started = starts.wait_for(n, launched + fleet.args.timeout)
    all_succeeded_at = None
    while time.time() < launched + fleet.args.timeout:
        if fleet.store_counts().get("succeeded", 0) >= n:
            all_succeeded_at = time.time()
            break
        time.sleep(0.2)
    fleet.wait_up()  # a worker the others left nothing to was perhaps still starting
    figures = starts.figures(n)
    return {
        **drain_figures(figures, n, submit_s, launched),
        "end_to_end_per_s": round(n / (all_succeeded_at - launched)) if all_succeeded_at else None,
        "end_to_end_s": round(all_succeeded_at - launched, 2) if all_succeeded_at else None,
        "timed_out": not all_started or all_succeeded_at is None,
        "measured_s": round(time.time() - launched, 2),
        **figures,
    }


def warm_fleet(fleet: Fleet, monitor: CpuMonitor) -> None:
    fleet.start_all()
    for name, proc in fleet.procs.items():
        monitor.add(proc.pid, name, name)
    fleet.wait_up()
    time.sleep(fleet.args.warmup)


def steady_phase(fleet: Fleet, monitor: CpuMonitor, starts: Starts) -> dict[str, Any]:
    args = fleet.args
    warm_fleet(fleet, monitor)
    result_file = fleet.workdir / "loader.json"
    cmd = [sys.executable, __file__, "--loader", "--rate", str(args.rate),
           "--duration", str(args.duration), "--lead", str(args.lead),
           "--result-file", str(result_file)]  # fmt: skip
    monitor.mark()
    began = time.time()
    with (fleet.workdir / "loader.log").open("ab") as out:
        load = subprocess.Popen(
            cmd, cwd=REPO, env=fleet.env("loader"), stdout=out, stderr=subprocess.STDOUT
        )
    monitor.add(load.pid, "loader", "loader")
    load.wait()
    if load.returncode:
        raise RuntimeError((fleet.workdir / "loader.log").read_text()[-3000:])
    loaded: dict[str, Any] = json.loads(result_file.read_text())
    expected = int(loaded["submitted"])
    all_started = starts.wait_for(expected, time.time() + args.lead + 30)
    figures = starts.figures(expected)
    return {
        "runs": expected,
        "rate_asked": args.rate,
        "loader": loaded,
        "timed_out": not all_started,
        "measured_s": round(time.time() - began, 2),
        **figures,
    }


def burst_phase(fleet: Fleet, monitor: CpuMonitor, starts: Starts) -> dict[str, Any]:
    args = fleet.args
    warm_fleet(fleet, monitor)
    monitor.mark()
    began = time.time()
    due = math.ceil(began + args.burst_lead)
    app = bench_app(fleet.database_url, fleet.queue_url)
    submit_s = submit(app, args.burst, datetime.fromtimestamp(due, UTC))
    app.close()
    all_started = starts.wait_for(args.burst, due + 60)
    figures = starts.figures(args.burst)
    last = figures["last_start"]
    return {
        "runs": args.burst,
        "submit_per_s": round(args.burst / submit_s),
        "submitted_before_due_s": round(due - began - submit_s, 2),
        "all_started_after_due_s": round(last - due, 3) if last else None,
        "timed_out": not all_started,
        "measured_s": round(time.time() - began, 2),
        **figures,
    }


def seconds_phase(fleet: Fleet, monitor: CpuMonitor, starts: Starts) -> dict[str, Any]:
    args = fleet.args
    warm_fleet(fleet, monitor)
    app = bench_app(fleet.database_url, fleet.queue_url)
    app.submit_many([app.prepare(TASK, cron="* * * * * *") for _ in range(args.crons)])
    app.close()
    time.sleep(args.settle)
    first = math.ceil(time.time())
    end = first + math.ceil(args.duration)
    monitor.mark()
    expected = args.crons * (end - first)
    time.sleep(max(0.0, end + 5 - time.time()))  # the last second's runs started, and some
    starts.read()
    measured = [run for run in starts.runs if first <= run[1] < end]
    figures = start_figures(measured, expected)
    return {
        "runs": expected,
        "crons": args.crons,
        "timed_out": figures["started"] < expected,
        "measured_s": end - first,
        **figures,
    }


PHASES = {
    "throughput": throughput_phase,
    "steady": steady_phase,
    "burst": burst_phase,
    "seconds": seconds_phase,
}


def run_phase(phase: str, queue: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"onbeat-fleet-{phase}-{queue}-"))
    fleet = Fleet(queue, workdir, args)
    load_before = os.getloadavg()
    fleet.open()
    monitor = CpuMonitor(SERVER, fleet.pg_app_names)
    if fleet.redis is not None:
        monitor.add(fleet.redis.pid, "redis-server", "redis")
    monitor.start()
    sampler = PgSampler(SERVER, fleet.pg_app_names) if args.pg_sample else None
    if sampler is not None:
        sampler.start()
    profilers: list[subprocess.Popen[bytes]] = []
    try:
        if args.profile:
            threading.Thread(target=profile, args=(fleet, args, profilers), daemon=True).start()
        figures = PHASES[phase](fleet, monitor, Starts(workdir))
        figures["runs_per_claim"] = fleet.runs_per_claim()
        for p in profilers:
            p.send_signal(signal.SIGINT)
        with psycopg.connect(SERVER, autocommit=True) as conn:
            monitor.sample(conn)  # the backends end with the fleet: their last figures now
        if sampler is not None:
            sampler.stop()
            figures["pg_statements"] = sampler.report()
        statuses = fleet.stop()
        monitor.stop()
        figures["store"] = fleet.store_counts()
        figures["postgres_reads"] = fleet.index_reads()
        figures["exit_statuses"] = statuses
        figures["cpu"] = monitor.report()
        fleet_cpu = sum(
            v["cpu_s"]
            for k, v in figures["cpu"].items()
            if k not in ("loader", "postgres:loader", "postgres:bench", "postgres_background")
        )
        figures["fleet_cpu_s"] = round(fleet_cpu, 2)
        figures["cpu_us_per_run"] = round(fleet_cpu / figures["runs"] * 1e6)
        if figures["timed_out"] or figures["lost"] or set(statuses.values()) != {0}:
            figures["logs"] = fleet.log_tail()
    finally:
        for p in profilers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)
        monitor.stop()
        fleet.close()
    return {
        "phase": phase,
        "queue": queue,
        "workers": args.workers,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
    }


def profile(
    fleet: Fleet, args: argparse.Namespace, profilers: list[subprocess.Popen[bytes]]
) -> None:
    """py-spy on every onbeat process once it is up (all threads, raw format)."""
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    py_spy = Path(sys.executable).parent / "py-spy"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < args.workers + 1:
        for name, proc in list(fleet.procs.items()):
            if name not in seen:
                seen.add(name)
                path = out / f"{fleet.queue}-{name}.txt"
                profilers.append(subprocess.Popen(
                    [str(py_spy), "record", "--pid", str(proc.pid), "--rate", str(args.profile_rate),
                     "--threads", "--format", "raw", "-o", str(path),
                     *(["--gil"] if args.profile_gil else [])],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip
        time.sleep(0.05)


# --- output ---------------------------------------------------------------------------------------
TABLE_ROWS: dict[str, list[tuple[str, str, str]]] = {
    "throughput": [
        ("submission (submit_many, 1,000 a batch)", "submit_per_s", "jobs/s"),
        ("first start after launch", "first_start_after_launch_s", "s"),
        ("drain, first -> last start", "drain_per_s|drain_s", "runs/s | s"),
        ("end to end, launch -> all succeeded", "end_to_end_per_s|end_to_end_s", "runs/s | s"),
    ],
    "steady": [
        ("asked / loader achieved", "rate_asked|loader.rate", "runs/s"),
        ("start delay p50 / p99 / max", "delay_p50_s|delay_p99_s|delay_max_s", "s"),
        ("runs started > 1 s late", "late_over_1s", ""),
    ],
    "burst": [
        ("submission (submit_many)", "submit_per_s", "jobs/s"),
        (
            "start delay p50 / p95 / p99 / max",
            "delay_p50_s|delay_p95_s|delay_p99_s|delay_max_s",
            "s",
        ),
        ("all started after T", "all_started_after_due_s", "s"),
        ("early", "early", ""),
    ],
    "seconds": [
        ("every-second cron jobs", "crons", ""),
        ("start delay p50 / p99 / max", "delay_p50_s|delay_p99_s|delay_max_s", "s"),
        ("early", "early", ""),
    ],
}
COMMON_ROWS = [
    ("runs / started / lost / duplicated", "runs|started|lost|duplicated", ""),
    ("fleet CPU per run (onbeat + PG + redis)", "cpu_us_per_run", "us"),
    ("runs started per store claim", "runs_per_claim", ""),
]


def _value(figures: dict[str, Any], key: str) -> Any:
    value: Any = figures
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def print_table(result: dict[str, Any]) -> None:
    f = result["figures"]
    print(f"\n== {result['phase']}, queue {result['queue']}, {result['workers']} workers ==")
    for label, keys, unit in TABLE_ROWS[result["phase"]] + COMMON_ROWS:
        value = " / ".join(str(_value(f, k)) for k in keys.split("|"))
        print(f"  {label:<42} {value:>30} {unit}")
    print(f"  {'CPU s (peak RSS MiB)':<42}", end="")
    print(", ".join(
        f"{group} {v['cpu_s']}" + (f" ({v['peak_rss_mib']})" if "peak_rss_mib" in v else "")
        for group, v in sorted(f["cpu"].items())
    ))  # fmt: skip
    print(f"  store: {f['store']}; load average before {result['loadavg_before']}, "
          f"after {result['loadavg_after']}")  # fmt: skip
    reads = f["postgres_reads"]["indexes"]
    print("  index scans / entries read per scan: " + ", ".join(
        f"{name} {v['scans']}/{v['read_per_scan']}" for name, v in list(reads.items())[:5]
    ))  # fmt: skip
    if "pg_statements" in f:
        pg = f["pg_statements"]
        print(f"  PostgreSQL: {pg['busy_backends']} backends busy on average; by statement:")
        for name, share in pg["by_statement_and_wait"].items():
            print(f"    {name:<60} {share:>6}")
    if f.get("logs"):
        print(f["logs"])


def environment() -> dict[str, Any]:
    def git(*a: str) -> str | None:
        done = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip() or None

    with psycopg.connect(SERVER) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    redis_version = (
        subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False)
        .stdout.split(" v=")[-1]
        .split()[0]
    )
    return {
        "git": git("rev-parse", "--short", "HEAD"),
        "src_modified": bool(git("status", "--porcelain", "--", "src")),
        "python": platform.python_version(),
        "postgres": row[0] if row else None,
        "redis": redis_version,
        "cpus": os.cpu_count(),
        "python_loop_us": python_loop_us(),
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--phase", choices=sorted(PHASES), default="throughput")
    p.add_argument("--queue", choices=["redis", "table", "both"], default="both")
    p.add_argument("--workers", type=int, default=2, help="onbeat worker processes")
    p.add_argument("--concurrency", type=int, help="worker --concurrency (default: Settings)")
    p.add_argument("--claim-batch", type=int, help="worker --claim-batch (default: Settings)")
    p.add_argument("--jobs", type=int, default=20_000, help="throughput: runs submitted")
    p.add_argument("--rate", type=float, default=2_000, help="steady: runs/s submitted")
    p.add_argument(
        "--duration", type=float, default=60, help="steady: seconds of load; seconds: measured"
    )
    p.add_argument("--lead", type=float, default=2.0, help="steady: runs due this far ahead")
    p.add_argument("--burst", type=int, default=10_000, help="burst: runs due at one second")
    p.add_argument("--burst-lead", type=float, default=30.0, help="burst: seconds to T")
    p.add_argument("--crons", type=int, default=100, help="seconds: every-second cron jobs")
    p.add_argument("--settle", type=float, default=25.0, help="seconds: seconds before measuring")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds the fleet idles first")
    p.add_argument("--timeout", type=float, default=300.0, help="throughput: give up after")
    p.add_argument("--profile", help="directory for py-spy raw profiles of each onbeat process")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples/s")
    p.add_argument(
        "--profile-gil", action="store_true", help="py-spy: the GIL holder only (Python's CPU)"
    )
    p.add_argument(
        "--pg-sample", action="store_true", help="sample the fleet's statements in pg_stat_activity"
    )
    p.add_argument("--keep", action="store_true", help="keep the schema (not dropped)")
    p.add_argument("--loader", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.loader:
        return loader(args)
    queues = ["redis", "table"] if args.queue == "both" else [args.queue]
    failed = False
    for queue in queues:
        print(f"running {args.phase} with the {queue} queue ...", flush=True)
        result = run_phase(args.phase, queue, args)
        print_table(result)
        f = result["figures"]
        failed |= bool(f["lost"] or f["duplicated"] or f["timed_out"] or f.get("early"))
        summary = {"bench": "fleet", "env": environment(), "result": result}
        print("BENCH_JSON " + json.dumps(summary, sort_keys=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
