"""arq's app: the ``noop`` function, ``CRON_JOBS`` cron entries, submission with
``enqueue_job`` (concurrently, 200 at a time: arq has no bulk enqueue)."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

from arq import create_pool, cron
from arq.connections import RedisSettings

from bench.peers import adapter, ledger

CONCURRENT = 200


async def noop(ctx: dict[str, Any], run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


async def cron_noop(ctx: dict[str, Any]) -> None:
    # arq's id of a cron run is ``<name>:<fire time ms>``: the fire time is 0.123456 s past the
    # minute boundary (arq's default microsecond), the boundary is the planned time
    name, fire_ms = ctx["job_id"].split(":")
    ledger.record_cron(name.removeprefix("cron-"), float(int(fire_ms) // 60_000 * 60))


class WorkerSettings:
    functions = [noop]
    cron_jobs = [cron(cron_noop, name=f"cron-{i}", second=0) for i in range(adapter.CRON_JOBS)]
    redis_settings = RedisSettings.from_dsn(adapter.REDIS_URL)


async def _submit(ids: list[str], at: float | None) -> None:
    pool = await create_pool(RedisSettings.from_dsn(adapter.REDIS_URL))
    defer = None if at is None else datetime.fromtimestamp(at, UTC)
    for first in range(0, len(ids), CONCURRENT):
        planned = time.time() if at is None else at
        await asyncio.gather(*(
            pool.enqueue_job("noop", run_id, planned, _defer_until=defer)
            for run_id in ids[first : first + CONCURRENT]
        ))  # fmt: skip
    await pool.aclose()


def submit(ids: list[str], at: float | None) -> None:
    asyncio.run(_submit(ids, at))


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
