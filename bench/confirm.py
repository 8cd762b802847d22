"""The store's part of a burst held ahead: ``execution_confirm`` of runs claimed ahead.

    .venv/bin/python bench/confirm.py --runs 5000                 # PostgreSQL, one statement
    .venv/bin/python bench/confirm.py --runs 5000 --batch 500     # in batches: the first's wait
    .venv/bin/python bench/confirm.py --runs 5000 --store sqlite

``bench/burst_start.py`` measures the worker's part of a burst (starting the confirmed runs,
without a store); this measures the other part alone, in one process: once-jobs due at one
instant are created, dispatched and claimed ahead on a real store (PostgreSQL: a fresh schema on
the test server, committing as the fleet does), then the clock reaches the instant and the time
of each confirm call is printed: the first batch (when the first start could begin) and all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from onbeat import App, TaskContext
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.testing import FakeClock
from onbeat.testing.postgres import fresh_schema

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.box import python_loop_us  # noqa: E402

WORKER = "bench-worker"
HORIZON = 5.0


@contextmanager
def _store_url(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tempfile.mkdtemp()}/confirm.db"
        return
    with fresh_schema() as url:  # the fleet commits synchronously: so does this
        yield url.replace("%20-csynchronous_commit%3Doff", "")


async def measure(runs: int, batch: int, kind: str) -> dict[str, float | int | str]:
    with _store_url(kind) as url:
        clock = FakeClock()
        app = App(url, clock=clock, claim_ahead=HORIZON)

        @app.task(name="noop")
        async def noop(ctx: TaskContext, i: int) -> None:
            pass

        at = clock.now() + timedelta(seconds=3)
        app.submit_many([app.prepare("noop", {"i": i}, at=at) for i in range(runs)])
        queue = MemoryDelayQueue(clock)
        scheduler = Scheduler(app.store, queue, app.settings, clock)
        await scheduler.renew_shards()
        await scheduler.dispatch()
        ids = await queue.claim_due(runs, ahead=HORIZON)
        held: dict[str, int] = {}
        for k in range(0, len(ids), app.settings.claim_batch):
            claim = app.store.execution_claim(
                ids[k : k + app.settings.claim_batch],
                WORKER,
                app.settings.lease_ttl,
                app.settings.misfire_grace,
                max_starts=0,
                ahead=HORIZON,
                max_ahead=runs,
            )
            held |= {c.execution.id: c.execution.fencing_token for c in claim.started}
        clock.advance(3)
        pairs = list(held.items())
        began = time.perf_counter()
        ends = []
        confirmed = 0
        for k in range(0, len(pairs), batch):
            tokens = app.store.execution_confirm(
                WORKER, dict(pairs[k : k + batch]), app.settings.lease_ttl
            )
            confirmed += len(tokens)
            ends.append(time.perf_counter() - began)
        app.close()
    return {
        "store": kind,
        "runs": runs,
        "held": len(held),
        "confirmed": confirmed,
        "batch": batch,
        "first_batch_ms": round(ends[0] * 1e3, 1),
        "all_ms": round(ends[-1] * 1e3, 1),
        "us_per_run": round(ends[-1] / len(pairs) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=None, help="runs per confirm (default: all)")
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.runs, args.batch or args.runs, args.store))
    print(
        f"{figures['confirmed']} of {figures['runs']} runs held ahead confirmed on {args.store} "
        f"in batches of {figures['batch']}: first batch {figures['first_batch_ms']} ms, all "
        f"{figures['all_ms']} ms, {figures['us_per_run']} us per run"
    )
    print(
        "BENCH_JSON",
        json.dumps({"bench": "confirm", "python_loop_us": python_loop_us(), **figures}),
    )


if __name__ == "__main__":
    main()
