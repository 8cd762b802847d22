"""The bulk create's store work: keyed batches of once jobs (N1's load generator's shape) through
``App.prepare`` and ``App.submit_many`` on PostgreSQL, in-process, with no HTTP in between.

    .venv/bin/python bench/bulk_create.py [--batch 100] [--batches 40]

Prints the calling thread's CPU per job (``time.thread_time``) in each of the two steps, on a
fresh schema of the local ``test`` database."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from onbeat import App, TaskContext
from onbeat.store.records import NewJob
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WARMUP = 5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batch", type=int, default=100, help="jobs per submit_many")
    p.add_argument("--batches", type=int, default=40, help="batches measured")
    args = p.parse_args()
    with fresh_schema() as url:
        app = App(database_url=url)

        @app.task(name="work")
        def work(ctx: TaskContext, duration: float = 0.0) -> None: ...

        def batch() -> list[NewJob]:
            at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
            return [
                app.prepare("work", {"duration": 0.1}, at=at, idempotency_key=uuid.uuid4().hex)
                for _ in range(args.batch)
            ]

        for _ in range(WARMUP):
            app.submit_many(batch())
        prepare = submit = 0.0
        for _ in range(args.batches):
            began = time.thread_time()
            news = batch()
            prepared = time.thread_time()
            app.submit_many(news)
            prepare += prepared - began
            submit += time.thread_time() - prepared
        app.close()
    jobs = args.batch * args.batches
    figures = {
        "batch": args.batch,
        "jobs": jobs,
        "prepare_us_per_job": round(prepare / jobs * 1e6, 1),
        "submit_many_us_per_job": round(submit / jobs * 1e6, 1),
        "python_loop_us": python_loop_us(),
    }
    print(
        f"keyed batches of {args.batch}: App.prepare {figures['prepare_us_per_job']} us/job,"
        f" App.submit_many {figures['submit_many_us_per_job']} us/job (thread CPU)"
    )
    print("BENCH_JSON " + json.dumps(figures))


if __name__ == "__main__":
    main()
