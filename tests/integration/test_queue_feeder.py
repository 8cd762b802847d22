"""Runs due at submission go straight to the delay queue (``onbeat.queue.feeder``): from an App
whose queue other processes share, from a node's App on the node's queue, and never at the cost
of a submission when the queue is down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from onbeat import App, TaskContext
from onbeat.model import ExecutionStatus
from onbeat.node import Node
from onbeat.queue import open_queue
from onbeat.testing import FakeClock
from tests.queue_backends import fresh_queue_url


def make_app(tmp_path: Path, clock: FakeClock, queue_url: str) -> App:
    app = App(f"sqlite:///{tmp_path / 'onbeat.db'}", queue_url, clock=clock)

    @app.task(name="noop")
    def noop(ctx: TaskContext) -> None: ...

    return app


def run_of(app: App, job_id: str) -> tuple[str, ExecutionStatus]:
    [run] = app.list_executions(job_id)
    return run.id, run.status


@pytest.mark.external_service
@pytest.mark.parametrize("driver", ["sqlite", "postgres"])
async def test_app__a_run_due_now_is_in_the_shared_queue_when_its_submission_returns(
    tmp_path: Path, clock: FakeClock, driver: str
) -> None:
    async with fresh_queue_url(driver, tmp_path) as queue_url:
        app = make_app(tmp_path, clock, queue_url)
        try:
            now_id, now_status = run_of(app, app.schedule("noop").id)
            later = app.schedule("noop", at=clock.now() + timedelta(minutes=5))
            other_process = open_queue(queue_url, clock)
            try:
                assert await other_process.claim_due(10, ahead=60) == [now_id]
            finally:
                await other_process.close()
            assert now_status is ExecutionStatus.QUEUED
            assert run_of(app, later.id)[1] is ExecutionStatus.SCHEDULED  # the dispatch's
        finally:
            await asyncio.to_thread(app.close)


def test_app__a_queue_that_is_down_fails_no_submission(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The run is stored queued; the sweep enqueues it once the queue is back (Store contract:
    ``queue_within``), and the log says so."""
    app = make_app(tmp_path, clock, "redis://127.0.0.1:1")  # nothing listens there
    try:
        job = app.schedule("noop")
        assert run_of(app, job.id)[1] is ExecutionStatus.QUEUED
    finally:
        app.close()
    assert "the scheduler's sweep enqueues them" in caplog.text


def test_app__a_queue_inside_no_process_leaves_runs_to_the_dispatch(
    tmp_path: Path, clock: FakeClock
) -> None:
    """``memory://`` outside a node is a queue nobody else reads: the node that runs the jobs
    dispatches them from the store."""
    app = make_app(tmp_path, clock, "memory://")
    try:
        assert run_of(app, app.schedule("noop").id)[1] is ExecutionStatus.SCHEDULED
    finally:
        app.close()


@pytest.fixture
def app(tmp_path: Path, clock: FakeClock) -> Iterator[App]:
    app = make_app(tmp_path, clock, "memory://")
    yield app
    app.close()


async def test_node__submissions_feed_its_queue_while_it_runs(app: App) -> None:
    node = Node(app, worker=False)
    running = asyncio.create_task(node.run())
    async with asyncio.timeout(10):
        await node.scheduler.started.wait()
        from_a_thread = await asyncio.to_thread(app.schedule, "noop")
        from_its_loop = app.schedule("noop")  # a task's own submission: handed over as it yields
        await asyncio.sleep(0)
        queued = set(await node.queue.claim_due(10))
    assert queued == {run_of(app, from_a_thread.id)[0], run_of(app, from_its_loop.id)[0]}
    assert node.scheduler.stats.dispatched == 0
    node.stop.set()
    await running
    stopped = app.schedule("noop")  # the node's queue is closed: left to the next dispatch
    assert run_of(app, stopped.id)[1] is ExecutionStatus.SCHEDULED


async def test_node__a_feeder_the_app_opened_before_is_closed_when_the_node_starts(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with fresh_queue_url("sqlite", tmp_path) as queue_url:
        app = make_app(tmp_path, clock, queue_url)
        await asyncio.to_thread(app.schedule, "noop")  # opens the App's own
        own = app._feeder
        assert own is not None
        node = Node(app, worker=False)
        running = asyncio.create_task(node.run())
        async with asyncio.timeout(10):
            await node.scheduler.started.wait()
        assert app._feeder is not own and own._closed
        node.stop.set()
        await running
        await asyncio.to_thread(app.close)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
