"""The reconciler repairs any active cron job left without its next planned run, whatever broke it."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

import pytest

from onbeat.model import ExecutionStatus
from onbeat.schedule import Schedule
from onbeat.store import open_store
from onbeat.store.base import JobCursor, NewJob
from onbeat.store.sql_store import SQLStore
from onbeat.testing import FakeClock
from onbeat.testing.postgres import store_schema
from tests.integration.conftest import Node


def _raw(node: Node) -> sqlite3.Connection:
    return sqlite3.connect(node.app.settings.database_url.removeprefix("sqlite:///"))


@pytest.mark.parametrize(
    "breakage",
    [
        "DELETE FROM runs WHERE job_id = :job AND status = 'scheduled'",
        "UPDATE runs SET status = 'cancelled' WHERE job_id = :job AND status = 'scheduled'",
        "UPDATE jobs SET next_fire_at = NULL WHERE id = :job",
    ],
    ids=["head deleted", "head cancelled", "next fire lost"],
)
async def test_reconcile__plans_the_next_run_of_a_broken_chain(node: Node, breakage: str) -> None:
    app = node.app
    job = app.schedule("record", cron="*/10 * * * * *")
    for _ in range(3):
        await node.step(advance=10)
    with _raw(node) as raw:  # a chain broken behind onbeat's back
        raw.execute(breakage, {"job": job.id})
    await node.scheduler.renew_shards()
    assert await node.scheduler.reconcile() == 1
    assert node.scheduler.stats.repaired == 1
    assert await node.scheduler.reconcile() == 0  # repaired once, then left alone
    for _ in range(3):
        await node.step(advance=10)
    ran = [e for e in app.list_executions(job.id) if e.status is ExecutionStatus.SUCCEEDED]
    assert len(ran) >= 5
    assert app.get_job(job.id).next_fire_at is not None


async def test_reconcile__leaves_healthy_and_paused_jobs_alone(node: Node) -> None:
    app = node.app
    healthy = app.schedule("record", cron="*/10 * * * * *")
    paused = app.schedule("record", cron="*/10 * * * * *")
    app.pause(paused.id)
    await node.step(advance=25)
    await node.scheduler.renew_shards()
    assert await node.scheduler.reconcile() == 0
    assert app.get_job(healthy.id).next_fire_at is not None


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_job_repair_next_runs__pages_through_every_shard_once(backend: str, tmp_path: Path) -> None:
    """Small pages over jobs in many shards repair each broken job once, in (shard, id) order,
    and the last page says so (None): nothing is skipped at a page's edge."""
    clock = FakeClock()
    with ExitStack() as stack:
        if backend == "postgres":
            url = stack.enter_context(store_schema())
        else:
            url = f"sqlite:///{tmp_path}/onbeat.db"
        store = open_store(url, clock, shard_count=16)
        stack.callback(store.close)
        assert isinstance(store, SQLStore)
        shard_of = {
            job.id: job.shard
            for job in (
                store.job_create(NewJob("record", {}, Schedule.parse(cron="* * * * *"))).job
                for _ in range(40)
            )
        }
        with store._tx() as c:  # every chain broken behind onbeat's back
            c.execute("DELETE FROM runs")
        leases = store.shard_acquire("scheduler", 30.0)
        repaired: list[str] = []
        cursor: JobCursor | None = None
        pages = 0
        while True:
            fixed, cursor = store.job_repair_next_runs(leases, cursor, 3)
            repaired += fixed
            pages += 1
            if cursor is None:
                break
        assert pages == 40 // 3 + 1
        assert sorted(repaired) == sorted(shard_of), "a job repaired twice or never"
        assert repaired == sorted(repaired, key=lambda j: (shard_of[j], j))
        assert len(set(shard_of.values())) > 5, "the jobs should span many shards"
        assert store.job_repair_next_runs(leases, None, 1000) == ([], None)
