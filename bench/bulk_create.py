"""The bulk create's store work: keyed batches of once jobs (N1's load generator's shape) through
``App.prepare`` and ``App.submit_many`` on PostgreSQL, in-process, with no HTTP in between.

    .venv/bin/python bench/bulk_create.py [--batch 100] [--batches 40]

Prints the calling thread's CPU per job (``time.thread_time``) in each of the two steps, on a
fresh schema of the local ``test`` database, and one ``BENCH_JSON {...}`` line with the figures and
what the database holds after the run: its jobs and idempotency keys, every one submitted (the
``--warmup`` batches too) stored once. Exits 1 if one is missing, duplicated or unknown."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from onbeat import App, TaskContext
from onbeat.store.records import CreatedJob, NewJob
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WARMUP = 5


def stored(url: str, keys: Sequence[str]) -> dict[str, Any]:
    """What the schema holds: its jobs, its idempotency keys and the jobs they name, and how many
    of ``keys`` (every key submitted) are missing from it or it holds beyond them."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM jobs),"
            " (SELECT count(*) FROM idempotency_keys),"
            " (SELECT count(DISTINCT job_id) FROM idempotency_keys)"
        ).fetchone()
        held = {r[0] for r in conn.execute("SELECT key FROM idempotency_keys")}
    assert row is not None
    return {
        "stored_jobs": row[0],
        "stored_keys": row[1],
        "keyed_jobs": row[2],
        "missing_keys": len(set(keys) - held),
        "unknown_keys": len(held - set(keys)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--batch", type=int, default=100, help="jobs per submit_many")
    p.add_argument("--batches", type=int, default=40, help="batches measured")
    p.add_argument("--warmup", type=int, default=WARMUP, help="batches before the measured ones")
    args = p.parse_args()
    keys: list[str] = []
    created = 0
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

        def submitted(news: Sequence[NewJob], done: Sequence[CreatedJob]) -> int:
            keys.extend(n.idempotency_key for n in news if n.idempotency_key is not None)
            return sum(not c.replayed for c in done)

        for _ in range(args.warmup):
            news = batch()
            created += submitted(news, app.submit_many(news))
        prepare = submit = 0.0
        for _ in range(args.batches):
            began = time.thread_time()
            news = batch()
            prepared = time.thread_time()
            done = app.submit_many(news)
            prepare += prepared - began
            submit += time.thread_time() - prepared
            created += submitted(news, done)
        app.close()
        database = stored(url, keys)
    jobs = args.batch * args.batches
    figures = {
        "batch": args.batch,
        "jobs": jobs,
        "submitted": args.batch * (args.warmup + args.batches),
        "keys": len(keys),
        "created": created,
        **database,
        "prepare_us_per_job": round(prepare / jobs * 1e6, 1),
        "submit_many_us_per_job": round(submit / jobs * 1e6, 1),
        "python_loop_us": python_loop_us(),
    }
    print(
        f"keyed batches of {args.batch}: App.prepare {figures['prepare_us_per_job']} us/job,"
        f" App.submit_many {figures['submit_many_us_per_job']} us/job (thread CPU)"
    )
    print("BENCH_JSON " + json.dumps(figures))
    counts = {
        len(keys),
        created,
        *(database[k] for k in ("stored_jobs", "stored_keys", "keyed_jobs")),
    }
    if counts != {figures["submitted"]} or database["missing_keys"] or database["unknown_keys"]:
        sys.exit(1)  # a job not stored, or stored twice: the figures are not of every job


if __name__ == "__main__":
    main()
