"""``POST /jobs/batch``'s work in-process, without HTTP: ``--threads`` threads each parse and
validate a body of ``--batch`` cron jobs (``JobBatch``) and run the route (``create_jobs``:
``App.prepare`` per job, ``App.submit_many``, the answer) on PostgreSQL, as an ``onbeat api``'s
route threads do under load.

    .venv/bin/python bench/bulk_route.py [--threads 8] [--batches 6] [--batch 1000]

Prints the process's CPU per job (``time.process_time``, all threads; not PostgreSQL's) and
jobs/s, with the collector tuned as ``onbeat api`` tunes it (``cli.fleet.tune_gc``), on a fresh
schema of the local ``test`` database."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import psycopg

from onbeat import App, TaskContext
from onbeat.api.auth import Caller
from onbeat.api.routes import jobs as routes
from onbeat.api.schemas import JobBatch
from onbeat.auth import Role
from onbeat.cli.fleet import tune_gc
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WARMUP = 3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--threads", type=int, default=8, help="threads running the route at once")
    p.add_argument("--batches", type=int, default=6, help="batches per thread")
    p.add_argument("--batch", type=int, default=1000, help="jobs per batch")
    args = p.parse_args()
    job = {"task": "bench.noop", "params": {"n": 1}}
    job["schedule"] = {"type": "cron", "expression": "0 0 1 1 *"}
    raw = json.dumps({"jobs": [job] * args.batch}).encode()
    with fresh_schema() as url:
        app = App(database_url=url)

        @app.task(name="bench.noop")
        async def noop(ctx: TaskContext) -> None: ...

        caller = Caller(tenant=None, role=Role.ADMIN, key_id=None)

        def one() -> None:
            routes.create_jobs(JobBatch.model_validate(json.loads(raw)), app, caller, None)

        def loop() -> None:
            for _ in range(args.batches):
                one()

        for _ in range(WARMUP):
            one()
        tune_gc(app.settings)
        threads = [threading.Thread(target=loop) for _ in range(args.threads)]
        cpu, wall = time.process_time(), time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        app.close()
        with psycopg.connect(url) as conn:
            stored = conn.execute("SELECT count(*) FROM jobs").fetchone()
    jobs = args.threads * args.batches * args.batch
    figures = {
        "threads": args.threads,
        "jobs": jobs,
        "submitted": jobs + WARMUP * args.batch,  # the warm-up's too
        "stored_jobs": stored[0] if stored else 0,
        "cpu_us_per_job": round(cpu / jobs * 1e6, 1),
        "jobs_per_second": round(jobs / wall),
        "python_loop_us": python_loop_us(),
    }
    print(
        f"{args.threads} threads, batches of {args.batch}: {figures['cpu_us_per_job']} us of"
        f" process CPU a job, {figures['jobs_per_second']} jobs/s"
    )
    print("BENCH_JSON " + json.dumps(figures))


if __name__ == "__main__":
    main()
