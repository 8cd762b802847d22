"""An onbeat App on a fresh SQLite file and a FakeClock, its API, and an httpx client for it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App, TaskContext
from onbeat.api import create_app
from onbeat.clock import Clock
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.testing import FakeClock
from onbeat.worker import Worker

PROBLEM = "application/problem+json"
Snapshot = dict[str, list[tuple[Any, ...]]]
TABLES = (
    "jobs",
    "executions",
    "attempts",
    "dead_letters",
    "job_events",
    "api_keys",
    "tenant_limits",
)


def add_test_tasks(app: App) -> App:
    """The tasks the API tests' jobs name: ``echo`` returns its params, ``fail`` always fails
    (one attempt, so its run is dead-lettered at once)."""

    @app.task(name="echo", max_attempts=5, timeout=30, backoff=2.0, backoff_max=60)
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    @app.task(name="fail", max_attempts=1)
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    return app


@pytest.fixture
def onbeat_app(tmp_path: Path, clock: FakeClock) -> Iterator[App]:
    app = add_test_tasks(App(f"sqlite:///{tmp_path / 'db'}", clock=clock))
    yield app
    app.close()


@pytest.fixture
async def client(onbeat_app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(onbeat_app))
    async with httpx.AsyncClient(transport=transport, base_url="http://onbeat.test/api/v1") as c:
        yield c


async def run_due(app: App, clock: Clock) -> None:
    """One scheduler pass, then run everything due, as the embedded node would."""
    queue = MemoryDelayQueue(clock)
    # One owner for every pass, so each pass holds every shard (a new owner would get a share).
    scheduler = Scheduler(app.store, queue, app.settings, clock, owner="api-tests")
    await scheduler.renew_shards()
    await scheduler.dispatch()
    await Worker(app.store, queue, app.registry, app.settings, clock).run_until_idle()
    await queue.close()


async def make_dead_letter(app: App, clock: Clock, tenant: str = "default") -> str:
    """A job whose only attempt fails; returns the dead-lettered execution's id."""
    job = app.schedule("fail", tenant=tenant)
    await run_due(app, clock)
    [execution] = app.list_executions(job.id)
    return execution.id


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def snapshot(app: App) -> Snapshot:
    """Every row of every onbeat table, read beside the App, to prove a request changed nothing."""
    path = app.settings.database_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db:
        return {
            table: sorted(db.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in TABLES
        }


def assert_problem(
    response: httpx.Response, status: int, field: str | None = None
) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem document with ``status`` naming ``field``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    doc: dict[str, Any] = response.json()
    assert doc["status"] == status
    assert doc["type"].startswith("urn:onbeat:problem:")
    assert doc["title"]
    assert doc["detail"]
    if field is not None:
        assert field in [e["field"] for e in doc["errors"]], doc
        assert all(e["message"] for e in doc["errors"])
    return doc
