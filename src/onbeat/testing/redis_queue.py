"""Redis for tests: queue URLs with a key prefix of their own, and dropping it afterwards.

Tests share the machine's Redis with other test runs, so each queue gets a random prefix and
deletes its keys when done. ``ONBEAT_TEST_REDIS_URL`` points them at another server or DB.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis

__all__ = ["REDIS_TEST_URL", "drop_prefix", "fresh_queue_url"]

REDIS_TEST_URL = os.environ.get("ONBEAT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def fresh_queue_url(base: str = REDIS_TEST_URL, **options: str | int) -> tuple[str, str]:
    """A queue URL on ``base`` with a fresh ``prefix`` (and any other query options), and the
    prefix."""
    prefix = f"onbeat-test-{uuid.uuid4().hex[:12]}"
    query = urlencode({"prefix": prefix, **options})
    return urlunsplit(urlsplit(base)._replace(query=query)), prefix


async def drop_prefix(prefix: str, base: str = REDIS_TEST_URL) -> int:
    """Delete every key of ``prefix``; returns how many there were."""
    client = aioredis.Redis.from_url(base)
    try:
        dropped = 0
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                dropped += await client.delete(*batch)
                batch = []
        if batch:
            dropped += await client.delete(*batch)
        return dropped
    finally:
        await client.aclose()
