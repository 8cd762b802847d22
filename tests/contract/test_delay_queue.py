"""Runs the ``DelayQueue`` contract suite against every backend.

A new backend is one more ``delay_queue`` param (and its URL); the tests themselves live in
``onbeat.testing.queue_contract`` and are never copied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from onbeat.queue import DelayQueue, open_queue
from onbeat.testing.clock import FakeClock
from onbeat.testing.queue_contract import DelayQueueContract
from tests.queue_backends import fresh_queue_url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.external_service),
        pytest.param("sqlite", id="sqlite"),
    ]
)
async def delay_queue(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[DelayQueue]:
    if request.param == "memory":
        queue = open_queue("memory://", clock)
        try:
            yield queue
        finally:
            await queue.close()
        return
    async with fresh_queue_url(request.param, tmp_path) as url:
        queue = open_queue(url, clock)
        try:
            yield queue
        finally:
            await queue.close()


class TestDelayQueue(DelayQueueContract):
    pass
