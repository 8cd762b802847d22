"""A PostgreSQL session as ``PostgresStore`` uses it: the pool's sizes and timeouts, how its
reconnects behave and are logged, each session's settings, the rows it reads, and the connection
shape ``SQLStore``'s transactions are written against (sqlite3's)."""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import RowMaker
from psycopg_pool import ConnectionPool, PoolTimeout

from onbeat.store.queries import load_queries
from onbeat.store.sql_store import Cursor

POOL_SIZE = 8
"""Connections per process: a worker's claim, heartbeat and finish loops and a scheduler's timers
each hold one for the length of one transaction."""
CONNECT_TIMEOUT = 10.0
"""No healthy process idles this long between two statements of a transaction, even on a busy
box; a shorter shard lease TTL (tests) does not make the timeout shorter than this."""
RECONNECT_TIMEOUT = 2.0
"""Seconds a pool's connection attempts back off (1 s, then 1 s) before they give up and start
again (``reconnect_at_once``): while the server is down, a pool tries about once a second.
psycopg_pool's own default (300 s) doubles the wait after every failure, so a process could come
back half a minute after its server, and by then its runs' leases had run out: they ran twice."""
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class QuietPoolReconnects(logging.Filter):
    """psycopg_pool logs each failed connection attempt as a WARNING, and each give-up after
    ``RECONNECT_TIMEOUT`` (which ``reconnect_at_once`` turns into a new start, not an end): about
    1.5 lines a second per pool of every process while the server is away. This keeps a pool's
    first failure, then one line per ``REPEAT_AFTER`` seconds with how many it held back, and
    drops the give-ups. onbeat's own logs say what the outage costs (store and queue calls)."""

    CONNECT_FAILED = "error connecting in %r: %s"
    GAVE_UP = "reconnection attempt in pool %r failed after %s sec"
    REPEAT_AFTER = 30.0

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}
        """pool name -> (when its last failure was logged, failures held back since)"""

    def forget(self) -> None:
        """Hold back nothing logged so far (a test that counts a pool's lines starts afresh)."""
        with self._lock:
            self._last.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == self.GAVE_UP:
            return False
        if record.msg != self.CONNECT_FAILED or not isinstance(record.args, tuple):
            return True
        pool, now = str(record.args[0]), self._monotonic()
        with self._lock:
            logged_at, held = self._last.get(pool, (-math.inf, 0))
            if now - logged_at < self.REPEAT_AFTER:
                self._last[pool] = (logged_at, held + 1)
                return False
            self._last[pool] = (now, 0)
        if held:
            record.msg += " (%d more failures of this pool held back)"
            record.args = (*record.args, held)
        return True


POOL_LOG_FILTER = QuietPoolReconnects()
"""The filter on psycopg_pool's logger (one per process: pools are told apart by name)."""
logging.getLogger("psycopg.pool").addFilter(POOL_LOG_FILTER)


def reconnect_at_once(pool: ConnectionPool[Any]) -> None:
    """A pool whose attempts gave up tries again at once: a caller waiting for a connection gets
    one within a second of the server's return, not at its timeout."""
    if not pool.closed:
        pool.check()


def postgres_queries() -> dict[str, str]:
    """The named statements, with ``:name`` parameters turned into psycopg's ``%(name)s``."""
    return {
        name: _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
        for name, sql in load_queries("postgres").items()
    }


