"""Wake-ups for the Redis delay queue: waiters in this process, and a pub/sub listener that
wakes them when another process enqueues.

Every enqueue publishes ``"<queue instance> <earliest due, us>"`` on the prefix's channel. A
waiter sleeps until a target time (the earliest due time it knows of, or its timeout) and is
woken early only by an arrival due by that target: a scheduler enqueueing runs due later
does not wake every worker. While the listener is not subscribed (starting, or reconnecting
after the connection dropped), arrivals can be missed: so ``wait()`` reads the queue only once
the subscription is confirmed, and a dropped connection wakes every waiter so that it reads the
queue again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from onbeat.clock import Clock

__all__ = ["Waiter", "Waiters", "WakeListener"]

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_CAP = 5.0
"""Seconds between attempts to resubscribe while Redis stays unreachable (the first is at once)."""


class Waiter:
    """One ``wait()`` call: woken by an arrival due before ``target_us``, or by ``wake_all``."""

    __slots__ = ("target_us", "woken")

    def __init__(self) -> None:
        self.target_us = math.inf  # until the waiter knows its target, any arrival wakes it
        self.woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


class Waiters:
    """The waiters of one queue object."""

    def __init__(self) -> None:
        self._waiters: set[Waiter] = set()

    def add(self) -> Waiter:
        waiter = Waiter()
        self._waiters.add(waiter)
        return waiter

    def discard(self, waiter: Waiter) -> None:
        self._waiters.discard(waiter)

    def arrived(self, due_us: float) -> None:
        """Items arrived, the earliest due at ``due_us``: wake those waiting until then or later
        (at "then" too: the waiter may have read the queue before the items arrived)."""
        for waiter in self._waiters:
            if due_us <= waiter.target_us:
                waiter.wake()

    def wake_all(self) -> None:
        for waiter in self._waiters:
            waiter.wake()


class WakeListener:
    """Subscribes to the wake channel on a connection of its own and feeds ``Waiters``.

    Started by the first ``wait()``; ``subscribed`` is set while the subscription is confirmed
    by the server (only then can no arrival be missed).
    """

    def __init__(
        self,
        client_factory: Callable[[], aioredis.Redis],
        channel: str,
        instance: str,
        waiters: Waiters,
        clock: Clock,
    ) -> None:
        self._client_factory = client_factory
        self._channel = channel
        self._instance = instance
        self._waiters = waiters
        self._clock = clock
        self.subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"onbeat-wake:{self._channel}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.subscribed.clear()

    async def _run(self) -> None:
        failures = 0
        while True:
            client = self._client_factory()
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        failures = 0
                        self._handle(message)
            except (RedisError, OSError) as error:
                failures += 1
                if self.subscribed.is_set():
                    log.warning("delay queue wake-ups lost their connection (%s)", error)
                self.subscribed.clear()
                self._waiters.wake_all()  # arrivals may have been missed: read the queue again
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
            if failures > 1:
                await self._clock.sleep(min(RECONNECT_BACKOFF_CAP, 0.1 * 2 ** (failures - 2)))

    def _handle(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            # Waiters read the queue only once this is set (see RedisDelayQueue.wait), so an
            # arrival is either in what they read or published to them from now on.
            self.subscribed.set()
        elif kind == "message":
            instance, _, due = str(message.get("data", "")).partition(" ")
            if instance == self._instance:
                return  # this object's own enqueue already woke its waiters
            try:
                self._waiters.arrived(float(due))
            except ValueError:
                log.warning("ignoring a malformed wake-up on %s: %r", self._channel, message)
