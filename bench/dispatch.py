"""The dispatch's store work for a herd: cron jobs and one-shots all due at one instant (S8's and
W3's shape), handed to the queue by ``execution_dispatch`` in pages, in-process, no queue.

    .venv/bin/python bench/dispatch.py [--crons 1000] [--once 5000] [--page 5000] [--rounds 3]

Each round, on a fresh schema of the local ``test`` database: the jobs are created, the clock
(a FakeClock the store reads) is set 5 s before their instant, and one scheduler holding every
shard dispatches until nothing is left. Prints each round's wall time and the calling thread's
CPU per run dispatched (a cron run's dispatch also plans its next fire); the backend's CPU is
the wall time less the client's, near enough on an idle box."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from onbeat.schedule import Schedule
from onbeat.store import open_store
from onbeat.store.base import DispatchParams
from onbeat.store.records import NewJob
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

CREATE_BATCH = 1000


def one_round(crons: int, once: int, page: int) -> dict[str, float]:
    clock = FakeClock()
    instant = clock.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    news = [NewJob("work", {}, Schedule.parse(cron="* * * * *")) for _ in range(crons)]
    news += [NewJob("work", {}, Schedule.parse(at=instant)) for _ in range(once)]
    with fresh_schema() as url:
        store = open_store(url, clock)
        try:
            for i in range(0, len(news), CREATE_BATCH):
                store.job_create_many(news[i : i + CREATE_BATCH])
            clock.advance((instant - clock.now()).total_seconds() - 5)
            params = DispatchParams(store.shard_acquire("bench", 30.0), 10.0, 60.0, page)
            wall, cpu = time.perf_counter(), time.thread_time()
            dispatched = pages = 0
            while True:
                items = store.execution_dispatch(params)
                dispatched += len(items)
                pages += 1
                if len(items) < page:
                    break
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        finally:
            store.close()
    assert dispatched == crons + once, f"dispatched {dispatched} of {crons + once}"
    return {
        "wall_s": wall,
        "client_us_per_run": cpu / dispatched * 1e6,
        "pages": pages,
        "dispatched": dispatched,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--crons", type=int, default=1000, help="every-minute cron jobs")
    p.add_argument("--once", type=int, default=5000, help="one-shots due at the same instant")
    p.add_argument("--page", type=int, default=5000, help="runs per dispatch (dispatch_batch)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rounds = [one_round(args.crons, args.once, args.page) for _ in range(args.rounds)]
    for i, r in enumerate(rounds, 1):
        print(
            f"round {i}: {args.crons} crons + {args.once} one-shots in {r['pages']:.0f} pages:"
            f" {r['wall_s']:.3f} s, client {r['client_us_per_run']:.1f} us/run"
        )
    figures = {
        "crons": args.crons,
        "once": args.once,
        "page": args.page,
        "dispatched": [r["dispatched"] for r in rounds],
        "pages": [r["pages"] for r in rounds],
        "wall_s_median": round(statistics.median(r["wall_s"] for r in rounds), 3),
        "client_us_per_run_median": round(
            statistics.median(r["client_us_per_run"] for r in rounds), 1
        ),
        "python_loop_us": python_loop_us(),
    }
    print("BENCH_JSON " + json.dumps(figures))


if __name__ == "__main__":
    main()
