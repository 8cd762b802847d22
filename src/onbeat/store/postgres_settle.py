"""Settling a COMMIT that lost its answer on PostgreSQL: the connection dropped after the server
got the COMMIT, so it may have committed. ``PostgresStore._tx(settle=True)`` reads its
transaction's id and the server's start time just before COMMIT; on such a loss, ``committed``
asks the server, once it answers again, what became of that id (``pg_xact_status``).

Across a server restart the server's word on an id cannot be trusted: a crash loses the ids
whose WAL was not flushed and gives them out again, so "committed" may be another
transaction's. A write then reads as not committed, unless it brings a ``Witness``, a read of
what only it wrote (a new job's id): after a restart nothing from before it is still in progress,
so what the witness finds is the outcome.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool

from onbeat.errors import StoreOutcomeUnknownError
from onbeat.store.postgres_session import (
    UNREACHABLE,
    Row,
    StoreConnection,
    why,
)
from onbeat.store.sql_store import Witness

log = logging.getLogger("onbeat.store")
SETTLE_TIMEOUT = 15.0
"""Seconds a write whose COMMIT lost its answer waits for the server to say whether it committed
(a restart, even a crash recovery, answers within a few): past that the caller is told the
outcome is unknown."""
SETTLE_PAUSE = 0.1
"""Seconds between two asks while the server cannot say."""


def committed(
    pool: ConnectionPool[psycopg.Connection[Row]],
    status_sql: str,
    xid: int,
    server_started: datetime | None,
    lost: Exception,
    witness: Witness | None,
) -> bool:
    """Whether transaction ``xid``, whose COMMIT lost its answer, committed: ``pg_xact_status``
    (``status_sql``, the ``transaction_status`` statement), asked until the server says, for at
    most ``SETTLE_TIMEOUT`` seconds (StoreOutcomeUnknownError then). An id the server calls "in
    the future" is one a crash took back with everything it wrote.

    If the server restarted since ``server_started`` (when it had started, read before the
    COMMIT), the answer is the ``witness``'s, or else "not committed" whatever the status says
    (fault suite S6: a worker took a lost confirm for committed and started a run the store
    still had as unconfirmed, which then ran again elsewhere). A claim or confirm that did
    commit then reads as failed: its runs wait out their lease and run again, at least once,
    never twice at a time. A write that a retry would apply twice brings a witness (S6 again: a
    batch create committed at ``pg_ctl restart -m fast`` was answered 503, sent again, and the
    first copy's 50 jobs ran unacknowledged)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        try:
            with pool.connection(timeout=left) as conn:
                row = conn.execute(status_sql, {"xid": xid}).fetchone()
        except psycopg.errors.InvalidParameterValue:
            return False
        except UNREACHABLE:
            row = None
        if row is not None and row[1] != server_started:
            if witness is not None:
                found = _witnessed(pool, witness, deadline)
                log.info(
                    "a transaction whose COMMIT lost its answer across a server restart %s, as"
                    " what it wrote shows",
                    "committed" if found else "did not commit",
                )
                return found
            log.warning(
                "a transaction whose COMMIT lost its answer is taken as not committed: the"
                " server restarted since, and may have given its id to another transaction"
            )
            return False
        if row is not None and row[0] in ("committed", "aborted"):
            log.info("a transaction whose COMMIT lost its answer was %s", row[0])
            return bool(row[0] == "committed")
        time.sleep(min(SETTLE_PAUSE, max(0.0, deadline - time.monotonic())))
    raise StoreOutcomeUnknownError(
        f"PostgreSQL: {why(lost)}; the server did not say within {SETTLE_TIMEOUT:g}s"
        " whether the transaction committed"
    ) from lost


def _witnessed(
    pool: ConnectionPool[psycopg.Connection[Row]], witness: Witness, deadline: float
) -> bool:
    """What ``witness`` finds, asked until the server answers, up to ``deadline``."""
    while (left := deadline - time.monotonic()) > 0:
        try:
            with pool.connection(timeout=left) as conn:
                return witness(StoreConnection(conn))
        except UNREACHABLE:
            time.sleep(min(SETTLE_PAUSE, max(0.0, deadline - time.monotonic())))
    raise StoreOutcomeUnknownError(
        f"PostgreSQL: the server restarted and did not say within {SETTLE_TIMEOUT:g}s whether a"
        " transaction whose COMMIT lost its answer committed"
    )
