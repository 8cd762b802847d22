"""Runs the ``DelayQueue`` contract suite against every backend.

A new backend is one more ``delay_queue`` param (and its URL); the tests themselves live in
``onbeat.testing.queue_contract`` and are never copied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from onbeat.queue import DelayQueue, open_failover_queue, open_queue
from onbeat.queue.failover import FailoverDelayQueue
from onbeat.testing.clock import FakeClock
from onbeat.testing.queue_contract import DelayQueueContract
from onbeat.testing.redis_queue import drop_prefix
from onbeat.testing.redis_queue import fresh_queue_url as fresh_redis_url
from tests.queue_backends import fresh_queue_url

UNUSED_REDIS_PORT = 18749
"""No Redis listens here (this suite's port range is 18700-18749; the fleet test uses 18700)."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.external_service),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("redis", id="redis", marks=pytest.mark.external_service),
        # One shard per script call, as a Redis Cluster needs them (still on one Redis).
        pytest.param("redis-per-shard", id="redis-per-shard", marks=pytest.mark.external_service),
        # Redis with the PostgreSQL table as its fallback: Redis up, and Redis down throughout.
        pytest.param("failover", id="failover", marks=pytest.mark.external_service),
        pytest.param("failover-down", id="failover-down", marks=pytest.mark.external_service),
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
    if request.param.startswith("failover"):
        url, prefix = fresh_redis_url()
        if request.param == "failover-down":  # a port nothing listens on (the suite's range)
            url = url.replace("127.0.0.1:6379", f"127.0.0.1:{UNUSED_REDIS_PORT}")
        async with fresh_queue_url("postgres", tmp_path) as fallback_url:
            queue = open_failover_queue(url, fallback_url, clock)
            try:
                yield queue
                if request.param == "failover":  # Redis up: the test ran on it, not the fallback
                    assert isinstance(queue, FailoverDelayQueue)
                    assert queue.primary_up
            finally:
                await queue.close()
                await drop_prefix(prefix)
        return
    if request.param.startswith("redis"):  # a key prefix of its own, dropped afterwards
        per_shard_calls = int(request.param == "redis-per-shard")
        url, prefix = fresh_redis_url(per_shard_calls=per_shard_calls)
        queue = open_queue(url, clock)
        try:
            yield queue
        finally:
            await queue.close()
            await drop_prefix(prefix)
        return
    async with fresh_queue_url(request.param, tmp_path) as url:
        queue = open_queue(url, clock)
        try:
            yield queue
        finally:
            await queue.close()


class TestDelayQueue(DelayQueueContract):
    pass
