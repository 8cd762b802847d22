"""Delay queues: release each execution id at its due time. See ``base.DelayQueue``."""

from __future__ import annotations

from onbeat.clock import Clock
from onbeat.queue.base import DelayQueue, QueueItem

__all__ = ["DelayQueue", "QueueItem", "open_failover_queue", "open_node_queue", "open_queue"]

_REDIS = ("redis://", "rediss://")
_POSTGRES = ("postgresql://", "postgres://")


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


def open_failover_queue(
    queue_url: str, fallback_url: str, clock: Clock, *, log_changes: bool = True
) -> DelayQueue:
    """Redis at ``queue_url``, falling back to a table queue at ``fallback_url`` (PostgreSQL)
    while Redis is unavailable: ``failover.FailoverDelayQueue``."""
    from onbeat.queue.failover import FailoverDelayQueue
    from onbeat.queue.redis import RedisDelayQueue
    from onbeat.queue.table import open_table_queue

    primary = RedisDelayQueue.from_url(queue_url, clock)
    fallback = open_table_queue(fallback_url, clock)
    return FailoverDelayQueue(
        primary, fallback, clock, primary_url=primary.url, log_changes=log_changes
    )


def open_node_queue(
    queue_url: str, database_url: str, clock: Clock, *, failover: bool, log_changes: bool = True
) -> DelayQueue:
    """The queue a node uses: ``queue_url``'s, except that Redis with a PostgreSQL store (and
    ``failover``) gets the store's database as its fallback while Redis is down (moves to it
    and back logged if ``log_changes``)."""
    if failover and queue_url.startswith(_REDIS) and database_url.startswith(_POSTGRES):
        return open_failover_queue(queue_url, database_url, clock, log_changes=log_changes)
    return open_queue(queue_url, clock)
