"""SQLiteStore: the embedded store, one file in WAL mode.

One connection guarded by a lock serves the process (SQLite has a single writer anyway); other
processes on the same file (a script calling ``app.schedule``) wait on ``busy_timeout``. Every
write is a ``BEGIN IMMEDIATE`` transaction, so the read-decide-write steps of claim, dispatch and
finish are atomic across processes. The store's clock is the injected ``Clock``: every process on
one file shares the machine's clock.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from onbeat.batch_json import batch_json
from onbeat.clock import Clock, SystemClock
from onbeat.errors import StoreOpenError, StoreWriteRefusedError
from onbeat.model import JobEventKind
from onbeat.settings import DEFAULT_SHARDS
from onbeat.store.queries import load_queries, migrations
from onbeat.store.sql_store import Connection, Row, SQLStore, Witness

Q = load_queries("sqlite")
BUSY_TIMEOUT = 30.0
"""Seconds a connection waits for another process's lock before giving up."""
WRITE_PROBE_BYTES = 64 * 1024
"""What the write probe stores (and drops): as much as the largest job's params."""
_WRITE_REFUSALS = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN}
)
"""Primary result codes of a write the database cannot take (as opposed to a bug or a lock)."""
log = logging.getLogger("onbeat.store")


class SQLiteStore(SQLStore):
    """The embedded backend of ``SQLStore``."""

    dialect = "sqlite"
    _q = Q

    def __init__(
        self, path: str | Path, clock: Clock | None = None, shard_count: int = DEFAULT_SHARDS
    ) -> None:
        """Open (creating if need be) and migrate the database at ``path``; StoreOpenError if it
        cannot be."""
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._write_refused: str | None = None
        try:
            self._conn = sqlite3.connect(
                str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
            )
        except sqlite3.Error as exc:
            raise _open_error(Path(path), exc) from exc
        try:
            self._conn.row_factory = sqlite3.Row
            self._use_wal()
            # NORMAL survives a process crash (kill -9); only a power loss can roll back the newest commits.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
            with self._tx() as c:
                if c.execute(Q["shard_count"]).fetchone()[0] == 0:
                    c.executemany(Q["shard_init"], [{"shard": s} for s in range(shard_count)])
                self.shard_count: int = c.execute(Q["shard_count"]).fetchone()[0]
        except (sqlite3.Error, StoreWriteRefusedError) as exc:
            self._conn.close()
            raise _open_error(Path(path), exc) from exc

    # --- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _tx(
        self, settle: bool = False, witness: Witness | None = None
    ) -> Iterator[sqlite3.Connection]:
        """A write transaction. A write the database refuses (disk full, read-only file, I/O
        error) is rolled back, remembered (``write_refusal``) and raised as
        StoreWriteRefusedError; a failed COMMIT is rolled back too, so the connection never
        stays inside a dead transaction. (Nothing to ``settle``: the file is local, so a COMMIT
        either commits or fails and changes nothing, and no ``witness`` is needed.)"""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _WRITE_REFUSALS:
                    raise
                if self._write_refused is None:
                    log.error("the store refuses writes: %s", exc)
                self._write_refused = str(exc)
                raise StoreWriteRefusedError(str(exc)) from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._conn

    wakes_other_processes = False

    def notify_dispatch(self) -> None:
        """Nothing to do: schedulers sharing a SQLite file poll it (in one process, the App's
        submit listeners wake the scheduler)."""

    def session_end_stalled(self) -> int:
        """Nothing to end: the file's locks are this process's."""
        return 0

    def statistics_refresh(self) -> list[str]:
        """Nothing to do: SQLite plans each statement from its fixed heuristics (no ANALYZE
        is ever run on the file), so no plan depends on a table's size when it was prepared."""
        return []

    def write_refusal(self) -> str | None:
        if self._write_refused is None:
            return None  # nothing was refused: no need to touch the disk
        try:
            with self._tx() as c:
                c.execute(Q["write_probe_create"])
                c.execute(Q["write_probe_fill"], {"bytes": WRITE_PROBE_BYTES})
                c.execute(Q["write_probe_drop"])
        except StoreWriteRefusedError:
            return self._write_refused
        log.warning("the store accepts writes again")
        self._write_refused = None
        return None

    def _use_wal(self) -> None:
        """Put the file in WAL mode. The switch needs the file to itself for a moment, and SQLite
        refuses it at once, without waiting out busy_timeout, while another connection is writing
        (another node setting up the same new file, say): so it is retried until the timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        pause = 0.001
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if (
                    exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY
                    or time.monotonic() > deadline
                ):
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def _migrate(self) -> None:
        with self._tx() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS onbeat_migrations"
                " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
            )
            done = {row[0] for row in c.execute("SELECT version FROM onbeat_migrations")}
            for version, script in migrations("sqlite"):
                if version in done:
                    continue
                for statement in script.split(";\n"):
                    if statement.strip():
                        c.execute(statement)
                c.execute("INSERT INTO onbeat_migrations VALUES (?, ?)", (version, self._now_us()))

    def _insert_runs(
        self, c: Connection, rows: Sequence[Mapping[str, Any]], new_jobs: bool
    ) -> set[str]:
        """``executemany`` (no round trip in SQLite), then which were inserted, unless the jobs
        are new."""
        c.executemany(Q["execution_insert"], rows)
        ids = [row["id"] for row in rows]
        if new_jobs:
            return set(ids)
        return {r[0] for r in c.execute(Q["executions_existing"], {"ids": batch_json(ids)})}

    def _insert_jobs(self, c: Connection, rows: Sequence[Mapping[str, Any]], now: int) -> None:
        """The jobs, then their events: SQLite has no data-modifying CTE (and its
        ``executemany`` costs no round trip)."""
        c.executemany(Q["job_insert"], rows)
        kind = JobEventKind.CREATED.value
        events = [{"id": row["id"], "kind": kind, "now": now} for row in rows]
        c.executemany(Q["job_event_insert"], events)

    def _start_runs(
        self, c: Connection, ids: Sequence[str], owner: str, lease_expires_at: int, now: int
    ) -> list[Row]:
        params = {"ids": batch_json(list(ids)), "owner": owner, "now": now}
        params["lease_expires_at"] = lease_expires_at
        started: list[Row] = c.execute(Q["execution_start_many"], params).fetchall()
        return started

    def _confirm_runs(
        self, c: Connection, owner: str, held: Mapping[str, int], now: int, lease_expires_at: int
    ) -> dict[str, int]:
        params = {"held": batch_json(dict(held)), "owner": owner, "now": now}
        params["lease_expires_at"] = lease_expires_at
        started = c.execute(Q["execution_confirm_many"], params).fetchall()
        return {row["id"]: row["fencing_token"] for row in started}

    def _finish_final(self, c: Connection, finishes: Sequence[Mapping[str, Any]]) -> None:
        """Write the attempts, copy the runs to the history, then delete them (SQLite has no
        data-modifying CTE), wake the runs waiting for them, and complete the one-shot jobs."""
        c.executemany(Q["attempt_end"], [{**f, "worker": None} for f in finishes])
        c.executemany(Q["execution_finish_final"], finishes)
        c.executemany(Q["execution_finish_final_delete"], finishes)
        if finishes:
            self._wake_waiting(c, [f["job_id"] for f in finishes], finishes[0]["now"])
        self._complete_one_shots(c, finishes)

    def _set_next_fires(self, c: Connection, heads: Mapping[str, int | None], now: int) -> None:
        """One statement per job: in-process, a statement costs no round trip."""
        c.executemany(
            self._q["job_set_next_fire"],
            [{"id": job_id, "next_fire_at": fire, "now": now} for job_id, fire in heads.items()],
        )

    def _move_final(self, c: Connection, ids: str) -> None:
        """Copy, then delete: SQLite has no data-modifying CTE."""
        c.execute(Q["runs_archive"], {"ids": ids})
        c.execute(Q["runs_delete_final"], {"ids": ids})

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def now(self) -> datetime:
        return self._clock.now()


def _open_error(path: Path, exc: sqlite3.Error | StoreWriteRefusedError) -> StoreOpenError:
    """Why SQLite could not open ``path``, in words a user can act on."""
    location = str(path.absolute())
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
        return StoreOpenError(location, "the file is not an SQLite database")
    try:
        if path.is_dir():
            return StoreOpenError(location, "it is a directory")
        if not path.parent.is_dir():
            return StoreOpenError(location, f"directory {path.parent.absolute()} does not exist")
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            return StoreOpenError(location, "permission denied (it must be readable and writable)")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            return StoreOpenError(location, f"permission denied on {path.parent.absolute()}")
    except PermissionError:
        return StoreOpenError(location, "permission denied")
    return StoreOpenError(location, str(exc))