class Row:
    """A result row read by column name or position, like ``sqlite3.Row``."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: Mapping[str | int, int], values: Sequence[Any]) -> None:
        self._index = index
        """Column name -> position, and each position -> itself: one look-up either way (the
        hot path reads ~30 columns a run by name)."""
        self._values = values

    def __getitem__(self, key: str | int) -> Any:
        return self._values[self._index[key]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def keys(self) -> list[str]:
        return [key for key in self._index if isinstance(key, str)]


_ROW_INDEXES: dict[tuple[bytes | None, ...], Mapping[str | int, int]] = {}
"""A result's column names -> its ``Row`` index, made once per shape of result (one per
statement of queries.sql, in practice)."""
_ROW_INDEXES_MAX = 1_000


def row_factory(cursor: psycopg.Cursor[Any]) -> RowMaker[Row]:
    """Rows of the current result, indexed by its column names read off the raw result: psycopg's
    ``cursor.description`` builds a ``Column`` object per column on every call (37 us for the 40
    columns of a claim's candidates), and each statement's result asked for it again."""
    result = cursor.pgresult
    names = () if result is None else tuple(map(result.fname, range(result.nfields)))
    index = _ROW_INDEXES.get(names)
    if index is None:
        built: dict[str | int, int] = {
            (name or b"?column?").decode(): i for i, name in enumerate(names)
        }
        built.update((i, i) for i in range(len(names)))
        if len(_ROW_INDEXES) >= _ROW_INDEXES_MAX:  # ad-hoc SQL of many shapes: start afresh
            _ROW_INDEXES.clear()
        index = _ROW_INDEXES[names] = built
    return partial(Row, index)


PLANNED_EVERY_CALL = frozenset({"execution_dispatch_candidates"})
"""Statements never prepared, so each call is planned for the tables as they are then. psycopg
prepares a statement on its sixth call, and the server keeps that generic plan until the tables
are next analyzed. The scheduler polls for due runs every ``poll_interval`` from the moment it
starts, on a store still empty: the plan it then kept read every job once per run (a nested
loop over a scan of ``jobs``), and the first herd after a deploy (S8-full: 6,000 runs due at
one instant) waited 6 s for its dispatch, 34 ms planned for the tables it met. Planning costs
this statement 1-3 ms a call."""

_PLANNED_EVERY_CALL_SQL = frozenset(postgres_queries()[name] for name in PLANNED_EVERY_CALL)


class StoreConnection:
    """A psycopg connection with sqlite3's ``execute``/``executemany`` shape."""

    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Mapping[str, Any] | None = None, /) -> Cursor:
        if sql in _PLANNED_EVERY_CALL_SQL:
            return self._conn.execute(sql, parameters, prepare=False)
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Mapping[str, Any]], /) -> None:
        """psycopg's ``executemany`` pipelines the batch and syncs at its end: for one row (a
        single job created, a run finished alone) that costs a round trip and CPU more than a
        plain ``execute`` (254 against 137 us, 59 against 40 us of CPU in a loop)."""
        batch = list(parameters)
        if len(batch) == 1:
            self._conn.execute(sql, batch[0])
        elif batch:
            with self._conn.cursor() as cursor:
                cursor.executemany(sql, batch)


IDLE_IN_TRANSACTION_TIMEOUT = 2.0
"""Seconds the server lets a session of ours sit idle inside a transaction before ending it. Our
transactions send their statements back to back (milliseconds); a session idle that long in one
belongs to a process frozen mid-transaction (SIGSTOP, a VM pause, a debugger), whose row locks
(a run's, the fleet's in-flight counter every claim, outcome and reap takes) would otherwise stall
the whole fleet for as long as it stays frozen. It stays well under any sane ``lease_ttl``."""


SESSION_MARKER_LOCK = 7243000003
"""Advisory lock key every store session holds, shared, for as long as it lives: it tells
onbeat's sessions from another application's (or an administrator's) in ``pg_locks``, so
``session_end_stalled`` ends only ours. Taken in the same simple query as the settings."""


def configure_session(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        f"SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_TIMEOUT * 1000)};"
        f" SELECT pg_advisory_lock_shared({SESSION_MARKER_LOCK})"
    )


UNREACHABLE = (
    psycopg.OperationalError,
    PoolTimeout,
    psycopg.errors.IdleInTransactionSessionTimeout,
)
"""The server cannot be reached (down, restarting, connection lost, or the session ended because
this process stalled inside a transaction): StoreUnavailableError."""


def why(exc: BaseException) -> str:
    """The first line of an error's message, for the store's own errors."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
