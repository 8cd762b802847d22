"""A DelayQueue kept in one SQL table, so that every process of a fleet shares it.

Two drivers sit behind one ``TableDelayQueue``: PostgreSQL (``postgresql://...``; processes on
any host, no service besides the store's database) and SQLite (``sqlite:///path``; processes on
one host sharing a file). The queue keeps what is common: validation, time in integer
microseconds on the injected clock, last-write-wins batches, and ``wait``. A driver keeps its
SQL (``queue/sql/<driver>.sql``) and says how other processes' enqueues reach a waiter:

- PostgreSQL NOTIFYs once per enqueued batch with the batch's earliest due time; a LISTEN
  connection per queue relays it to the waiters that would otherwise sleep past that time.
- SQLite has no notification, so while anyone waits the queue polls the table's earliest due
  time every ``POLL_INTERVAL`` (50 ms, real time: it is how often the file is looked at, not a
  scheduling time). A waiter still wakes exactly at the earliest due time it read, on the clock.

Enqueues by this same queue object wake its waiters directly, without a round trip.

A claim deletes the rows it hands out. A claim whose caller is cancelled after the database
committed it loses those ids, as a crash would: the scheduler's sweep finds them in the store.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from onbeat.clock import Clock
from onbeat.errors import QueueUnavailableError, ValidationError
from onbeat.queue.base import QueueItem, horizon

__all__ = [
    "DEFAULT_TABLE",
    "POLL_INTERVAL",
    "QueueRow",
    "TableDelayQueue",
    "TableDriver",
    "from_micros",
    "open_table_queue",
    "to_micros",
]

DEFAULT_TABLE = "onbeat_queue"
POLL_INTERVAL = 0.05
"""Seconds between two looks at the earliest due time, for drivers that cannot notify."""
LISTEN_RETRY_CAP = 5.0
"""Longest pause, in clock seconds, between attempts to re-establish a lost LISTEN connection."""
_MAX_WAIT = 366 * 86400.0
"""Longer timeouts are cut to this, so that they stay integers of microseconds."""
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
log = logging.getLogger("onbeat.queue")


def to_micros(when: datetime) -> int:
    """Microseconds since the epoch: exact, and the same instant whatever the time zone."""
    since = when - _EPOCH  # integer fields, not a float timestamp: exact to the microsecond
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


def from_micros(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


class QueueRow(NamedTuple):
    """One table row, in column order (the SQLite driver binds it as is)."""

    execution_id: str
    shard: int
    priority: int
    due_at: int
    """Microseconds since the epoch."""


class TableDriver(Protocol):
    """One database's side of ``TableDelayQueue``. Every time is microseconds since the epoch.
    Methods raise ``QueueUnavailableError`` when the database cannot be reached or used."""

    notifies: bool
    """True if ``listen()`` relays other processes' enqueues; False: the queue polls instead."""

    async def open(self) -> None:
        """Connect and create the table if need be."""
        ...

    async def enqueue(self, rows: Sequence[QueueRow], earliest: int) -> None:
        """Upsert ``rows`` (unique ids) in one transaction; ``earliest`` is their earliest due
        time, for the notification."""
        ...

    async def claim(self, now: int, limit: int) -> list[str]:
        """Delete and return up to ``limit`` ids due at ``now``: priority desc, then due_at.
        (``now`` already includes ``claim_due``'s ``ahead``: the SQL only compares.)"""
        ...

    async def remove(self, ids: Sequence[str]) -> None: ...

    async def missing(self, ids: Sequence[str]) -> list[str]: ...

    async def earliest(self) -> int | None: ...

    async def size(self) -> int: ...

    async def listen(self) -> AsyncGenerator[int | None, None]:
        """Start listening (when this returns, nothing committed later is missed), then yield
        the earliest due time of each batch another queue object enqueued (None: unknown, wake
        everyone). The generator raises ``QueueUnavailableError`` when the connection is lost;
        the caller listens again. ``close()`` closes a listening connection too."""
        ...

    async def close(self) -> None: ...


