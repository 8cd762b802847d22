"""The heartbeat: renews the leases of the runs a worker runs, from its own OS thread.

On the event loop, one ``async def`` task that blocks it (``time.sleep``, a CPU loop) would stop
the heartbeats of every run in the process: their leases would expire and healthy runs would be
rescued elsewhere while still running. In a thread, the heartbeat only needs the GIL for a moment
(the store call releases it); a task holding the GIL in one long C call can still delay it, which
``--pool processes`` avoids.

A run whose lease is gone is reported back to the event loop (``call_soon_threadsafe``), where
the worker stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from onbeat.clock import Clock
from onbeat.store.base import Store

log = logging.getLogger("onbeat.worker")

HeldLeases = dict[str, int]
"""execution id -> fencing token."""


class Heartbeat:
    """Every ``interval`` seconds of ``clock``, extends the leases ``held()`` names, in one store
    call, and hands the ones no longer held to ``on_lost`` on the event loop.

    ``held`` is called from the heartbeat thread: it must return a snapshot safe to take there.
    ``beat()`` is one renewal, in the calling thread; the thread calls it on its schedule, tests
    and ``Worker.heartbeat`` call it directly.
    """

    def __init__(
        self,
        store: Store,
        owner: str,
        lease_ttl: float,
        interval: float,
        clock: Clock,
        held: Callable[[], HeldLeases],
        on_lost: Callable[[HeldLeases], None],
    ) -> None:
        self._store = store
        self._owner = owner
        self._lease_ttl = lease_ttl
        self._interval = interval
        self._clock = clock
        self._held = held
        self._on_lost = on_lost
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def beat(self) -> HeldLeases:
        """Renew the leases held now; returns those that are gone (fenced, finished, released)."""
        sent = self._held()
        if not sent:
            return {}
        kept = self._store.execution_heartbeat(self._owner, sent, self._lease_ttl)
        return {eid: token for eid, token in sent.items() if kept.get(eid) != token}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="onbeat-heartbeat", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the clock now rather than at the next scheduled beat (a FakeClock moved)."""
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it up to ``timeout`` seconds (a beat may be in a store
        call); blocking, so call it from a thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_at = self._clock.monotonic() + self._interval
        while not self._stopping:
            wait = next_at - self._clock.monotonic()
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            next_at = self._clock.monotonic() + self._interval
            try:
                lost = self.beat()
            except Exception:
                log.exception(
                    "heartbeat failed; leases run out %ss after their last renewal", self._lease_ttl
                )
                continue
            if lost and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                    self._loop.call_soon_threadsafe(self._on_lost, lost)
