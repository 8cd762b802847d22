"""The reconciler's pass over every active cron job of a node (W3's 100,000), in-process, on
PostgreSQL: what one scheduler spends every ``reconcile_interval`` finding the jobs without a
planned next run.

    .venv/bin/python bench/reconcile.py [--crons 100000] [--broken 10] [--page 1000] [--rounds 3]

On a fresh schema of the local ``test`` database, ``--crons`` every-minute cron jobs are created
(each with its first run planned), and ``--broken`` of them lose their planned run behind onbeat's
back. Each round, one scheduler holding every shard runs ``job_repair_next_runs`` page by page to
the end; the first round must repair exactly the broken jobs and the later ones none (the bench
stops otherwise). Prints each round's wall time and the calling thread's CPU; the backend's CPU
is about the wall time less the client's on an idle box."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import psycopg

from onbeat.schedule import Schedule
from onbeat.store import open_store
from onbeat.store.records import NewJob
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

CREATE_BATCH = 1000


def run(crons: int, broken: int, page: int, rounds: int) -> list[dict[str, float]]:
    clock = FakeClock()
    news = [NewJob("work", {}, Schedule.parse(cron="* * * * *")) for _ in range(crons)]
    results = []
    with fresh_schema() as url:
        store = open_store(url, clock)
        try:
            for i in range(0, len(news), CREATE_BATCH):
                store.job_create_many(news[i : i + CREATE_BATCH])
            with psycopg.connect(url, autocommit=True) as raw:
                raw.execute(
                    "DELETE FROM runs WHERE status = 'scheduled' AND job_id IN"
                    " (SELECT id FROM jobs ORDER BY random() LIMIT %s)",
                    (broken,),
                )
                raw.execute("ANALYZE")
            leases = store.shard_acquire("bench", 300.0)
            for round_ in range(rounds):
                wall, cpu = time.perf_counter(), time.thread_time()
                repaired, pages, cursor = 0, 0, None
                while True:
                    fixed, cursor = store.job_repair_next_runs(leases, cursor, page)
                    repaired += len(fixed)
                    pages += 1
                    if cursor is None:
                        break
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                expected = broken if round_ == 0 else 0
                assert repaired == expected, (
                    f"round {round_ + 1} repaired {repaired}, not {expected}"
                )
                results.append({"wall_s": wall, "client_s": cpu, "pages": pages})
        finally:
            store.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--crons", type=int, default=100_000, help="every-minute cron jobs")
    p.add_argument("--broken", type=int, default=10, help="jobs that lose their planned run")
    p.add_argument("--page", type=int, default=1000, help="jobs per reconciler page")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rounds = run(args.crons, args.broken, args.page, args.rounds)
    for i, r in enumerate(rounds, 1):
        print(
            f"pass {i}: {args.crons} cron jobs in {r['pages']:.0f} pages:"
            f" {r['wall_s']:.3f} s, client {r['client_s']:.3f} s"
        )
    figures = {
        "crons": args.crons,
        "broken": args.broken,
        "page": args.page,
        "wall_s_median": round(statistics.median(r["wall_s"] for r in rounds), 3),
        "client_s_median": round(statistics.median(r["client_s"] for r in rounds), 3),
        "python_loop_us": python_loop_us(),
    }
    print("BENCH_JSON " + json.dumps(figures))


if __name__ == "__main__":
    main()
