"""A worker whose store or queue drops out: it retries with backoff instead of spinning, keeps the
queue's runs (hands back what it could not start), logs one traceback, and carries on when the
service returns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from onbeat.errors import QueueUnavailableError, StoreUnavailableError
from onbeat.store.base import ClaimResult
from onbeat.worker.outage import FIRST_BACKOFF, MAX_BACKOFF
from tests.integration.conftest import Node

RUNS = 3


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def _until(condition: Callable[[], bool]) -> None:
    """Until ``condition`` holds: the store calls run in threads, so give them real time."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


async def test_worker__store_outage_backs_off_keeps_the_runs_and_recovers(
    node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for n in range(RUNS):
        node.app.schedule("record", {"n": n})
    await node.dispatch()
    real_claim = node.app.store.execution_claim
    attempts = 0
    down = True

    def claim(ids: Sequence[str], *args: Any, **kwargs: Any) -> ClaimResult:
        nonlocal attempts
        attempts += 1
        if down:
            raise StoreUnavailableError("connection to the store lost")
        return real_claim(ids, *args, **kwargs)

    monkeypatch.setattr(node.app.store, "execution_claim", claim)
    stop = asyncio.Event()

    def failures_logged() -> int:
        return sum(r.getMessage().startswith("claiming failed") for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="onbeat.worker"):
        running = asyncio.create_task(node.worker.run(stop))
        await _until(lambda: failures_logged() == 1)
        await _settle()
        assert attempts == 1  # waiting out its backoff, not spinning through the queue
        assert await node.queue.size() == RUNS  # handed back, not dropped
        for n in range(1, 8):
            wait = min(FIRST_BACKOFF * 2 ** (n - 1), MAX_BACKOFF)
            node.clock.advance(wait - 0.01)
            await _settle()
            assert attempts == n, f"retry {n} came before its backoff of {wait}s"
            node.clock.advance(0.02)  # past it (0.01 could fall short by a rounding error)
            await _until(lambda: failures_logged() == n + 1)  # noqa: B023
            await _settle()
        assert attempts == 8 and wait == MAX_BACKOFF
        down = False
        node.clock.advance(MAX_BACKOFF)
        for _ in range(20):
            await _settle()
            if node.worker.stats.succeeded == RUNS:
                break
            await asyncio.sleep(0.01)  # the runs' threads
        stop.set()
        await asyncio.wait_for(running, 5)
    assert node.worker.stats.succeeded == RUNS
    assert sorted(p["n"] for _, p, _ in node.calls.seen) == list(range(RUNS))
    claiming = [r for r in caplog.records if r.getMessage().startswith("claiming")]
    assert len([r for r in claiming if r.exc_info]) == 1
    assert "claiming works again after 8 failures" in caplog.text


async def test_worker__queue_outage_backs_off_and_recovers(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.app.schedule("record", {"n": 1})
    await node.dispatch()
    real_claim_due = node.queue.claim_due
    attempts = 0
    down = True

    async def claim_due(limit: int, ahead: float = 0.0) -> list[str]:
        nonlocal attempts
        attempts += 1
        if down:
            raise QueueUnavailableError("connection to the queue lost")
        return await real_claim_due(limit, ahead)

    monkeypatch.setattr(node.queue, "claim_due", claim_due)
    stop = asyncio.Event()
    running = asyncio.create_task(node.worker.run(stop))
    await _until(lambda: attempts == 1)
    await _settle()
    assert attempts == 1
    node.clock.advance(FIRST_BACKOFF)
    await _until(lambda: attempts == 2)
    down = False
    node.clock.advance(2 * FIRST_BACKOFF)
    for _ in range(20):
        await _settle()
        if node.worker.stats.succeeded:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert node.worker.stats.succeeded == 1
    assert node.worker.stats.loop_restarts == 0
