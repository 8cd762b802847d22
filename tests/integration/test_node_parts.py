"""``Node`` runs the parts a process is asked for: the embedded node all of them, a fleet process
one (``onbeat scheduler`` / ``worker`` / ``api``); it checks its store and queue before starting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onbeat import App, TaskContext
from onbeat.errors import QueueUnavailableError, StoreOpenError
from onbeat.node import Node
from onbeat.testing import FakeClock

PUBLISH_EVERY = 30.0


@pytest.fixture
def app(tmp_path: Path, clock: FakeClock) -> Iterator[App]:
    app = App(
        f"sqlite:///{tmp_path / 'onbeat.db'}",
        clock=clock,
        task_publish_interval=PUBLISH_EVERY,
        task_ttl=60,
    )

    @app.task(name="mail.send", max_attempts=4, timeout=9)
    async def send(ctx: TaskContext) -> None: ...

    yield app
    app.close()


async def _until(condition: Callable[[], Any]) -> None:
    """Until ``condition`` holds: the store calls run in threads, so give them real time."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


def test_node__parts(app: App) -> None:
    assert Node(app).parts == ["scheduler", "worker"]
    assert Node(app, worker=False).parts == ["scheduler"]
    api_only = Node(app, scheduler=False, worker=False)
    assert api_only.parts == []
    for part in ("queue", "scheduler", "worker"):
        with pytest.raises(AttributeError, match="this node runs"):
            getattr(api_only, part)


async def test_node_check__a_queue_that_cannot_be_reached_is_one_line(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(app, scheduler=False)

    async def refused() -> int:
        raise ConnectionRefusedError(111, "Connection refused\nwhile connecting")

    monkeypatch.setattr(node.queue, "size", refused)
    with pytest.raises(QueueUnavailableError) as failed:
        await node.check()
    assert str(failed.value) == (
        "cannot reach the queue memory://: ConnectionRefusedError: [Errno 111] Connection refused"
    )


async def test_node_check__a_store_that_cannot_be_opened(tmp_path: Path, clock: FakeClock) -> None:
    app = App(f"sqlite:///{tmp_path / 'missing' / 'onbeat.db'}", clock=clock)
    with pytest.raises(StoreOpenError, match="does not exist"):
        await Node(app, scheduler=False, worker=False).check()


async def test_worker_node__publishes_its_tasks_on_start_and_every_interval(
    app: App, clock: FakeClock
) -> None:
    node = Node(app, scheduler=False)
    running = asyncio.create_task(node.run())
    try:
        await _until(lambda: app.store.task_catalog(60))
        [published] = app.store.task_catalog(60)
        assert (published.name, published.retry.max_attempts, published.timeout) == (
            "mail.send",
            4,
            9.0,
        )
        assert (published.worker, published.seen_at) == (node.worker.owner, clock.now())
        started = clock.now()
        await asyncio.sleep(0.05)  # the publisher is back from its thread, waiting on the clock
        clock.advance(PUBLISH_EVERY - 1)
        await asyncio.sleep(0.05)
        assert app.store.task_catalog(60)[0].seen_at == started
        clock.advance(1)
        await _until(lambda: app.store.task_catalog(60)[0].seen_at == clock.now())
    finally:
        node.stop.set()
        await asyncio.wait_for(running, 10)


async def test_scheduler_and_api_nodes__publish_nothing(app: App, clock: FakeClock) -> None:
    node = Node(app, worker=False)
    running = asyncio.create_task(node.run())
    await asyncio.wait_for(node.scheduler.started.wait(), 5)
    node.stop.set()
    await asyncio.wait_for(running, 10)
    assert app.store.task_catalog(60) == []
