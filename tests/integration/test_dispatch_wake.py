"""Schedulers in other processes dispatch new work at once, not at their next poll.

A node (scheduler + worker) polls every 30 s; a job created through another App (its own
store, as the API process has) starts within about a second: the creating App NOTIFYs, the
node's LISTEN connection wakes its scheduler. On the real clock: the wake-up is the subject.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from onbeat import App, TaskContext
from onbeat.node import Node
from onbeat.testing.postgres import fresh_schema

pytestmark = pytest.mark.external_service

POLL = 30.0
"""The node's poll_interval: far longer than the test may take."""
ON_TIME = 1.5
"""Seconds from the submission to the start (measured: ~0.1 s)."""


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


async def test_dispatch_wake__a_job_created_elsewhere_starts_without_waiting_for_the_poll(
    database_url: str,
) -> None:
    started = asyncio.Event()
    node_app = App(database_url, f"{database_url}&table=wake_q", poll_interval=POLL, window=10)

    @node_app.task(name="ping")
    async def ping(ctx: TaskContext) -> None:
        started.set()

    node = Node(node_app)
    running = asyncio.create_task(node.run())
    api_app = App(database_url)  # another process's App: its own store and connections
    try:
        await asyncio.wait_for(node.scheduler.started.wait(), 10)
        await asyncio.sleep(0.5)  # the first dispatch pass is behind us: the next is 30 s away
        api_app.task(name="ping")(ping)
        began = time.monotonic()
        await asyncio.to_thread(api_app.submit, "ping")
        await asyncio.wait_for(started.wait(), POLL / 2)
        took = time.monotonic() - began
        assert took < ON_TIME
    finally:
        node.stop.set()
        await running
        api_app.close()
        node_app.close()


async def test_dispatch_wake__nothing_is_sent_for_work_due_after_the_window(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App(database_url, window=10)
    sent: list[None] = []
    monkeypatch.setattr(app.store, "notify_dispatch", lambda: sent.append(None))

    @app.task(name="later")
    async def later(ctx: TaskContext) -> None: ...

    try:
        await asyncio.to_thread(app.submit, "later", at="2999-01-01T00:00:00Z")
        assert sent == []
        await asyncio.to_thread(app.submit, "later")
        assert sent == [None]
    finally:
        app.close()
