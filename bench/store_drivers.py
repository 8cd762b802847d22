"""psycopg 3 against asyncpg on PostgresStore's claim and finish transactions (issue 7, item 1).

One fresh schema on the test server (``ONBEAT_TEST_POSTGRES_URL``) is migrated by opening a
``PostgresStore`` and loaded with ``--runs`` (20,000) queued executions of ``now`` jobs through
``job_create`` and ``execution_dispatch``, then kept as a template. Each variant then starts from
the same rows (copied back, times shifted to now, VACUUM ANALYZE, CHECKPOINT) and:

- claims every run, ``--batch`` (256) ids per transaction, ``--concurrency`` (2) transactions in
  flight (the worker's ``asyncio.to_thread`` calls), in due order;
- finishes them (succeeded), the same batches, the same concurrency.

Variants (``--variants``): ``store`` runs the real ``PostgresStore.execution_claim`` /
``execution_finish_many`` (psycopg sync pool, from threads). The others run the same statements,
with the same parameters, on a driver (``bench/store_drivers_tx.py``): ``psycopg-sync``,
``psycopg-async`` (``AsyncConnection``) or ``asyncpg``, on the statements of queries.sql as they
are (shape ``json``; the ``arrays`` and ``unnest`` shapes of issue 7 were dropped once queries.sql
took up their lessons: see ``bench/store_drivers_tx.py``).

Per phase: runs/s, client CPU (``time.process_time``, every thread) and backend CPU
(``/proc/<pid>/stat`` of the variant's backends, by ``application_name``) per 1,000 runs, batch
p50/p99; ``--repeat`` (3) rounds, order rotated; a table, and every figure in
``<--out>/store_drivers-<time>.json`` (``--out``: bench/results). One ``BENCH_JSON {...}`` line has
the summary and, per variant and round, the runs claimed and finished and, read back from the
schema, the succeeded runs and attempts and completed jobs (a shortfall stops the script).
``--statements`` times each statement per SQL shape; ``--profile`` runs the store's two methods
under cProfile. Figures: bench/README.md.

    .venv/bin/pip install -e '.[bench]'                               # asyncpg
    .venv/bin/python -m bench.store_drivers --random-page-cost 1.1    # ~15 min at 20,000 runs
    .venv/bin/python -m bench.store_drivers --variants store,asyncpg/json --repeat 5
    .venv/bin/python -m bench.store_drivers --statements --stats stale
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import math
import os
import platform
import pstats
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg

from onbeat.schedule import Schedule
from onbeat.store.base import DispatchParams, NewJob
from onbeat.store.postgres import PostgresStore
from onbeat.testing.postgres import TEST_SERVER, fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.store_drivers_tx import (  # noqa: E402
    SHAPES,
    AsyncpgDriver,
    Claimed,
    Driver,
    PsycopgAsyncDriver,
    PsycopgSyncDriver,
    StoreDriver,
)

VARIANTS = ("store", "psycopg-sync/json", "psycopg-async/json", "asyncpg/json")
RESULTS = Path(__file__).parent / "results"
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
TIME_COLUMNS = ("created_at", "scheduled_for", "due_at", "queued_at")
"""Columns of the template's executions moved to the time of each copy (else the runs, queued
minutes earlier, would be misfires by the time a later variant claims them)."""


# --- the database -------------------------------------------------------------------------------
def with_settings(url: str, application_name: str, args: argparse.Namespace) -> str:
    """The schema's URL with our application_name and the server settings to measure."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    options = query.get("options", "").replace("-csynchronous_commit=off", "")
    options += f" -csynchronous_commit={args.synchronous_commit}"
    if args.random_page_cost is not None:
        options += f" -crandom_page_cost={args.random_page_cost}"
    query["options"] = options.strip()
    query["application_name"] = application_name
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def schema_of(url: str) -> str:
    options = dict(parse_qsl(urlsplit(url).query))["options"]
    return next(o.split("=", 1)[1] for o in options.split() if o.startswith("-csearch_path="))


def load_template(url: str, runs: int) -> int:
    """Migrate, create ``runs`` now-jobs and dispatch them (queued); keep the rows as
    ``bench_jobs`` / ``bench_executions``. Returns the load's time (µs) the copies shift from."""
    store = PostgresStore(url, shard_count=16)
    try:
        new = NewJob(task="bench.noop", params={"n": 1}, schedule=Schedule.parse())
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: store.job_create(new), range(runs)))
        leases = store.shard_acquire("bench-scheduler", 600.0)
        while store.execution_dispatch(DispatchParams(leases, 10.0, 60.0, 5000)):
            pass
        loaded_at = int(store.now().timestamp() * 1_000_000)
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        queued = conn.execute("SELECT count(*) FROM executions WHERE status = 'queued'").fetchone()
        assert queued is not None and queued[0] == runs, f"{queued} queued, wanted {runs}"
        conn.execute("CREATE TABLE bench_jobs AS SELECT * FROM jobs")
        conn.execute("CREATE TABLE bench_executions AS SELECT * FROM runs")
    return loaded_at


