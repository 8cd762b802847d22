"""W5, the REST API: ``POST /jobs``, ``GET /jobs/{id}`` and the bulk create ``POST /jobs/batch``.

Modes (``--mode``), the servers in ``bench/api_servers.py``:

- ``embedded`` (the default): ``onbeat up --app bench.api:app`` (REST API, scheduler and workers
  in one process, as users run it) on a temporary SQLite file and a free port.
- ``distributed``: ``onbeat migrate`` on a fresh schema of the local PostgreSQL, the bench's
  tasks published to its catalog as a worker would, then ``--api-processes`` (1) ``onbeat api``
  processes on free ports (one process serves one event loop: add processes, not threads, for
  more cores; the connections are spread over them, as a load balancer would), plus a scheduler
  and a worker on the table queue only with ``--schedule now``.

Phases (``--phases``, in this order), each driven by ``--concurrency`` workers that share one
count of requests (and stop at ``--max-seconds`` whatever the count); each worker has its own
``httpx.AsyncClient``, so one keep-alive connection:

- ``post``: ``--requests`` ``POST /jobs`` of a no-op task (``--schedule now``: it runs at once,
  so the node's scheduler and worker are busy too; ``--schedule cron``: planned for next New
  Year, so only the API and the store work).
- ``get``: ``--requests`` ``GET /jobs/{id}`` of a random job the ``post`` phase created
  (definition, next fire times and its recent executions).
- ``bulk``: ``--bulk-requests`` ``POST /jobs/batch`` of ``--batch-size`` jobs each; jobs/s is
  requests/s times the batch size, latency is per request.

Warm-up requests come first and are not counted (``--warmup``; ``--bulk-warmup`` for ``bulk``).
Latency is measured in the load generator, from just before the request is sent to the end of
its response; the load generator is one Python process on the same 2 cores (about 0.75 of a core
at 450 creates/s: ``--load wrk`` drives ``post`` and ``get`` with ``wrk`` instead, at 2-3 % of a
core, ``bench/api_wrk.py``), so a figure that grows with ``--concurrency`` while req/s stays flat
is queueing (look at the servers' CPU share
in the table: each process's, and, distributed, its PostgreSQL backends'). Prints a table and
one ``BENCH_JSON {...}`` line with all figures.

Examples::

    .venv/bin/python bench/api.py                              # 5,000 each, concurrency 32
    .venv/bin/python bench/api.py --schedule cron --concurrency 8 --requests 2000
    .venv/bin/python bench/api.py --mode distributed --schedule cron --api-processes 2
    .venv/bin/python bench/api.py --mode distributed --schedule cron --phases post,get --load wrk
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench import api_wrk  # noqa: E402
from onbeat import App, TaskContext  # noqa: E402

if TYPE_CHECKING:  # not at run time: the node imports this module for its app
    from bench.api_servers import Servers

TASK_NAME = "bench.noop"
CRON_FAR = "0 0 1 1 *"
PHASES = ("post", "get", "bulk")

# The app the node serves (``onbeat up --app bench.api:app``): one no-op task.
app = App()


@app.task(name=TASK_NAME, max_attempts=1)
async def noop(ctx: TaskContext, n: int = 0) -> None:
    """``n``: the parameter every job of this bench carries (it is ignored)."""
    return None


# --- load ---------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    jobs_per_request: int = 1
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    server_cpu: dict[str, float] = field(default_factory=dict)
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
                outcome = None if response.status_code == expected else problem_of(response)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            elapsed = time.perf_counter() - t0
            if phase is not None:
                phase.latencies.append(elapsed)
                if outcome is not None:
                    phase.errors[outcome] = phase.errors.get(outcome, 0) + 1

    await asyncio.gather(*(worker(client) for client in clients))


def problem_of(response: httpx.Response) -> str:
    """An unexpected answer, as its status, problem type and the start of its detail."""
    try:
        body = response.json()
        kind = str(body.get("type", "")).rsplit("/", 1)[-1]
        detail = str(body.get("detail", ""))[:100]
    except (ValueError, AttributeError):
        return str(response.status_code)
    return f"{response.status_code} {kind}: {detail}"


async def run_phase(
    servers: Servers,
    clients: Sequence[httpx.AsyncClient],
    phase: Phase,
    request: Request,
    expected: int,
    counts: tuple[int, int],
    max_seconds: float,
) -> Phase:
    """``counts``: a warm-up (its connections stay open), then the measured requests."""
    warmup, requests = counts
    await drive(clients, request, expected, warmup, max_seconds, None)
    servers.mark()
    cpu0, t0 = process_cpu(), time.perf_counter()
    await drive(clients, request, expected, requests, max_seconds, phase)
    phase.seconds = time.perf_counter() - t0
    phase.client_cpu, phase.server_cpu = process_cpu() - cpu0, servers.cpu()
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
    lat, secs = sorted(phase.latencies), phase.seconds
    ms = {f"p{q}_ms": round(percentile(lat, q) * 1e3, 2) for q in (50, 90, 99)}
    return {
        "phase": phase.name,
        "requests": len(lat),
        "jobs_per_request": phase.jobs_per_request,
        "errors": dict(phase.errors),
        "concurrency": concurrency,
        "seconds": round(secs, 3),
        "requests_per_second": round(len(lat) / secs, 1) if secs else None,
        "jobs_per_second": round(len(lat) * phase.jobs_per_request / secs) if secs else None,
        **ms,
        "max_ms": round(lat[-1] * 1e3, 2) if lat else None,
        "server_cpu_share": round(sum(phase.server_cpu.values()) / secs, 2) if secs else None,
        "server_cpu_share_by_process": {
            name: round(cpu / secs, 3) for name, cpu in sorted(phase.server_cpu.items())
        }
        if secs
        else {},
        "client_cpu_share": round(phase.client_cpu / secs, 2) if secs else None,
    }


def print_table(results: Sequence[dict[str, Any]]) -> None:
    headers = ["PHASE", "REQUESTS", "ERRORS", "CONC", "SECONDS", "REQ/S", "JOBS/S"]
    headers += ["P50 MS", "P90 MS", "P99 MS", "MAX MS", "SERVER CPU", "CLIENT CPU"]
    rows = [
        [
            r["phase"],
            str(r["requests"]),
            str(sum(r["errors"].values())),
            str(r["concurrency"]),
            f"{r['seconds']:.2f}",
            f"{r['requests_per_second']:.0f}",
            f"{r['jobs_per_second']:.0f}",
            *(f"{r[k]:.1f}" for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")),
            f"{r['server_cpu_share']:.0%}",
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
    for r in results:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in r["server_cpu_share_by_process"].items())
        print(f"  {r['phase']}: server CPU share by process: {shares}")


# --- main ---------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mode", choices=["embedded", "distributed"], default="embedded")
    parser.add_argument(
        "--api-processes", type=int, default=1, help="distributed: onbeat api processes (1)"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"Comma-separated, of {', '.join(PHASES)}."
    )
    parser.add_argument("--requests", type=int, default=5000, help="post, get (default 5000).")
    parser.add_argument("--bulk-requests", type=int, default=100, help="bulk (default 100).")
    parser.add_argument("--batch-size", type=int, default=1000, help="Jobs per bulk request.")
    parser.add_argument("--concurrency", type=int, default=32, help="Workers (default 32).")
    parser.add_argument("--warmup", type=int, default=200, help="Uncounted post, get requests.")
    parser.add_argument("--bulk-warmup", type=int, default=4, help="Uncounted bulk requests.")
    parser.add_argument(
        "--max-seconds", type=float, default=120.0, help="Bound on each phase (default 120)."
    )
    parser.add_argument(
        "--schedule",
        choices=["now", "cron"],
        default="now",
        help="now: each job runs at once (the default); cron: planned for next New Year.",
    )
    parser.add_argument(
        "--load",
        choices=["httpx", "wrk"],
        default="httpx",
        help="post, get: the load generator. httpx (the default): --requests requests from this "
        "Python process; wrk: `wrk` for --seconds (bench/api_wrk.py; costs the box a few per "
        "cent of the CPU httpx does, so the figure is the server's).",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="wrk: each phase's length.")
    parser.add_argument("--keep-db", action="store_true", help="embedded: keep the SQLite file.")
    args = parser.parse_args(argv)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := set(args.phases) - set(PHASES):
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    if "get" in args.phases and "post" not in args.phases:
        parser.error("the get phase reads the jobs the post phase creates: name post too")
    if args.load == "wrk" and not api_wrk.available():
        parser.error("--load wrk: no `wrk` on PATH (apt-get install wrk)")
    return args


async def bench(servers: Servers, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """The phases' figures, and the dead letters once they are done: runs (of jobs due now)
    whose no-op task failed, which would make the figures those of failure handling."""
    schedule = (
        {"type": "now"} if args.schedule == "now" else {"type": "cron", "expression": CRON_FAR}
    )
    body = {"task": TASK_NAME, "params": {"n": 1}, "schedule": schedule}
    batch = json.dumps({"jobs": [body] * args.batch_size}).encode()  # encoded once, not per call
    ids: list[str] = []

    async def post(client: httpx.AsyncClient) -> httpx.Response:
        response = await client.post("/jobs", json=body)
        if response.status_code == 201:
            ids.append(response.json()["id"])
        return response

    async def get(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get(f"/jobs/{random.choice(ids)}")

    async def bulk(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(
            "/jobs/batch", content=batch, headers={"Content-Type": "application/json"}
        )

    plans: dict[str, tuple[Phase, Request, tuple[int, int]]] = {
        "post": (Phase("POST /jobs"), post, (args.warmup, args.requests)),
        "get": (Phase("GET /jobs/{id}"), get, (args.warmup, args.requests)),
        "bulk": (
            Phase(f"POST /jobs/batch ({args.batch_size})", args.batch_size),
            bulk,
            (args.bulk_warmup, args.bulk_requests),
        ),
    }
    results = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=f"{servers.urls[i % len(servers.urls)]}/api/v1", timeout=120
                )
            )
            for i in range(args.concurrency)
        ]
        for name in (p for p in PHASES if p in args.phases):
            phase, request, counts = plans[name]
            if args.load == "wrk" and name != "bulk":
                paths = [] if name == "post" else await job_paths(clients[0])
                results.append(wrk_phase(servers, phase.name, body, paths, args))
                continue
            await run_phase(
                servers,
                clients,
                phase,
                request,
                201 if name != "get" else 200,
                counts,
                args.max_seconds,
            )
            if name == "post" and not ids:
                raise RuntimeError(f"no job was created: {phase.errors}")
            results.append(figures(phase, args.concurrency))
        dead = await clients[0].get("/dead-letters", params={"limit": 100})
        dead.raise_for_status()
    return results, len(dead.json()["items"])


async def job_paths(client: httpx.AsyncClient, most: int = 5000) -> list[str]:
    """Paths of up to ``most`` stored jobs, for a wrk GET phase (wrk keeps no ids)."""
    paths: list[str] = []
    cursor = None
    while len(paths) < most:
        params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/jobs", params=params)).json()
        paths += [f"/api/v1/jobs/{job['id']}" for job in page["items"]]
        if not (cursor := page.get("next_cursor")):
            break
    if not paths:
        raise RuntimeError("no job to get: the post phase created none")
    return paths


def wrk_phase(
    servers: Servers, name: str, body: dict[str, Any], paths: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """A post (``paths`` empty) or get phase driven by wrk: a one-second warm-up, then
    ``args.seconds`` measured."""
    load = {
        "method": "GET" if paths else "POST",
        "path": "/api/v1/jobs",
        "body": None if paths else json.dumps(body),
        "paths": paths,
        "connections": args.concurrency,
    }
    api_wrk.run_wrk(servers.urls, seconds=1, **load)
    servers.mark()
    run = api_wrk.run_wrk(servers.urls, seconds=args.seconds, **load)
    server_cpu, secs = servers.cpu(), run.seconds
    errors = {"non-2xx": run.non_2xx, "socket": run.socket_errors}
    return {
        "phase": name,
        "load": "wrk",
        "requests": run.requests,
        "jobs_per_request": 1,
        "errors": {k: v for k, v in errors.items() if v},
        "concurrency": args.concurrency,
        "seconds": round(secs, 3),
        "requests_per_second": round(run.requests / secs, 1),
        "jobs_per_second": round(run.requests / secs),
        **{f"{k}_ms": round(v, 2) for k, v in run.percentiles_ms.items()},
        "server_cpu_share": round(sum(server_cpu.values()) / secs, 2),
        "server_cpu_share_by_process": {
            k: round(v / secs, 3) for k, v in sorted(server_cpu.items())
        },
        "client_cpu_share": round(run.client_cpu / secs, 2),
    }


def start_servers(args: argparse.Namespace, tmp: Path) -> Servers:
    from bench.api_servers import ApiFleet, NodeProcess

    if args.mode == "embedded":
        return NodeProcess(f"sqlite:///{tmp / 'onbeat.db'}", tmp / "node.log")
    return ApiFleet(tmp, args.api_processes, with_worker=args.schedule == "now")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tmp = Path(tempfile.mkdtemp(prefix="onbeat-bench-api-"))
    load_before = os.getloadavg()
    try:
        servers = start_servers(args, tmp)
        try:
            results, dead_letters = asyncio.run(bench(servers, args))
        finally:
            servers.stop()
    finally:
        if args.keep_db and args.mode == "embedded":
            print(f"database kept: {tmp / 'onbeat.db'}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    where = (
        "the embedded node (SQLite)"
        if args.mode == "embedded"
        else f"{args.api_processes} onbeat api process(es) (PostgreSQL)"
    )
    print(
        f"onbeat REST API on {where}, schedule={args.schedule}, {args.requests} requests per "
        f"phase ({args.bulk_requests} of {args.batch_size} jobs in bulk), {args.concurrency} "
        f"concurrent connections; Python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    print_table(results)
    summary = {
        "benchmark": "api",
        "mode": args.mode,
        "api_processes": args.api_processes if args.mode == "distributed" else None,
        "schedule": args.schedule,
        "requests": args.requests,
        "bulk_requests": args.bulk_requests,
        "batch_size": args.batch_size,
        "concurrency": args.concurrency,
        "load": args.load,
        "warmup": args.warmup,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "results": results,
        "dead_letters": dead_letters,
    }
    print("BENCH_JSON " + json.dumps(summary, sort_keys=True))
    failed = [r["phase"] for r in results if r["errors"]]
    if failed:
        print(f"FAILED: unexpected responses in {failed}", file=sys.stderr)
        return 1
    if dead_letters:
        print(f"FAILED: {dead_letters} runs dead-lettered (the task failed)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
