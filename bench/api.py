"""Benchmark of the REST API on the embedded node: ``POST /jobs`` and ``GET /jobs/{id}``.

Starts ``onbeat up --app bench.api:app`` (a subprocess: REST API, scheduler and workers in one
process, as users run it) on a temporary SQLite file and a free port, waits for its
"onbeat API:" line, then runs two phases, each driven by ``--concurrency`` workers that share one
count of ``--requests`` requests (and stop at ``--max-seconds`` whatever the count); each worker
has its own ``httpx.AsyncClient``, so one keep-alive connection:

- ``POST /jobs``: submit a job of a no-op task (``--schedule now``: it runs at once, so the node's
  scheduler and worker are busy too; ``--schedule cron``: planned for next New Year, so only
  the API and the store work).
- ``GET /jobs/{id}``: read a random job submitted by the first phase (definition, next fire
  times and its recent executions).

``--warmup`` requests of each kind come first and are not counted. Latency is measured in the
load generator, from just before the request is sent to the end of its response; the load
generator is one Python process, so a figure that grows with ``--concurrency`` while req/s stays
flat is queueing (look at the node's CPU share in the table). Prints a table and one
``BENCH_JSON {...}`` line with all figures.

Examples::

    .venv/bin/python bench/api.py                              # 5,000 each, concurrency 32
    .venv/bin/python bench/api.py --schedule cron --concurrency 8 --requests 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import queue
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from onbeat import App, TaskContext

REPO = Path(__file__).resolve().parents[1]
TASK_NAME = "bench.noop"
CRON_FAR = "0 0 1 1 *"

# The app the node serves (``onbeat up --app bench.api:app``): one no-op task.
app = App()


@app.task(name=TASK_NAME, max_attempts=1)
async def noop(ctx: TaskContext) -> None:
    return None


# --- the node -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class NodeProcess:
    """``onbeat up`` on ``database_url`` and a free port, until :meth:`stop`."""

    def __init__(self, database_url: str, log: Path, timeout: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO), "ONBEAT_LOG_LEVEL": "WARNING"}
        command = [sys.executable, "-m", "onbeat", "up", "--app", "bench.api:app"]
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), "--database-url", database_url],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
            )
        lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, args=(lines,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(f"onbeat up did not start; see {log}:\n{log.read_text()}")
            if line.startswith("onbeat API:"):
                return

    def _pump(self, lines: queue.Queue[str | None]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.put(line)
        lines.put(None)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the node so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


# --- load ---------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    node_cpu: float = 0.0
    client_cpu: float = 0.0


Request = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


async def drive(
    clients: Sequence[httpx.AsyncClient],
    request: Request,
    expected: int,
    count: int,
    max_seconds: float,
    phase: Phase | None,
) -> None:
    """``count`` requests, one worker per client (stopping at ``max_seconds``); each latency and
    each unexpected status go into ``phase`` (none: a warm-up)."""
    issued = 0
    deadline = time.perf_counter() + max_seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < count and time.perf_counter() < deadline:
            issued += 1
            outcome: str | None
            t0 = time.perf_counter()
            try:
                response = await request(client)
                outcome = None if response.status_code == expected else str(response.status_code)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            elapsed = time.perf_counter() - t0
            if phase is not None:
                phase.latencies.append(elapsed)
                if outcome is not None:
                    phase.errors[outcome] = phase.errors.get(outcome, 0) + 1

    await asyncio.gather(*(worker(client) for client in clients))


async def run_phase(
    node: NodeProcess,
    clients: Sequence[httpx.AsyncClient],
    name: str,
    request: Request,
    expected: int,
    args: argparse.Namespace,
) -> Phase:
    """A warm-up (its connections stay open), then the measured requests."""
    await drive(clients, request, expected, args.warmup, args.max_seconds, None)
    phase = Phase(name)
    cpu0, node_cpu0, t0 = process_cpu(), node.cpu_seconds(), time.perf_counter()
    await drive(clients, request, expected, args.requests, args.max_seconds, phase)
    phase.seconds = time.perf_counter() - t0
    phase.client_cpu, phase.node_cpu = process_cpu() - cpu0, node.cpu_seconds() - node_cpu0
    return phase


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def figures(phase: Phase, concurrency: int) -> dict[str, Any]:
    lat = sorted(phase.latencies)
    ms = {f"p{q}_ms": round(percentile(lat, q) * 1e3, 2) for q in (50, 90, 99)}
    return {
        "phase": phase.name,
        "requests": len(lat),
        "errors": dict(phase.errors),
        "concurrency": concurrency,
        "seconds": round(phase.seconds, 3),
        "requests_per_second": round(len(lat) / phase.seconds, 1) if phase.seconds else None,
        **ms,
        "max_ms": round(lat[-1] * 1e3, 2) if lat else None,
        "node_cpu_share": round(phase.node_cpu / phase.seconds, 2) if phase.seconds else None,
        "client_cpu_share": round(phase.client_cpu / phase.seconds, 2) if phase.seconds else None,
    }


def print_table(results: Sequence[dict[str, Any]]) -> None:
    headers = ["PHASE", "REQUESTS", "ERRORS", "CONC", "SECONDS", "REQ/S"]
    headers += ["P50 MS", "P90 MS", "P99 MS", "MAX MS", "NODE CPU", "CLIENT CPU"]
    rows = [
        [
            r["phase"],
            str(r["requests"]),
            str(sum(r["errors"].values())),
            str(r["concurrency"]),
            f"{r['seconds']:.2f}",
            f"{r['requests_per_second']:.0f}",
            *(f"{r[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
            f"{r['node_cpu_share']:.0%}",
            f"{r['client_cpu_share']:.0%}",
        ]
        for r in results
    ]
    widths = [max(len(x) for x in column) for column in zip(headers, *rows, strict=True)]
    for line in [headers, *rows]:
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )


# --- main ---------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=5000, help="Per phase (default 5000).")
    parser.add_argument("--concurrency", type=int, default=32, help="Workers (default 32).")
    parser.add_argument("--warmup", type=int, default=200, help="Uncounted requests per phase.")
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="Bound on each phase (default 120)."
    )
    parser.add_argument(
        "--schedule",
        choices=["now", "cron"],
        default="now",
        help="now: each job runs at once (the default); cron: planned for next New Year.",
    )
    parser.add_argument("--keep-db", action="store_true", help="Keep the SQLite file.")
    return parser.parse_args(argv)


async def bench(node: NodeProcess, args: argparse.Namespace) -> list[dict[str, Any]]:
    schedule = (
        {"type": "now"} if args.schedule == "now" else {"type": "cron", "expression": CRON_FAR}
    )
    body = {"task": TASK_NAME, "params": {"n": 1}, "schedule": schedule}
    ids: list[str] = []

    async def post(client: httpx.AsyncClient) -> httpx.Response:
        response = await client.post("/jobs", json=body)
        if response.status_code == 201:
            ids.append(response.json()["id"])
        return response

    async def get(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get(f"/jobs/{random.choice(ids)}")

    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=f"{node.url}/api/v1", timeout=60)
            )
            for _ in range(args.concurrency)
        ]
        posted = await run_phase(node, clients, "POST /jobs", post, 201, args)
        if not ids:
            raise RuntimeError(f"no job was created: {posted.errors}")
        read = await run_phase(node, clients, "GET /jobs/{id}", get, 200, args)
    return [figures(posted, args.concurrency), figures(read, args.concurrency)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tmp = Path(tempfile.mkdtemp(prefix="onbeat-bench-api-"))
    try:
        node = NodeProcess(f"sqlite:///{tmp / 'onbeat.db'}", tmp / "node.log")
        try:
            results = asyncio.run(bench(node, args))
        finally:
            node.stop()
    finally:
        if args.keep_db:
            print(f"database kept: {tmp / 'onbeat.db'}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"onbeat REST API on the embedded node (SQLite, schedule={args.schedule}), "
        f"{args.requests} requests per phase, {args.concurrency} concurrent connections, "
        f"{args.warmup} warm-up; Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print_table(results)
    summary = {
        "benchmark": "api",
        "schedule": args.schedule,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "results": results,
    }
    print("BENCH_JSON " + json.dumps(summary, sort_keys=True))
    failed = [r["phase"] for r in results if r["errors"]]
    if failed:
        print(f"FAILED: unexpected responses in {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
