"""A scheduler whose store keeps failing backs off and logs the traceback once, not every pass."""

from __future__ import annotations

import asyncio
import logging

import pytest

from onbeat.queue.base import QueueItem
from onbeat.scheduler import MAX_ERROR_BACKOFF
from onbeat.store.base import DispatchParams
from tests.integration.conftest import Node


async def test_scheduler__failing_passes_back_off_and_log_one_traceback(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def refuse(params: DispatchParams) -> list[QueueItem]:
        nonlocal calls
        calls += 1
        raise OSError("database or disk is full")

    monkeypatch.setattr(node.app.store, "execution_dispatch", refuse)
    stop = asyncio.Event()
    running = asyncio.create_task(node.scheduler.run(stop))
    await asyncio.wait_for(node.scheduler.started.wait(), 5)
    with caplog.at_level(logging.INFO, logger="onbeat.scheduler"):
        for _ in range(300):  # 30 s of passes every poll_interval (0.2 s) if nothing backed off
            node.clock.advance(0.1)
            for _ in range(5):
                await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert 3 <= calls <= 30 / MAX_ERROR_BACKOFF + 6, calls
    dispatch_errors = [r for r in caplog.records if "dispatch" in r.getMessage()]
    assert len([r for r in dispatch_errors if r.exc_info]) == 1
    assert node.scheduler.stats.errors >= calls
