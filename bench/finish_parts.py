"""Where a worker's store time goes per run on PostgreSQL: the client CPU of its claim and finish
transactions, and the finish statement's cost with and without its parts.

    .venv/bin/python bench/finish_parts.py --runs 10000              # ~20 s
    .venv/bin/python bench/finish_parts.py --runs 10000 --rounds 5

One process, a fresh schema on the test server, committing synchronously as the fleet does:
``--runs`` one-shot jobs due now are created and dispatched, then claimed with
``Store.execution_claim`` in batches of ``claim_batch`` (the client CPU and wall time of those
transactions, per run). ``execution_finish_final``, the statement that moves a batch of runs to the
history, is then run on the running runs in batches of ``--batch`` (a worker's outcome batch in
W1 is of that order), each round rolled back, in three shapes: as stored; without the one-shot
job's completion (the jobs row's update, never HOT: ``status`` is indexed); and with a plain
INSERT of the attempts instead of ``ON CONFLICT ... DO UPDATE``. Each round runs the shapes in
turn, so the dead versions a rolled-back round leaves behind weigh on each alike. Last, every run
is finished for real with ``Store.execution_finish_many`` in batches of ``--batch``.

The shapes are the stored statement with a clause cut out: if queries.sql changes so that a
clause is not found, the bench stops and says which.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from onbeat import App, TaskContext
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.store.base import ClaimedRun, Completion
from onbeat.store.postgres_session import postgres_queries
from onbeat.testing import FakeClock
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WORKER = "bench-worker"

JOB_COMPLETION = (
    "UPDATE jobs AS j SET status = 'completed', updated_at = %(now)s",
    "AND j.schedule_kind != 'cron' AND j.status NOT IN ('paused', 'cancelled', 'completed')",
)
ATTEMPT_UPSERT = (
    "ON CONFLICT (execution_id, scheduled_for, fencing_token) DO UPDATE\n"
    "    SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error"
)


def _cut(sql: str, old: str, new: str) -> str:
    if old not in sql:
        raise SystemExit(f"execution_finish_final no longer holds {old!r}: update the bench")
    return sql.replace(old, new)


def finish_shapes() -> dict[str, str]:
    """The finish statement as stored, and with one part cut out."""
    stored = postgres_queries()["execution_finish_final"]
    update, where = JOB_COMPLETION
    no_completion = _cut(_cut(stored, update, "SELECT 1 FROM jobs AS j"), where, "AND false")
    return {
        "stored": stored,
        "without the job's completion": no_completion,
        "attempts without ON CONFLICT": _cut(stored, ATTEMPT_UPSERT, ""),
    }


def _finishes(runs: Sequence[ClaimedRun]) -> str:
    """execution_finish_final's :finishes for runs that succeeded."""
    return json.dumps(
        [
            {
                "id": r.execution.id,
                "job_id": r.execution.job_id,
                "fencing_token": r.execution.fencing_token,
                "scheduled_for": int(r.execution.scheduled_for.timestamp() * 1_000_000),
                "status": "succeeded",
                "outcome": "succeeded",
                "result": "null",
                "error": None,
                "reason": None,
                "uncount_attempt": 0,
            }
            for r in runs
        ]
    )


def _batches(runs: Sequence[ClaimedRun], size: int) -> list[Sequence[ClaimedRun]]:
    return [runs[k : k + size] for k in range(0, len(runs), size)]


async def measure(runs: int, batch: int, rounds: int) -> dict[str, Any]:
    with fresh_schema() as url:
        url = url.replace("%20-csynchronous_commit%3Doff", "")  # commit as the fleet does
        clock = FakeClock()
        app = App(url, clock=clock)

        @app.task(name="noop")
        async def noop(ctx: TaskContext, i: int) -> None:
            pass

        app.submit_many([app.prepare("noop", {"i": i}) for i in range(runs)])
        queue = MemoryDelayQueue(clock)
        scheduler = Scheduler(app.store, queue, app.settings, clock)
        await scheduler.renew_shards()
        await scheduler.dispatch()
        ids = await queue.claim_due(runs)

        cpu, wall = time.process_time(), time.perf_counter()
        started: list[ClaimedRun] = []
        for k in range(0, len(ids), app.settings.claim_batch):
            claim = app.store.execution_claim(
                ids[k : k + app.settings.claim_batch],
                WORKER,
                app.settings.lease_ttl,
                app.settings.misfire_grace,
            )
            started += claim.started
        claim_cpu, claim_wall = time.process_time() - cpu, time.perf_counter() - wall

        shapes = finish_shapes()
        per_run: dict[str, list[float]] = {name: [] for name in shapes}
        now_us = int(clock.now().timestamp() * 1_000_000)
        params = [_finishes(b) for b in _batches(started, batch)]
        with psycopg.connect(url) as conn:
            for _ in range(rounds):
                for name, sql in shapes.items():
                    began = time.perf_counter()
                    for finishes in params:
                        conn.execute(sql, {"finishes": finishes, "now": now_us})
                    per_run[name].append((time.perf_counter() - began) / len(started) * 1e6)
                    conn.rollback()

        cpu, wall = time.process_time(), time.perf_counter()
        finished = 0
        for b in _batches(started, batch):
            finished += len(
                app.store.execution_finish_many(
                    [Completion(r.execution.id, r.execution.fencing_token, True) for r in b]
                )
            )
        finish_cpu, finish_wall = time.process_time() - cpu, time.perf_counter() - wall
        app.close()
    n = len(started)
    return {
        "runs": runs,
        "started": n,
        "finished": finished,
        "batch": batch,
        "claim_client_cpu_us_per_run": round(claim_cpu / n * 1e6, 1),
        "claim_wall_us_per_run": round(claim_wall / n * 1e6, 1),
        "finish_client_cpu_us_per_run": round(finish_cpu / n * 1e6, 1),
        "finish_wall_us_per_run": round(finish_wall / n * 1e6, 1),
        "finish_statement_us_per_run": {
            name: {"median": round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v]}
            for name, v in per_run.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64, help="runs per finish")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the finish's shapes")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.runs, args.batch, args.rounds))
    print(
        f"{figures['started']} runs claimed, {figures['finished']} finished, batches of "
        f"{figures['batch']}; us per run, client CPU / wall: claim "
        f"{figures['claim_client_cpu_us_per_run']} / {figures['claim_wall_us_per_run']}, finish "
        f"{figures['finish_client_cpu_us_per_run']} / {figures['finish_wall_us_per_run']}"
    )
    for name, v in figures["finish_statement_us_per_run"].items():
        print(f"  execution_finish_final {name:30s} {v['median']:6.1f} us per run {v['rounds']}")
    print(
        "BENCH_JSON",
        json.dumps({"bench": "finish_parts", "python_loop_us": python_loop_us(), **figures}),
    )
    if not figures["runs"] == figures["started"] == figures["finished"]:
        sys.exit(1)  # a run not claimed or not finished: the figures are not of every run


if __name__ == "__main__":
    main()