def restore(url: str, loaded_at: int) -> list[str]:
    """Put the template's rows back, as if queued just now; returns the run ids in due order."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE attempts, dead_letters, job_events, runs, execution_history, jobs CASCADE"
        )
        conn.execute("INSERT INTO jobs SELECT * FROM bench_jobs")
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = 'runs'"
                " ORDER BY ordinal_position"
            )
        ]
        shift = int(time.time() * 1_000_000) - loaded_at
        select = ", ".join(f"{c} + {shift}" if c in TIME_COLUMNS else c for c in columns)
        conn.execute(
            f"INSERT INTO runs ({', '.join(columns)}) SELECT {select} FROM bench_executions"
        )
        conn.execute("VACUUM ANALYZE jobs, runs, attempts")
        conn.execute("CHECKPOINT")
        return [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY due_at, id")]


def check_finished(url: str, runs: int) -> dict[str, int]:
    """The succeeded runs and attempts and the completed jobs in the schema: ``runs`` each."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM executions WHERE status = 'succeeded'),"
            " (SELECT count(*) FROM attempts WHERE outcome = 'succeeded'),"
            " (SELECT count(*) FROM jobs WHERE status = 'completed')"
        ).fetchone()
    assert row == (runs, runs, runs), f"succeeded/attempts/completed {row}, wanted {runs} each"
    return dict(zip(("succeeded", "attempts", "completed"), row, strict=True))


def backend_cpu(monitor: psycopg.Connection[Any], application_name: str) -> dict[int, float]:
    """CPU seconds so far of each backend serving ``application_name``."""
    pids = [
        r[0]
        for r in monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        )
    ]
    cpu = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICK  # utime, stime
    return cpu


# --- one variant --------------------------------------------------------------------------------
def make_driver(variant: str, url: str, concurrency: int) -> Driver:
    if variant == "store":
        return StoreDriver(url, concurrency)
    driver, shape = variant.split("/")
    if driver == "psycopg-sync":
        return PsycopgSyncDriver(url, concurrency, shape)
    if driver == "psycopg-async":
        return PsycopgAsyncDriver(url, concurrency, shape)
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    settings = {"application_name": query["application_name"]}
    for option in query["options"].split():
        key, value = option.removeprefix("-c").split("=", 1)
        settings[key] = value
    return AsyncpgDriver(urlunsplit(parts._replace(query="")), settings, concurrency, shape)


async def timed_phase(
    batches: Sequence[Any],
    work: Callable[[Any], Awaitable[Any]],
    concurrency: int,
    monitor: psycopg.Connection[Any],
    application_name: str,
) -> tuple[dict[str, Any], list[Any]]:
    """Run ``work`` over the batches, ``concurrency`` at a time; its figures and results."""
    results: list[Any] = [None] * len(batches)
    latencies: list[float] = []
    queue = iter(range(len(batches)))

    async def lane() -> None:
        for i in queue:
            start = time.perf_counter()
            results[i] = await work(batches[i])
            latencies.append(time.perf_counter() - start)

    server_before = backend_cpu(monitor, application_name)
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
    server_after = backend_cpu(monitor, application_name)
    server = sum(t - server_before.get(pid, 0.0) for pid, t in server_after.items())
    return {
        "wall_s": wall,
        "client_cpu_s": cpu,
        "server_cpu_s": server,
        "backends": len(server_after),
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
    }, results


async def run_variant(
    variant: str, url: str, loaded_at: int, args: argparse.Namespace
) -> dict[str, Any]:
    ids = restore(url, loaded_at)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    driver = make_driver(variant, with_settings(url, name, args), args.concurrency)
    batches = [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)]
    with psycopg.connect(url, autocommit=True) as monitor:
        await driver.open()
        try:
            claim, claimed = await timed_phase(
                batches, driver.claim, args.concurrency, monitor, name
            )
            started = sum(len(c) for c in claimed)
            assert started == len(ids), f"{variant}: claimed {started} of {len(ids)}"
            if args.stats == "fresh":
                monitor.execute("ANALYZE executions, attempts")
            finish, finished = await timed_phase(
                claimed, driver.finish, args.concurrency, monitor, name
            )
            assert sum(finished) == len(ids), f"{variant}: finished {sum(finished)} of {len(ids)}"
        finally:
            await driver.close()
    counts = {"claimed": started, "finished": sum(finished), **check_finished(url, len(ids))}
    return {
        "variant": variant,
        "runs": len(ids),
        "counts": counts,
        "claim": claim,
        "finish": finish,
    }


