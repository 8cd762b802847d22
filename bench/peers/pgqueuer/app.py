"""PgQueuer's app: the ``noop`` entrypoint, ``CRON_JOBS`` every-minute schedules, and the bulk
submission (one multi-row ``Queries.enqueue`` per 1,000 jobs)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job, Schedule
from pgqueuer.queries import Queries

from bench.peers import adapter, ledger

BATCH = 1_000


def _cron(pgq: PgQueuer, i: int) -> None:
    @pgq.schedule(f"cron_{i}", adapter.EVERY_MINUTE)
    async def cron(schedule: Schedule) -> None:
        ledger.record_cron(i)


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    conn = await asyncpg.connect(
        adapter.DATABASE_URL, server_settings={"application_name": adapter.APP_NAME}
    )
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        run_id, planned = json.loads(job.payload or b"[]")
        ledger.record(run_id, planned)

    for i in range(adapter.CRON_JOBS):
        _cron(pgq, i)
    yield pgq
    await conn.close()


async def _submit(ids: list[str], at: float | None) -> None:
    conn = await asyncpg.connect(
        adapter.DATABASE_URL, server_settings={"application_name": adapter.APP_NAME}
    )
    queries = Queries(AsyncpgDriver(conn))
    for first in range(0, len(ids), BATCH):
        chunk = ids[first : first + BATCH]
        now = time.time()
        planned = now if at is None else at
        delay = None if at is None else timedelta(seconds=at - now)
        await queries.enqueue(
            ["noop"] * len(chunk),
            [json.dumps([run_id, planned]).encode() for run_id in chunk],
            [0] * len(chunk),
            [delay] * len(chunk),
        )
    await conn.close()


def submit(ids: list[str], at: float | None) -> None:
    asyncio.run(_submit(ids, at))


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
