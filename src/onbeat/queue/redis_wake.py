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
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from onbeat.clock import Clock

__all__ = ["Waiter", "Waiters", "WakeListener"]

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_CAP = 5.0
"""Seconds between attempts to resubscribe while Redis stays unreachable (the first is at once)."""


class Waiter:
    """One ``wait()`` call: woken by an arrival due by ``target_us`` (its wake time plus its
    ``ahead``, so both sides compare due times), or by ``wake_all``."""

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

    Started by the first ``wait()``. A dropped connection is retried at once, then with backoff;
    only while backing off (Redis refused twice in a row) does ``until_subscribed`` raise.
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
        """Set while the server has confirmed the subscription: no arrival can be missed."""
        self._attempt_over = asyncio.Event()  # replaced by each attempt to subscribe
        self._error: BaseException | None = None  # set while backing off
        self._task: asyncio.Task[None] | None = None

    async def until_subscribed(self, timeout: float) -> None:
        """Return once subscribed; raise the connection's error if Redis refuses, or
        ``TimeoutError`` after ``timeout`` real seconds (a network bound, not a test clock)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"onbeat-wake:{self._channel}")
        async with asyncio.timeout(timeout):
            while not self.subscribed.is_set():
                if self._error is not None:
                    raise self._error
                await self._attempt_over.wait()

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
                    if message is not None and self._handle(message):
                        failures = 0
                        self._error = None
                        self._end_attempt()
            except (RedisError, OSError) as error:
                failures += 1
                if self.subscribed.is_set():
                    log.warning("delay queue wake-ups lost their connection (%s)", error)
                    self.subscribed.clear()
                    # Arrivals may be missed from now on: sleeping waiters read the queue again.
                    self._waiters.wake_all()
                if failures > 1:
                    self._error = error
                self._end_attempt()
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await cast(Any, pubsub).aclose()  # typed from redis 8.2 on, not before
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()
            if failures > 1:
                await self._clock.sleep(min(RECONNECT_BACKOFF_CAP, 0.1 * 2 ** (failures - 2)))
                self._error = None

    def _end_attempt(self) -> None:
        """Tell ``until_subscribed`` callers to look again (a fresh event for the next attempt
        first, so that a caller that loops never finds a set one and spins)."""
        over, self._attempt_over = self._attempt_over, asyncio.Event()
        over.set()

    def _handle(self, message: dict[str, object]) -> bool:
        """Act on one pub/sub message; True if it confirmed the subscription."""
        kind = message.get("type")
        if kind == "subscribe":
            # Waiters read the queue only once this is set (see RedisDelayQueue.wait), so an
            # arrival is either in what they read or published to them from now on.
            self.subscribed.set()
            return True
        if kind == "message":
            instance, _, due = str(message.get("data", "")).partition(" ")
            if instance != self._instance:  # this object's own enqueue woke its waiters already
                try:
                    self._waiters.arrived(float(due))
                except ValueError:
                    log.warning("ignoring a malformed wake-up on %s: %r", self._channel, message)
        return False