# --- report -------------------------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summarise(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per phase: median and range over the rounds; latency percentiles over every batch."""
    out: dict[str, Any] = {}
    for phase in ("claim", "finish"):
        per_round = [
            {
                "runs_per_s": r["runs"] / r[phase]["wall_s"],
                "client_cpu_ms_per_1k": r[phase]["client_cpu_s"] / r["runs"] * 1e6,
                "server_cpu_ms_per_1k": r[phase]["server_cpu_s"] / r["runs"] * 1e6,
            }
            for r in rounds
        ]
        figures: dict[str, Any] = {
            key: {
                "median": statistics.median(x[key] for x in per_round),
                "min": min(x[key] for x in per_round),
                "max": max(x[key] for x in per_round),
            }
            for key in per_round[0]
        }
        latencies = [ms for r in rounds for ms in r[phase]["latencies_ms"]]
        figures["batch_ms"] = {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}
        out[phase] = figures
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    head = (
        f"{'variant':<22}| {'claim runs/s':>19} | {'finish runs/s':>19} |"
        f" {'client CPU ms/1k':>16} | {'server CPU ms/1k':>16} | {'batch p50/p99 ms':>23}"
    )
    lines = [head, "-" * len(head)]
    for variant, s in summary.items():
        c, f = s["claim"], s["finish"]

        def rate(x: dict[str, Any]) -> str:
            r = x["runs_per_s"]
            return f"{r['median']:>6,.0f} [{r['min']:,.0f}-{r['max']:,.0f}]"

        lines.append(
            f"{variant:<22}| {rate(c):>19} | {rate(f):>19} |"
            f" {c['client_cpu_ms_per_1k']['median']:>7.0f} /{f['client_cpu_ms_per_1k']['median']:>5.0f}  |"
            f" {c['server_cpu_ms_per_1k']['median']:>7.0f} /{f['server_cpu_ms_per_1k']['median']:>5.0f}  |"
            f" {c['batch_ms']['p50']:>5.1f}/{c['batch_ms']['p99']:<5.1f} {f['batch_ms']['p50']:>5.1f}/{f['batch_ms']['p99']:<5.1f}"
        )
    lines.append(
        "runs/s: median [min-max] of the rounds; CPU: claim / finish, median; batch: claim"
        " p50/p99, finish p50/p99 over every batch of every round"
    )
    return "\n".join(lines)


def environment(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import psycopg_pool

    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    try:
        import asyncpg

        asyncpg_version = asyncpg.__version__
    except ImportError:
        asyncpg_version = None
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "postgres": server[0] if server else None,
        "psycopg": psycopg.__version__,
        "psycopg_pool": psycopg_pool.__version__,
        "libpq": psycopg.pq.version(),
        "asyncpg": asyncpg_version,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "commit": commit,
        "settings": {k: v for k, v in vars(args).items() if k not in ("variants", "out")},
    }


# --- profile ------------------------------------------------------------------------------------
def profile(url: str, loaded_at: int, args: argparse.Namespace) -> None:
    """The store's two methods in this thread, one batch after another, under cProfile."""
    from onbeat.store.base import Completion

    ids = restore(url, loaded_at)
    store = PostgresStore(with_settings(url, "bench-profile", args), migrate=False)
    batches = [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)]
    claimed: list[Claimed] = []
    try:
        for phase in ("claim", "finish"):
            if phase == "finish" and args.stats == "fresh":
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("ANALYZE executions, attempts")
            profiler = cProfile.Profile()
            started = time.perf_counter()
            profiler.enable()
            if phase == "claim":
                for batch in batches:
                    result = store.execution_claim(batch, "bench-worker", 60.0, 60.0)
                    claimed.append(
                        [(r.execution.id, r.execution.fencing_token) for r in result.started]
                    )
            else:
                for runs in claimed:
                    store.execution_finish_many([Completion(i, t, succeeded=True) for i, t in runs])
            profiler.disable()
            wall = time.perf_counter() - started
            print(f"\n=== {phase}: {len(ids)} runs in {wall:.2f} s (under cProfile) ===")
            path = args.out / f"store_drivers-profile-{phase}.pstats"
            profiler.dump_stats(path)
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(args.top)
            stats.sort_stats("cumulative").print_stats(args.top)
            print(f"(saved {path})")
    finally:
        store.close()
    check_finished(url, len(ids))


