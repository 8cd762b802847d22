"""Delay queues: release each execution id at its due time. See ``base.DelayQueue``."""

from __future__ import annotations

from onbeat.clock import Clock
from onbeat.queue.base import DelayQueue, QueueItem

__all__ = ["DelayQueue", "QueueItem", "open_queue"]


def open_queue(url: str, clock: Clock) -> DelayQueue:
    """Pick the backend from the URL scheme: ``memory://`` (in-process), ``postgresql://...``
    or ``sqlite:///path`` (a table shared by processes: ``table.TableDelayQueue``), ``redis://``
    or ``rediss://`` (``redis.RedisDelayQueue``; ``?prefix=`` names its keys)."""
    if url.startswith("memory://"):
        from onbeat.queue.memory import MemoryDelayQueue

        return MemoryDelayQueue(clock)
    if url.startswith(("postgresql://", "postgres://", "sqlite:///")):
        from onbeat.queue.table import open_table_queue

        return open_table_queue(url, clock)
    if url.startswith(("redis://", "rediss://")):
        from onbeat.queue.redis import RedisDelayQueue

        return RedisDelayQueue.from_url(url, clock)
    raise ValueError(
        f"queue_url: unsupported scheme in {url!r} "
        "(expected memory://, postgresql://..., sqlite:///PATH, redis://...)"
    )
