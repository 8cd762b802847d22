"""Dispatch wake-ups across processes: new work due soon reaches every scheduler at once.

A scheduler dispatches every ``poll_interval``, and at once when ``Scheduler.wake()`` is called.
In one process the App calls it after a submission. In a fleet on PostgreSQL the API is another
process, so the App also sends a NOTIFY (``PostgresStore.notify_dispatch``, right after the
submission committed) when the submission has work due within the dispatch ``window``, and each
scheduler process keeps one LISTEN connection (``listen``) that calls ``wake()`` on every
notification. The channel is per schema (``DISPATCH_CHANNEL_SQL``).

A lost notification costs at most ``poll_interval``: the poll is still there. A lost LISTEN
connection wakes the scheduler once (it may have missed one) and is opened again with backoff
(up to ``RETRY_CAP`` seconds). SQLite has no notifications: its fleets share a machine and the
embedded node's scheduler is woken in-process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql

from onbeat.clock import Clock
from onbeat.scheduler import sleep_or_wake
from onbeat.store.postgres import DISPATCH_CHANNEL_SQL

__all__ = ["RETRY_CAP", "listen"]

log = logging.getLogger("onbeat.scheduler")

RETRY_CAP = 5.0
"""Longest pause, in clock seconds, between attempts to open a lost LISTEN connection."""
CONNECT_TIMEOUT = 5


async def listen(url: str, on_wake: Callable[[], None], clock: Clock, stop: asyncio.Event) -> None:
    """Call ``on_wake`` for every dispatch notification on the database at ``url`` until
    ``stop`` is set, re-opening the connection when it is lost."""
    pause = 0.1
    failing = False
    while not stop.is_set():
        try:
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
            )
        except psycopg.Error as exc:
            if not failing:
                log.warning("dispatch wake-ups: cannot listen (%s); polling only", _line(exc))
            failing = True
        else:
            try:
                async with conn:
                    row = await (await conn.execute(f"SELECT {DISPATCH_CHANNEL_SQL}")).fetchone()
                    assert row is not None
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(row[0])))
                    if failing:
                        log.info("dispatch wake-ups: listening again")
                    failing, pause = False, 0.1
                    on_wake()  # whatever was sent while we were not listening
                    await _relay(conn, on_wake, stop)
                    return
            except psycopg.Error as exc:
                if not failing:
                    log.warning("dispatch wake-ups: connection lost (%s); polling", _line(exc))
                failing = True
                on_wake()
        await sleep_or_wake(clock, pause, stop)
        pause = min(pause * 2, RETRY_CAP)


async def _relay(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    on_wake: Callable[[], None],
    stop: asyncio.Event,
) -> None:
    """Until ``stop``: one ``on_wake`` per notification (the scheduler coalesces them)."""
    stopping = asyncio.ensure_future(stop.wait())

    async def relay() -> None:
        async for _ in conn.notifies():
            on_wake()
        raise psycopg.OperationalError("the LISTEN connection ended")

    relaying = asyncio.ensure_future(relay())
    try:
        await asyncio.wait((stopping, relaying), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        relaying.cancel()
        await asyncio.gather(stopping, relaying, return_exceptions=True)
    error = relaying.exception() if relaying.done() and not relaying.cancelled() else None
    if error is not None:
        raise error


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