# --- statements -----------------------------------------------------------------------------
async def statement_times(url: str, loaded_at: int, args: argparse.Namespace) -> None:
    """Each statement's wall time (client to server and back: mostly the server's work), per
    SQL shape, on psycopg sync connections, one transaction at a time."""
    seconds: dict[str, dict[str, float]] = {}
    for shape in SHAPES:
        ids = restore(url, loaded_at)
        seconds[shape] = {}
        driver = PsycopgSyncDriver(
            with_settings(url, f"bench-{shape}", args), 1, shape, seconds[shape]
        )
        await driver.open()
        try:
            claimed = [
                await driver.claim(ids[i : i + args.batch]) for i in range(0, len(ids), args.batch)
            ]
            if args.stats == "fresh":
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("ANALYZE executions, attempts")
            for runs in claimed:
                await driver.finish(runs)
        finally:
            await driver.close()
        check_finished(url, len(ids))
    names = sorted({name for by_name in seconds.values() for name in by_name})
    print(f"\n{'statement (ms per 1,000 runs)':<34}" + "".join(f"{s:>10}" for s in SHAPES))
    for name in names:
        cells = "".join(
            f"{seconds[s][name] / len(ids) * 1e6:>10.1f}" if name in seconds[s] else f"{'':>10}"
            for s in SHAPES
        )
        print(f"{name:<34}{cells}")


# --- main ---------------------------------------------------------------------------------------
async def measure(url: str, loaded_at: int, args: argparse.Namespace) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    for round_no in range(args.repeat):
        shift = round_no % len(args.variants)
        for variant in args.variants[shift:] + args.variants[:shift]:
            result = await run_variant(variant, url, loaded_at, args)
            rounds[variant].append(result)
            c, f = result["claim"], result["finish"]
            print(
                f"round {round_no + 1} {variant:<22} claim {result['runs'] / c['wall_s']:>7,.0f}/s"
                f"  finish {result['runs'] / f['wall_s']:>7,.0f}/s  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return rounds


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=20_000, help="queued executions to claim and finish")
    p.add_argument("--batch", type=int, default=256, help="runs per transaction (claim_batch)")
    p.add_argument("--concurrency", type=int, default=2, help="transactions in flight")
    p.add_argument("--repeat", type=int, default=3, help="rounds of every variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument(
        "--synchronous-commit",
        default="on",
        choices=("on", "off"),
        help="'on' (the server's default) waits for the WAL flush at every commit",
    )
    p.add_argument(
        "--stats",
        default="fresh",
        choices=("fresh", "stale"),
        help="'fresh': ANALYZE between the claim and the finish phase (untimed), as autovacuum"
        " would after the claims; 'stale': only before the claims, when nothing runs (the"
        " planner then believes no run is running: see bench/README.md)",
    )
    p.add_argument(
        "--random-page-cost",
        type=float,
        default=None,
        help="set on the measured connections (the server's is used otherwise; PostgreSQL's"
        " default 4 makes the planner scan whole tables for batches of 256 ids: 1.1 suits SSDs)",
    )
    p.add_argument("--server", default=TEST_SERVER, help="PostgreSQL server URL")
    p.add_argument("--profile", action="store_true", help="cProfile the store's two methods")
    p.add_argument(
        "--statements",
        action="store_true",
        help="time each statement of the two transactions, per SQL shape (psycopg sync)",
    )
    p.add_argument("--top", type=int, default=25, help="functions listed by --profile")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory the results are saved in")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in args.variants:
        if variant != "store" and ("/" not in variant or variant.split("/")[1] not in SHAPES):
            p.error(f"unknown variant {variant!r}: 'store' or DRIVER/{'|'.join(SHAPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # drop the schema when killed

    with fresh_schema(args.server) as url:
        started = time.perf_counter()
        loaded_at = load_template(url, args.runs)
        print(
            f"loaded {args.runs:,} queued runs in {time.perf_counter() - started:.1f} s", flush=True
        )
        if args.profile:
            profile(url, loaded_at, args)
            return
        if args.statements:
            asyncio.run(statement_times(url, loaded_at, args))
            return
        env = environment(args, url)
        rounds = asyncio.run(measure(url, loaded_at, args))
    summary = {variant: summarise(r) for variant, r in rounds.items()}
    print()
    print(table(summary))
    print(f"load average at the end: {os.getloadavg()}")
    path = args.out / f"store_drivers-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    path.write_text(
        json.dumps({"environment": env, "summary": summary, "rounds": rounds}, indent=1)
    )
    print(f"saved {path}")
    counts = {variant: [r["counts"] for r in rs] for variant, rs in rounds.items()}
    figures = {"bench": "store_drivers", "runs": args.runs, "counts": counts, "summary": summary}
    print("BENCH_JSON " + json.dumps({**figures, "saved": str(path)}))


if __name__ == "__main__":
    main()
