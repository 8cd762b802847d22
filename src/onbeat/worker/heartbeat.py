"""The heartbeat: renews the leases of the runs a worker runs, from its own OS thread, each
within ``heartbeat_interval`` of its grant or last renewal.

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

LOOKS_PER_INTERVAL = 8
"""How often per ``interval`` the heartbeat looks at its leases. Each look renews the leases
that would otherwise go more than ``interval`` without a renewal by the next look, so every lease
is renewed within ``interval`` of its grant or last renewal, as when every beat renewed them all;
leases granted since the last renewal wait for their own time instead of being renewed with the
others moments after their grant. A burst confirmed at one instant was: W3 at 100,000 cron jobs,
each worker's beat renewed its 50,000 runs 1.5 s after their confirm, a statement of 1.7-3.1 s in
the middle of their starts (docs/performance.md). The price: a lease is renewed every 7/8 of
``interval`` in the steady state, not every ``interval``."""


class Heartbeat:
    """Every ``interval / LOOKS_PER_INTERVAL`` seconds of ``clock``, extends the leases that
    ``due(renewed_before)`` names (those granted or last renewed at or before that monotonic time
    of ``clock``), in one store call, tells ``renewed`` which it renewed and from when, and hands
    the ones no longer held to ``on_lost`` on the event loop.

    ``due`` and ``renewed`` are called from the heartbeat thread: they must be safe there.
    ``beat()`` is one look, in the calling thread; the thread calls it on its schedule, tests and
    ``Worker.heartbeat`` call it directly.
    """

    def __init__(
        self,
        store: Store,
        owner: str,
        lease_ttl: float,
        interval: float,
        clock: Clock,
        due: Callable[[float], HeldLeases],
        on_lost: Callable[[HeldLeases], None],
        renewed: Callable[[HeldLeases, float], None] = lambda kept, at: None,
    ) -> None:
        self._store = store
        self._owner = owner
        self._lease_ttl = lease_ttl
        self._interval = interval
        self._look_every = interval / LOOKS_PER_INTERVAL
        self._clock = clock
        self._due = due
        self._on_lost = on_lost
        self._renewed = renewed
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def beat(self) -> HeldLeases:
        """Renew the leases that are due now; returns those that are gone (fenced, finished,
        released). ``at`` is read before the store call, so it is no later than the commit the
        renewed leases run from."""
        at = self._clock.monotonic()
        sent = self._due(at - self._interval + self._look_every)
        if not sent:
            return {}
        kept = self._store.execution_heartbeat(self._owner, sent, self._lease_ttl)
        self._renewed(kept, at)
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
        next_at = self._clock.monotonic() + self._look_every
        while not self._stopping:
            wait = next_at - self._clock.monotonic()
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            next_at = self._clock.monotonic() + self._look_every
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
