"""The reconciler repairs any active cron job left without its next planned run, whatever broke it."""

from __future__ import annotations

import sqlite3

import pytest

from onbeat.model import ExecutionStatus
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
