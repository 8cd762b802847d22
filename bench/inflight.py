"""W4, runs in flight: ``--runs`` (10,000) runs that each sleep ``--sleep`` (60 s, an
``asyncio.sleep``), submitted together while the processes idle, all running at once under the
global cap (``ONBEAT_MAX_IN_FLIGHT``, ``--max-in-flight``, default: the run count).

Modes (``--mode``):

- ``distributed``: 1 ``onbeat scheduler`` + ``--workers`` (2) ``onbeat worker`` processes on a
  fresh schema of the local PostgreSQL, each worker at ``--concurrency`` (default: its share of
  the runs), the queue ``--queue`` (redis: a private ``redis-server``; or table). The fleet is
  ``bench/fleet.py``'s.
- ``embedded``: one ``onbeat up`` process (scheduler, worker, API) on a temporary SQLite file,
  ``--concurrency`` default: the run count.

The task (``bench.sleep`` in ``bench/fleet_app.py``) writes a start line, then sleeps. Measured:
time from submission to the last start (all running), how many the store says are running then,
the resident memory (VmRSS) of every process before submission and once all are running, and
its growth per run in flight; CPU seconds of every process (and, distributed, the fleet's
PostgreSQL backends) while reaching that, and per second while holding them (lease renewals:
``ONBEAT_HEARTBEAT_INTERVAL``, 10 s) until the first run ends; then that every run succeeded,
none lost or started twice.

Examples::

    .venv/bin/python bench/inflight.py --mode distributed --runs 10000
    .venv/bin/python bench/inflight.py --mode embedded --runs 2000 --sleep 30

Prints a table and one ``BENCH_JSON {...}`` line; exits 1 if a run was lost, duplicated, not
started or did not succeed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.api_servers import free_port  # noqa: E402
from bench.fleet import (  # noqa: E402
    APP,
    SERVER,
    SUBMIT_BATCH,
    Fleet,
    bench_app,
    environment,
    stop_all,
)
from bench.fleet_measure import CpuMonitor, PgSampler, Starts, proc_rss_kib  # noqa: E402

TASK = "bench.sleep"


class Processes(Protocol):
    """What a phase needs of the processes under test, in either mode."""

    procs: dict[str, subprocess.Popen[bytes]]

    @property
    def database_url(self) -> str: ...
    @property
    def queue_url(self) -> str: ...
    def store_counts(self) -> dict[str, int]: ...
    def stop(self, timeout: float = 30) -> dict[str, int | None]: ...


@dataclass
class EmbeddedNode:
    """``onbeat up`` on a SQLite file in ``workdir``; submissions go through the same file."""

    workdir: Path
    concurrency: int
    extra_env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.workdir / 'onbeat.db'}"

    @property
    def queue_url(self) -> str:
        return "memory://"  # the submitting App's own: it only writes the store

    def start(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
            "ONBEAT_BENCH_STARTS_DIR": str(self.workdir),
            "ONBEAT_LOG_LEVEL": "WARNING",
            **self.extra_env,
        }
        port = free_port()
        with (self.workdir / "node.log").open("ab") as out:
            self.procs["node"] = subprocess.Popen(
                [sys.executable, "-m", "onbeat", "up", "--app", APP, "--port", str(port),
                 "--database-url", self.database_url, "--concurrency", str(self.concurrency)],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait_up(self, timeout: float = 60) -> None:
        wait_for_line(self.procs["node"], self.workdir / "node.log", "onbeat API:", timeout)

    def store_counts(self) -> dict[str, int]:
        with contextlib.closing(sqlite3.connect(self.workdir / "onbeat.db", timeout=30)) as conn:
            rows = conn.execute("SELECT status, count(*) FROM executions GROUP BY status")
            return {str(status): int(n) for status, n in rows}

    def stop(self, timeout: float = 30) -> dict[str, int | None]:
        return stop_all(self.procs, timeout)


def wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{log.stem} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)


# --- the phase ------------------------------------------------------------------------------------
def rss_kib(procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, int | None]:
    return {name: proc_rss_kib(proc.pid) for name, proc in procs.items()}


def running_in_store(under_test: Processes) -> int | None:
    return under_test.store_counts().get("running")


def sample_now(monitor: CpuMonitor) -> None:
    """The monitor's figures up to now (its thread samples every half second)."""
    with psycopg.connect(SERVER, autocommit=True) as conn:
        monitor.sample(conn)


def cpu_report(monitor: CpuMonitor, embedded: bool) -> dict[str, Any]:
    """CPU seconds per group; embedded, PostgreSQL's background (the shared server's) is left out."""
    sample_now(monitor)
    report = monitor.report()
    if embedded:
        report.pop("postgres_background", None)
    return report


