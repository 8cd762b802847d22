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
from onbeat.testing.redis_queue import drop_prefix, fresh_queue_url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.external_service),
        # One shard per script call, as a Redis Cluster needs them (still on one Redis).
        pytest.param("redis-per-shard", id="redis-per-shard", marks=pytest.mark.external_service),
    ]
)
async def delay_queue(
    request: pytest.FixtureRequest, clock: FakeClock
) -> AsyncIterator[DelayQueue]:
    prefix = None
    if request.param == "redis":  # a key prefix of its own, dropped afterwards
        url, prefix = fresh_queue_url()
    elif request.param == "redis-per-shard":
        url, prefix = fresh_queue_url(per_shard_calls=1)
    else:
        url = "memory://"
    queue = open_queue(url, clock)
    try:
        yield queue
    finally:
        await queue.close()
        if prefix is not None:
            await drop_prefix(prefix)


class TestDelayQueue(DelayQueueContract):
    pass
