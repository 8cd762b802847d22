"""Single creates from threads at once, in-process (the store's part of ``POST /jobs``, no HTTP):
``App.schedule`` of one cron job from each of ``--threads`` threads, ``--jobs`` in all, on a
fresh schema of the local ``test`` database.

    .venv/bin/python bench/single_creates.py [--threads 8] [--jobs 2000]

Prints jobs/s, the process's CPU per job and how many jobs each store transaction held (the
group commit, ``onbeat/group_commit.py``): one thread first, then ``--threads``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from onbeat import App, TaskContext
from onbeat.store.records import CreatedJob, NewJob
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

NEXT_NEW_YEAR = "0 0 1 1 *"


def measure(app: App, threads: int, jobs: int, sizes: list[int]) -> dict[str, Any]:
    sizes.clear()
    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        made = pool.map(lambda i: app.schedule("noop", {"i": i}, cron=NEXT_NEW_YEAR), range(jobs))
        params = {job.id: job.params["i"] for job in made}
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "threads": threads,
        "jobs": len(params),
        "each_its_own": sorted(params.values()) == list(range(jobs)),
        "jobs_per_s": round(jobs / wall),
        "cpu_us_per_job": round(cpu / jobs * 1e6),
        "jobs_per_transaction": round(sum(sizes) / len(sizes), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--jobs", type=int, default=2000)
    args = p.parse_args()
    with fresh_schema() as url:
        app = App(url)

        @app.task(name="noop")
        def noop(ctx: TaskContext, **params: Any) -> None: ...

        store = app.store
        write, sizes = store.job_create_many, []

        def counted(news: Sequence[NewJob], queue_within: float | None = None) -> list[CreatedJob]:
            sizes.append(len(news))
            return write(news, queue_within)

        store.job_create_many = counted  # type: ignore[method-assign]
        try:
            measure(app, args.threads, 200, sizes)  # warm: connections, prepared statements
            rows = [measure(app, n, args.jobs, sizes) for n in (1, args.threads)]
        finally:
            app.close()
    for row in rows:
        print(
            f"{row['threads']:3d} threads: {row['jobs_per_s']:6,d} jobs/s, "
            f"{row['cpu_us_per_job']:5d} us of CPU a job, "
            f"{row['jobs_per_transaction']} jobs a transaction"
        )
    env = {"python_loop_us": python_loop_us()}
    print("BENCH_JSON " + json.dumps({"bench": "single_creates", "env": env, "result": rows}))


if __name__ == "__main__":
    main()