@dataclass(eq=False, slots=True)
class _Waiter:
    """One ``wait()`` call. It registers before it reads the table, so nothing enqueued after
    the call began can slip past it."""

    limit: int
    """When its timeout ends (microseconds on the clock)."""
    ahead: int = 0
    """Its ``ahead`` in microseconds: an item due at t wakes it at t - ahead. Every time below
    is such a wake time, so announcements are compared in the same terms."""
    deadline: int | None = None
    """min(limit, earliest due time it read - ahead); None while it is still reading."""
    heard: int | None = None
    """The earliest wake time of what other processes announced while it was still reading.
    Those batches may already be in what it reads, so they wake it only if before its deadline."""
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class TableDelayQueue:
    """A ``DelayQueue`` in a SQL table shared by processes; see the module docstring.

    Opens lazily on first use (``open_queue`` is synchronous); call ``open()`` to fail early
    with a one-line ``QueueUnavailableError`` when the database cannot be reached. Among due
    items: highest priority first, then earliest ``due_at`` (ties in no particular order).
    After ``close()``, ``wait()`` returns at once and every other call raises ``RuntimeError``.
    """

    def __init__(self, driver: TableDriver, clock: Clock) -> None:
        self._driver = driver
        self._clock = clock
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._waiters: set[_Waiter] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._watch_lock = asyncio.Lock()
        self._observers: list[Callable[[datetime | None], None]] = []

    async def observe(self, on_arrival: Callable[[datetime | None], None]) -> None:
        """Call ``on_arrival`` with the earliest due time of every batch enqueued from now on,
        by any process (None: unknown, e.g. notifications were lost: look again). Starts
        listening now, so nothing committed after this returns is missed; raises
        ``QueueUnavailableError`` if the database cannot be reached. A driver that cannot
        notify polls, and reports the earliest due time it saw instead.

        Lets a caller (``FailoverDelayQueue``) keep track of a table it would otherwise have
        to read on every claim."""
        self._observers.append(on_arrival)
        try:
            await self._ready()
            await self._watch()
        except BaseException:
            self._observers.remove(on_arrival)
            raise

    async def open(self) -> None:
        """Connect and create the table if need be; QueueUnavailableError if it cannot."""
        if self._opened:
            return
        self._check_open()
        async with self._open_lock:
            self._check_open()  # closed while we queued for the lock
            if not self._opened:
                await self._driver.open()
                self._opened = True

    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        await self._ready()
        latest: dict[str, QueueRow] = {}
        for item in items:  # validate the whole batch first: all or nothing
            if item.due_at.utcoffset() is None:
                raise ValidationError(
                    "due_at", f"{item.execution_id}: needs a timezone-aware datetime"
                )
            row = QueueRow(item.execution_id, item.shard, item.priority, to_micros(item.due_at))
            latest[item.execution_id] = row  # the last write of an id wins
        if not latest:
            return
        earliest = min(row.due_at for row in latest.values())
        await self._driver.enqueue(list(latest.values()), earliest)
        self._announce(earliest, local=True)

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        if limit < 0:
            raise ValidationError("limit", f"must be >= 0, got {limit}")
        early = horizon(ahead)
        await self._ready()
        if limit == 0:
            return []
        return await self._driver.claim(to_micros(self._clock.now() + early), limit)

    async def remove(self, execution_ids: Sequence[str]) -> None:
        await self._ready()
        if execution_ids:
            await self._driver.remove(list(execution_ids))

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        await self._ready()
        if not execution_ids:
            return []
        return await self._driver.missing(list(execution_ids))

    async def next_due_at(self) -> datetime | None:
        await self._ready()
        earliest = await self._driver.earliest()
        return None if earliest is None else from_micros(earliest)

    async def size(self) -> int:
        await self._ready()
        return await self._driver.size()

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        early = horizon(ahead) // _MICROSECOND  # rounded as claim_due rounds it
        if self._closed:
            return
        start = to_micros(self._clock.now())
        waiter = _Waiter(limit=start + round(min(max(timeout, 0.0), _MAX_WAIT) * 1e6), ahead=early)
        self._waiters.add(waiter)  # before any await: every later enqueue reaches it
        try:
            try:
                await self._ready()
                await self._watch()
                earliest = await self._driver.earliest()
            except Exception:
                if self._closed:  # closed under our feet: that releases waiters
                    return
                raise
            deadline = waiter.limit if earliest is None else min(waiter.limit, earliest - early)
            waiter.deadline = deadline
            if waiter.heard is not None and waiter.heard < deadline:
                waiter.woken.set()
            delay = (deadline - to_micros(self._clock.now())) / 1e6
            if waiter.woken.is_set() or delay <= 0:
                # Still yield, so a caller looping on wait()/claim_due() cannot starve the loop.
                await asyncio.sleep(0)
                return
            await self._sleep(delay, waiter.woken)
        finally:
            self._waiters.discard(waiter)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._announce(None, local=True)
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        async with self._open_lock:  # an open() under way finishes first, then is undone
            await self._driver.close()  # also what a failed open() left behind

    # -- internals -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("TableDelayQueue is closed")

    async def _ready(self) -> None:
        self._check_open()
        if not self._opened:
            await self.open()

    async def _sleep(self, seconds: float, woken: asyncio.Event) -> None:
        # clock.sleep, not a loop timer, so a FakeClock drives this in tests.
        sleeper = asyncio.ensure_future(self._clock.sleep(seconds))
        waker = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()
            await asyncio.gather(sleeper, waker, return_exceptions=True)
        error = None if sleeper.cancelled() else sleeper.exception()
        if error is not None:  # a broken clock must not pass for a timeout
            raise error

    def _announce(self, due: int | None, *, local: bool) -> None:
        """Wake the waiters that would sleep past ``due`` less their ``ahead`` (None: everyone).

        A local enqueue surely happened after every registered waiter began, so it is compared
        with the waiter's timeout even before the waiter has read the table. A remote one may
        have committed before the waiter's read (the notification or poll lags), so until the
        waiter knows its deadline it is only noted, then compared with that deadline.
        """
        if self._observers:
            when = None if due is None else from_micros(due)
            for observer in self._observers:
                observer(when)
        for waiter in self._waiters:
            if due is None:
                waiter.woken.set()
                continue
            wake = due - waiter.ahead  # when claim_due(ahead) would first hand it out
            if waiter.deadline is not None:
                if wake < waiter.deadline:
                    waiter.woken.set()
            elif local:
                if wake < waiter.limit:
                    waiter.woken.set()
            elif waiter.heard is None or wake < waiter.heard:
                waiter.heard = wake

    async def _watch(self) -> None:
        """Start relaying other processes' enqueues to the waiters, once. For a notifying
        driver the first LISTEN happens here, so that an unreachable database fails this wait
        instead of being retried silently."""
        if self._watcher is not None and not self._watcher.done():
            return
        async with self._watch_lock:
            if self._watcher is not None and not self._watcher.done():
                return
            if self._driver.notifies:
                notes = await self._driver.listen()
                self._watcher = asyncio.create_task(self._relay(notes), name="onbeat-queue-listen")
            else:
                self._watcher = asyncio.create_task(self._poll(), name="onbeat-queue-poll")

    async def _relay(self, notes: AsyncGenerator[int | None, None]) -> None:
        pause = POLL_INTERVAL
        while True:
            try:
                async for due in notes:
                    self._announce(due, local=False)
                raise QueueUnavailableError("the LISTEN connection ended")
            except QueueUnavailableError as exc:
                log.warning("queue notifications lost (%s); waiters fall back to timeouts", exc)
            self._announce(None, local=False)  # whatever was missed: look again
            while True:
                await self._clock.sleep(pause)
                pause = min(pause * 2, LISTEN_RETRY_CAP)
                try:
                    notes = await self._driver.listen()
                except QueueUnavailableError:
                    continue
                break
            log.info("queue notifications restored")
            self._announce(None, local=False)  # enqueued while we were away
            pause = POLL_INTERVAL

    async def _poll(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(POLL_INTERVAL)
            if not self._observers and not any(
                waiter.deadline is not None for waiter in self._waiters
            ):
                continue  # nobody is asleep: look at nothing
            try:
                earliest = await self._driver.earliest()
            except QueueUnavailableError as exc:
                if not failing:
                    log.warning("queue poll failed (%s); waiters fall back to timeouts", exc)
                failing = True
                continue
            failing = False
            if earliest is not None:
                self._announce(earliest, local=False)


def open_table_queue(url: str, clock: Clock) -> TableDelayQueue:
    """``postgresql://user@host:port/db[?table=NAME&libpq params]`` or
    ``sqlite:///relative.db`` / ``sqlite:////abs/path.db[?table=NAME]``. ``table`` (default
    ``onbeat_queue``) keeps queues apart in one database; it also names the NOTIFY channel."""
    parts = urlsplit(url)
    table = DEFAULT_TABLE
    # The other parameters go to libpq exactly as written: decoding and encoding them again
    # would turn a space into "+", which libpq keeps as a "+" (options=-csearch_path=s -c...).
    rest: list[str] = []
    for parameter in filter(None, parts.query.split("&")):
        key, _, value = parameter.partition("=")
        if unquote(key) == "table":
            table = unquote(value)
            if not _TABLE_NAME.match(table):
                raise ValidationError(
                    "queue_url", f"table {table!r}: use lowercase letters, digits and _ (<= 48)"
                )
        else:
            rest.append(parameter)
    location = _redacted(url)
    if parts.scheme in ("postgresql", "postgres"):
        from onbeat.queue.table_postgres import PostgresQueueDriver

        conninfo = urlunsplit(parts._replace(query="&".join(rest)))
        return TableDelayQueue(PostgresQueueDriver(conninfo, table, location), clock)
    if parts.scheme == "sqlite" and url.startswith("sqlite:///"):
        if rest:
            unknown = [unquote(p.partition("=")[0]) for p in rest]
            raise ValidationError("queue_url", f"unknown parameters {unknown}")
        from onbeat.queue.table_sqlite import SQLiteQueueDriver

        path = url.removeprefix("sqlite:///").split("?", 1)[0]
        return TableDelayQueue(SQLiteQueueDriver(path, table, location), clock)
    raise ValidationError("queue_url", f"unsupported URL {location!r}")


def _redacted(url: str) -> str:
    """The URL as it may appear in messages: without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def one_line(error: BaseException) -> str:
    """A driver's error message on one line (libpq's span several)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__
