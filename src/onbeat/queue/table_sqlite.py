"""The SQLite driver of ``TableDelayQueue``: processes on one host sharing a file.

One connection per queue object, used from worker threads (``asyncio.to_thread``) one call at a
time, so a slow disk never blocks the event loop. WAL mode lets readers go on while one process
writes; every write is a ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock up
front (a deferred one could fail on upgrade without waiting, when another process wrote first).
SQLite cannot notify other processes: ``notifies`` is False and the queue polls ``earliest()``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Never, TypeVar

from onbeat.batch_json import batch_json
from onbeat.errors import QueueUnavailableError
from onbeat.queue.table import QueueRow, one_line
from onbeat.store.queries import load_named_sql

__all__ = ["SQLiteQueueDriver"]

_QUERIES = load_named_sql("onbeat.queue", "sql/sqlite.sql")
BUSY_TIMEOUT = 10.0
"""Seconds a write waits for another process's write lock before the queue is called busy."""
_T = TypeVar("_T")


class SQLiteQueueDriver:
    notifies = False

    def __init__(self, path: str, table: str, location: str) -> None:
        self._path = path
        self._location = location
        names = {"{table}": f'"{table}"', "{claim_index}": f'"{table}_claim"'}
        self._sql: dict[str, str] = {}
        for name, text in _QUERIES.items():
            for placeholder, identifier in names.items():
                text = text.replace(placeholder, identifier)  # names checked by open_table_queue
            self._sql[name] = text
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        # Any DatabaseError: "file is not a database" is as fatal here as "unable to open".
        await asyncio.to_thread(self._guarded, "cannot open", self._open, sqlite3.DatabaseError)

    async def enqueue(self, rows: Sequence[QueueRow], earliest: int) -> None:
        def run(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.executemany(self._sql["enqueue"], rows)

        await self._call("enqueue failed", run)

    async def claim(self, now: int, limit: int) -> list[str]:
        def run(conn: sqlite3.Connection) -> list[str]:
            """Tier by tier, highest priority first, until ``limit`` are found; then deleted."""
            claimed: list[str] = []
            with _immediate(conn):
                for (tier,) in conn.execute(self._sql["tiers"]).fetchall():
                    wanted = {"priority": tier, "now": now, "limit": limit - len(claimed)}
                    claimed += [row[0] for row in conn.execute(self._sql["claim_tier"], wanted)]
                    if len(claimed) >= limit:
                        break
                if claimed:
                    conn.execute(self._sql["remove"], {"ids": batch_json(claimed)})
            return claimed

        return await self._call("claim failed", run)

    async def remove(self, ids: Sequence[str]) -> None:
        def run(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(self._sql["remove"], {"ids": batch_json(list(ids))})

        await self._call("remove failed", run)

    async def missing(self, ids: Sequence[str]) -> list[str]:
        def run(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(self._sql["missing"], {"ids": batch_json(list(ids))})
            return [row[0] for row in rows]

        return await self._call("missing failed", run)

    async def earliest(self) -> int | None:
        def run(conn: sqlite3.Connection) -> int | None:
            value: int | None = conn.execute(self._sql["earliest"]).fetchone()[0]
            return value

        return await self._call("reading the earliest due time failed", run)

    async def size(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            count: int = conn.execute(self._sql["size"]).fetchone()[0]
            return count

        return await self._call("counting failed", run)

    async def listen(self) -> Never:
        raise NotImplementedError("SQLite cannot notify; TableDelayQueue polls instead")

    async def close(self) -> None:
        def run() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(run)

    # -- internals -------------------------------------------------------------------------

    def _open(self) -> None:
        conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
        )
        try:
            _use_wal(conn)
            # NORMAL survives a process crash; only a power loss can undo the newest commits,
            # which the scheduler's sweep then finds in the store.
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(f"BEGIN IMMEDIATE;\n{self._sql['schema']}\nCOMMIT;")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def _call(self, what: str, work: Callable[[sqlite3.Connection], _T]) -> _T:
        def run() -> _T:
            if self._conn is None:
                raise sqlite3.ProgrammingError("the queue's database is closed")
            return work(self._conn)

        return await asyncio.to_thread(self._guarded, what, run)

    def _guarded(
        self,
        what: str,
        work: Callable[[], _T],
        errors: type[sqlite3.Error] = sqlite3.OperationalError,
    ) -> _T:
        """Run ``work`` alone on the connection; ``errors`` (cannot open, locked too long, I/O,
        disk full) become one QueueUnavailableError line."""
        with self._lock:
            try:
                return work()
            except errors as exc:
                raise QueueUnavailableError(
                    f"queue {self._location}: {what}: {one_line(exc)}"
                ) from exc


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL. SQLite refuses the switch at once, without waiting out the busy
    timeout, while another connection writes (two processes creating one new file), so retry."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
