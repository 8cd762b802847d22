"""Runs the ``DelayQueue`` contract suite against every backend.

A new backend is one more ``delay_queue`` param (and its URL); the tests themselves live in
``onbeat.testing.queue_contract`` and are never copied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from onbeat.queue import DelayQueue, open_queue
from onbeat.testing.clock import FakeClock
from onbeat.testing.queue_contract import DelayQueueContract

_QUEUE_URLS = {"memory": "memory://"}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[pytest.param("memory", id="memory")])
async def delay_queue(
    request: pytest.FixtureRequest, clock: FakeClock
) -> AsyncIterator[DelayQueue]:
    queue = open_queue(_QUEUE_URLS[request.param], clock)
    try:
        yield queue
    finally:
        await queue.close()


class TestDelayQueue(DelayQueueContract):
    pass
