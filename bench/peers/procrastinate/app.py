"""Procrastinate's app: the ``noop`` task, ``CRON_JOBS`` periodic tasks (one ``periodic_id``
each), and submission with ``batch_defer_async`` (1,000 jobs a call)."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime

import procrastinate

from bench.peers import adapter, ledger

BATCH = 1_000

app = procrastinate.App(connector=procrastinate.PsycopgConnector())  # libpq's PG* variables


@app.task(name="noop")
async def noop(run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


@app.task(name="cron")
async def cron(timestamp: int, job: int) -> None:
    ledger.record_cron(job, float(timestamp))  # the periodic deferrer's fire time


for _i in range(adapter.CRON_JOBS):
    app.periodic(cron=adapter.EVERY_MINUTE, periodic_id=str(_i), task_kwargs={"job": _i})(cron)


async def _submit(ids: list[str], at: float | None) -> None:
    async with app.open_async():
        deferrer = (
            noop if at is None else noop.configure(schedule_at=datetime.fromtimestamp(at, UTC))
        )
        for first in range(0, len(ids), BATCH):
            planned = time.time() if at is None else at
            await deferrer.batch_defer_async(
                *({"run_id": run_id, "planned": planned} for run_id in ids[first : first + BATCH])
            )


def submit(ids: list[str], at: float | None) -> None:
    asyncio.run(_submit(ids, at))


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