def hold(under_test: Processes, monitor: CpuMonitor, args: argparse.Namespace) -> dict[str, Any]:
    """Submit, wait until every run started, measure memory, hold, wait until all succeeded."""
    n, embedded = args.runs, args.mode == "embedded"
    starts = Starts(Path(args.workdir))
    baseline = rss_kib(under_test.procs)
    app = bench_app(under_test.database_url, under_test.queue_url)
    monitor.mark()
    submitted_at = time.time()
    for first in range(0, n, SUBMIT_BATCH):
        size = min(SUBMIT_BATCH, n - first)
        app.submit_many([app.prepare(TASK, {"seconds": args.sleep}) for _ in range(size)])
    submit_s = time.time() - submitted_at
    app.close()
    all_started = starts.wait_for(n, submitted_at + args.sleep + args.timeout)
    reached_at = time.time()
    in_flight = rss_kib(under_test.procs)
    running = running_in_store(under_test)
    ramp_cpu = cpu_report(monitor, embedded)
    figures = starts.figures(n)
    first, last = figures["first_start"], figures["last_start"]
    # Holding: from now until the first run ends (it started at `first`).
    hold_s = (first + args.sleep - reached_at - 0.5) if first else 0.0
    hold_figures: dict[str, Any] = {"hold_s": None}
    if all_started and hold_s >= 1.0:
        sampler = PgSampler(SERVER, args.pg_app_names) if args.pg_sample else None
        if sampler is not None:
            sampler.start()
        monitor.mark()
        time.sleep(hold_s)
        held_cpu = cpu_report(monitor, embedded)
        hold_figures = {
            "hold_s": round(hold_s, 2),
            "hold_cpu_per_s": {g: round(v["cpu_s"] / hold_s, 4) for g, v in held_cpu.items()},
            "hold_rss_kib": rss_kib(under_test.procs),
        }
        if sampler is not None:
            sampler.stop()
            hold_figures["hold_pg_statements"] = sampler.report()
    deadline = (first or submitted_at) + args.sleep + args.timeout
    store: dict[str, int] = {}
    while time.time() < deadline:
        store = under_test.store_counts()
        if store.get("succeeded", 0) >= n:
            break
        time.sleep(0.5)
    starts.read()
    figures = starts.figures(n)
    growth = {
        name: (in_flight[name] or 0) - (baseline[name] or 0)
        for name in under_test.procs
        if baseline[name] is not None and in_flight[name] is not None
    }
    workers = [name for name in growth if name.startswith(("worker", "node"))]
    return {
        "runs": n,
        "sleep_s": args.sleep,
        "submit_s": round(submit_s, 2),
        "all_running_after_submit_s": round(last - submitted_at, 2) if last else None,
        "all_running_after_submit_end_s": (
            round(last - submitted_at - submit_s, 2) if last else None
        ),
        "all_at_once": bool(first and last and last < first + args.sleep),
        "running_in_store_when_all_started": running,
        "timed_out": not all_started or store.get("succeeded", 0) < n,
        "rss_before_kib": baseline,
        "rss_all_running_kib": in_flight,
        "rss_growth_kib": growth,
        "worker_kib_per_run_in_flight": round(sum(growth[w] for w in workers) / n, 2),
        "ramp_cpu": ramp_cpu,
        **hold_figures,
        "store": store,
        **figures,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"onbeat-inflight-{args.mode}-"))
    args.workdir = str(workdir)
    cap = {"ONBEAT_MAX_IN_FLIGHT": str(args.max_in_flight or args.runs)}
    load_before = os.getloadavg()
    under_test: EmbeddedNode | Fleet
    if args.mode == "embedded":
        if args.pg_sample:
            raise SystemExit("--pg-sample: the embedded node has no PostgreSQL")
        node = EmbeddedNode(workdir, args.concurrency or args.runs, cap)
        monitor = CpuMonitor(SERVER, [])
        under_test = node
        try:
            node.start()
            monitor.add(node.procs["node"].pid, "node", "node")
            monitor.start()
            node.wait_up()
            time.sleep(args.warmup)
            figures = hold(node, monitor, args)
            figures["exit_statuses"] = node.stop()
        finally:
            monitor.stop()
            node.stop()
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    else:
        args.concurrency = args.concurrency or -(-args.runs // args.workers)
        fleet = Fleet(args.queue, workdir, args, extra_env=cap)
        under_test = fleet
        fleet.open()
        monitor = CpuMonitor(SERVER, fleet.pg_app_names)
        args.pg_app_names = fleet.pg_app_names
        try:
            if fleet.redis is not None:
                monitor.add(fleet.redis.pid, "redis-server", "redis")
            fleet.start_all()
            for name, proc in fleet.procs.items():
                monitor.add(proc.pid, name, name)
            monitor.start()
            fleet.wait_up()
            time.sleep(args.warmup)
            figures = hold(fleet, monitor, args)
            figures["exit_statuses"] = fleet.stop()
        finally:
            monitor.stop()
            fleet.close()
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return {
        "mode": args.mode,
        "queue": args.queue if args.mode == "distributed" else "memory",
        "workers": args.workers if args.mode == "distributed" else 1,
        "concurrency": args.concurrency or args.runs,
        "max_in_flight": int(cap["ONBEAT_MAX_IN_FLIGHT"]),
        "processes": sorted(under_test.procs),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
    }


# --- output ---------------------------------------------------------------------------------------
def print_table(result: dict[str, Any]) -> None:
    f = result["figures"]
    print(f"\n== W4 in flight, {result['mode']} (queue {result['queue']}), {f['runs']} runs "
          f"sleeping {f['sleep_s']} s, concurrency {result['concurrency']} per worker, "
          f"global cap {result['max_in_flight']} ==")  # fmt: skip
    rows = [
        ("runs / started / lost / duplicated", f"{f['runs']} / {f['started']} / {f['lost']} / "
         f"{f['duplicated']}"),
        ("submission (submit_many)", f"{f['submit_s']} s"),
        ("submission began / ended -> last start", f"{f['all_running_after_submit_s']} / "
         f"{f['all_running_after_submit_end_s']} s"),
        ("all running at once / store says running", f"{f['all_at_once']} / "
         f"{f['running_in_store_when_all_started']}"),
        ("worker RSS growth per run in flight", f"{f['worker_kib_per_run_in_flight']} KiB"),
        ("held for", f"{f['hold_s']} s"),
        ("store at the end", str(f["store"])),
    ]  # fmt: skip
    for label, value in rows:
        print(f"  {label:<44} {value}")
    print("  RSS MiB before -> all running (growth KiB per run):")
    for name, before in f["rss_before_kib"].items():
        after, growth = f["rss_all_running_kib"].get(name), f["rss_growth_kib"].get(name)
        per_run = f"{growth / f['runs']:.2f}" if growth is not None else "?"
        print(
            f"    {name:<12} {(before or 0) / 1024:8.1f} -> {(after or 0) / 1024:8.1f}  ({per_run})"
        )
    print("  CPU s reaching all running: " + ", ".join(
        f"{g} {v['cpu_s']}" for g, v in sorted(f["ramp_cpu"].items())
    ))  # fmt: skip
    if f.get("hold_cpu_per_s"):
        print("  CPU s per second holding: " + ", ".join(
            f"{g} {v}" for g, v in sorted(f["hold_cpu_per_s"].items())
        ))  # fmt: skip
    if f.get("hold_pg_statements"):
        pg = f["hold_pg_statements"]
        print(
            f"  PostgreSQL while holding: {pg['busy_backends']} backends busy on average; by statement:"
        )
        for name, share in pg["by_statement_and_wait"].items():
            print(f"    {name:<60} {share:>6}")
    print(f"  load average before {result['loadavg_before']}, after {result['loadavg_after']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mode", choices=["distributed", "embedded"], default="distributed")
    p.add_argument("--runs", type=int, default=10_000, help="runs held in flight together")
    p.add_argument("--sleep", type=float, default=60.0, help="seconds each run sleeps")
    p.add_argument("--queue", choices=["redis", "table"], default="redis", help="distributed")
    p.add_argument("--workers", type=int, default=2, help="distributed: worker processes")
    p.add_argument("--concurrency", type=int, help="per worker (default: its share of --runs)")
    p.add_argument("--claim-batch", type=int, help="worker --claim-batch (default: Settings)")
    p.add_argument("--max-in-flight", type=int, help="global cap (default: --runs)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds the processes idle first")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds past --sleep to give up")
    p.add_argument(
        "--pg-sample",
        action="store_true",
        help="distributed: sample the fleet's statements in pg_stat_activity while holding",
    )
    p.add_argument("--keep", action="store_true", help="keep the schema and the work directory")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"running W4 in flight, {args.mode}, {args.runs} runs ...", flush=True)
    result = run(args)
    print_table(result)
    print("BENCH_JSON " + json.dumps(
        {"bench": "inflight", "env": environment(), "result": result}, sort_keys=True
    ), flush=True)  # fmt: skip
    f = result["figures"]
    return 1 if f["lost"] or f["duplicated"] or f["timed_out"] else 0


if __name__ == "__main__":
    sys.exit(main())
