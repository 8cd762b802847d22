"""PostgresStore: the distributed backend of ``SQLStore``, on PostgreSQL through psycopg 3.

A connection pool serves the process; every write is a READ COMMITTED transaction whose reads lock
what its decision rests on (see ``sql/postgres/queries.sql``), so any number of schedulers, workers
and API processes share one database. A deadlock or serialization failure rolls the transaction
back and it runs again (``SQLStore`` retries it).

The store's clock is the database server's: read once at open and every ``CLOCK_RESYNC`` seconds,
and carried forward between reads on this host's monotonic clock, so every process on the store
agrees on "now" (a node whose wall clock is wrong cannot fire a run early or expire a lease) at
the cost of one query per resync, not one per transaction. A test passes a ``Clock`` instead
(River's ``coalesce(:now, now())``: the same FakeClock tests run on both backends).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from onbeat.batch_json import batch_json
from onbeat.clock import Clock
from onbeat.errors import (
    StoreOpenError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
    StoreWriteRefusedError,
)
from onbeat.model import JobEventKind
from onbeat.settings import DEFAULT_SHARDS, redact_url
from onbeat.store.base import SweepCursor
from onbeat.store.postgres_session import (
    CONNECT_TIMEOUT,
    IDLE_IN_TRANSACTION_TIMEOUT,
    POOL_SIZE,
    RECONNECT_TIMEOUT,
    UNREACHABLE,
    Row,
    StoreConnection,
    configure_session,
    postgres_queries,
    reconnect_at_once,
    row_factory,
    why,
)
from onbeat.store.postgres_settle import committed
from onbeat.store.queries import migrations
from onbeat.store.rows import MAX_US, to_us
from onbeat.store.sql_store import Connection, SQLStore, Witness
from onbeat.store.sql_store.history import DAY_US, day_date

log = logging.getLogger("onbeat.store")
CLOCK_RESYNC = 10.0
"""Seconds between reads of the database server's clock."""
CLOCK_READ_MAX_ROUND_TRIP = 0.5
"""A reading of the server's clock whose round trip took longer is not trusted (see
``PostgresStore._read_server_clock``)."""
Anchor = tuple[float, datetime]
"""(monotonic instant, the server's clock at it)."""
MIGRATION_LOCK = 7243000000
"""Advisory lock key: one process at a time applies migrations."""
_REFUSED = (psycopg.errors.DiskFull, psycopg.errors.ReadOnlySqlTransaction)
"""A write the server cannot take (as opposed to a bug or a lost connection)."""
_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
"""The server aborted the transaction for a conflict with another: it is run again."""
_BUSY = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected)
"""History upkeep's DDL gave way to the runs' transactions: it is tried again at the next pass."""
HISTORY_TABLES = ("execution_history", "attempts")
"""The tables partitioned by day of fire time, with the same bounds."""
STATISTICS_TABLES = ("jobs", "runs")
"""The tables statistics_refresh keeps up with: those the claim's and the finish's prepared
statements read by their ids, whose plans made on a near-empty store read them whole. Their other
plans, and the other tables' (the queue table's claim read three times the index entries once
analyzed), were chosen for tables never analyzed as much as for analyzed ones, and stay
autovacuum's to refresh."""
STATISTICS_MIN_PAGES = 32
"""statistics_refresh leaves smaller tables (256 KiB) to autovacuum: any plan reads them fast."""


class PostgresStore(SQLStore):
    """The Store on PostgreSQL: ``PostgresStore("postgresql://host/db")``."""

    dialect = "postgres"
    _q = postgres_queries()
    _retry_errors = _CONFLICTS

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        shard_count: int = DEFAULT_SHARDS,
        migrate: bool = True,
    ) -> None:
        """Connect, migrate (unless ``migrate`` is False) and set up the shards;
        StoreOpenError, naming the server, if the database cannot be reached or used."""
        self._url = url
        self._clock = clock
        self._waits_extend_leases = clock is None
        self._write_refused: str | None = None
        self._clock_lock = threading.Lock()
        self._server_anchor: Anchor | None = None
        self._resyncing = False
        self._pool: ConnectionPool[psycopg.Connection[Row]] = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_SIZE,
            kwargs={"row_factory": row_factory, "autocommit": True},
            configure=configure_session,
            timeout=CONNECT_TIMEOUT,
            reconnect_timeout=RECONNECT_TIMEOUT,
            reconnect_failed=reconnect_at_once,
            open=False,
            name="onbeat",
        )
        try:
            # One direct connection first: an unreachable server or a refused login fails here at
            # once, with the server's reason, instead of as the pool's retries and timeout.
            psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT)).close()
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT)
            if migrate:
                self.migrate()
            with self._tx() as c:
                c.executemany(self._q["shard_init"], [{"shard": s} for s in range(shard_count)])
                self.shard_count: int = c.execute(self._q["shard_count"]).fetchone()[0]
            if clock is None:  # read at open: the first now() does not wait for the server
                self._server_anchor = self._read_server_clock()
        except (psycopg.Error, PoolTimeout, StoreWriteRefusedError) as exc:
            self._pool.close()
            raise StoreOpenError(redact_url(url), why(exc)) from exc

    # --- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _tx(
        self, settle: bool = False, witness: Witness | None = None
    ) -> Iterator[StoreConnection]:
        """A write transaction. A connection lost before COMMIT was sent changed nothing
        (StoreUnavailableError); one lost in COMMIT leaves the outcome unknown, for the server
        may have committed before its answer was lost. With ``settle`` the transaction's id is
        read before COMMIT and, on such a loss, the server asked once it answers again whether
        it committed (``postgres_settle``; across a restart, the ``witness`` if any): if it
        did, the block's results stand and the loss is no error. Otherwise
        StoreUnavailableError, or without ``settle`` StoreOutcomeUnknownError."""
        committing, xid, server_started = False, None, None
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield StoreConnection(conn)
                if settle:
                    settling = conn.execute(self._q["transaction_id_if_assigned"]).fetchall()
                    xid, server_started = settling[0]
                committing = True
        except _REFUSED as exc:
            if self._write_refused is None:
                log.error("the store refuses writes: %s", exc)
            self._write_refused = str(exc).strip()
            raise StoreWriteRefusedError(self._write_refused) from exc
        except _CONFLICTS:
            raise  # SQLStore runs the transaction again
        except UNREACHABLE as exc:
            unreachable = self._unreachable(exc)
            if not committing or isinstance(exc, psycopg.errors.IdleInTransactionSessionTimeout):
                raise unreachable from exc  # the server rolled it back
            if not settle:
                raise StoreOutcomeUnknownError(f"PostgreSQL: {why(exc)}") from exc
            if xid is None:
                return  # it wrote nothing: its reads stand, committed or not
            status_sql = self._q["transaction_status"]
            if not committed(self._pool, status_sql, xid, server_started, exc, witness):
                raise unreachable from exc

    @contextmanager
    def _read(self) -> Iterator[StoreConnection]:
        try:
            with self._pool.connection() as conn:
                yield StoreConnection(conn)
        except UNREACHABLE as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: Exception) -> StoreUnavailableError:
        """The error to raise for ``exc``. A failed connection first has the pool's idle ones
        checked: after a server restart or ``pg_terminate_backend`` every pooled connection is
        dead, and without the check each would fail one pass of its own (and back it off)."""
        if isinstance(exc, psycopg.OperationalError) and not self._pool.closed:
            self._pool.check()
        return StoreUnavailableError(f"PostgreSQL: {why(exc)}")

    def _lock_jobs_of_runs(self, c: Connection, execution_ids: Sequence[str]) -> None:
        if execution_ids:
            c.execute(self._q["jobs_lock_of_runs"], {"ids": batch_json(list(execution_ids))})

    def _lock_shard_map(self, c: Connection) -> None:
        c.execute(self._q["shard_map_lock"])

    def _insert_jobs(self, c: Connection, rows: Sequence[Mapping[str, Any]], now: int) -> None:
        """One statement over the batch as a JSON array: the jobs' INSERT ... RETURNING feeds
        the events' (a pipelined statement per job cost a keyed batch create about a third of
        its client CPU, and the jobs were read back after)."""
        params = {"rows": batch_json(rows), "now": now, "kind": JobEventKind.CREATED.value}
        c.execute(self._q["jobs_insert_created"], params)

    def _insert_runs(
        self, c: Connection, rows: Sequence[Mapping[str, Any]], new_jobs: bool
    ) -> set[str]:
        """One statement over the batch as a JSON array; its ``RETURNING`` says which were
        inserted (a pipelined statement per run, then a read of which exist, cost a dispatch
        page a round of parse, bind and execute per run)."""
        found = c.execute(self._q["executions_insert_many"], {"rows": batch_json(rows)})
        return {r[0] for r in found}

    def _start_runs(
        self, c: Connection, ids: Sequence[str], owner: str, lease_expires_at: int, now: int
    ) -> list[Row]:
        """One statement: the runs' UPDATE ... RETURNING feeds the attempts' INSERT."""
        if not ids:
            return []
        params = {"ids": batch_json(list(ids)), "owner": owner, "now": now}
        params |= {"lease_expires_at": lease_expires_at, "waited": self._waits_extend_leases}
        rows: list[Row] = c.execute(self._q["execution_start_many"], params).fetchall()
        return rows

    def _confirm_runs(
        self, c: Connection, owner: str, held: Mapping[str, int], now: int, lease_expires_at: int
    ) -> dict[str, int]:
        """One statement: the runs' UPDATE ... RETURNING feeds the attempts' INSERT."""
        if not held:
            return {}
        params = {"held": batch_json(dict(held)), "owner": owner, "now": now}
        params |= {"lease_expires_at": lease_expires_at, "waited": self._waits_extend_leases}
        return {
            r["id"]: r["fencing_token"]
            for r in c.execute(self._q["execution_confirm_many"], params)
        }

    def _sweep_rows(
        self, owned: list[int], before: int, limit: int, after: SweepCursor | None
    ) -> list[Row]:
        """One statement over every held shard: a page reads the rows after the cursor, not the
        whole backlog, and costs no round trip per shard (1,024 of them took 0.6-2.6 s a pass
        on a busy box)."""
        after_key = (-1, -MAX_US, "")
        if after is not None:
            after_key = (after.shard, to_us(after.due_at), after.execution_id)
        with self._read() as c:
            return c.execute(
                self._q["execution_sweep_shards"],
                {
                    "shards": batch_json(owned),
                    "before": before,
                    "after_shard": after_key[0],
                    "after_due_at": after_key[1],
                    "after_id": after_key[2],
                    "limit": limit,
                },
            ).fetchall()

    def _finish_final(self, c: Connection, finishes: Sequence[Mapping[str, Any]]) -> None:
        """One statement per batch: the attempts' UPDATE, the runs' DELETE ... RETURNING into the
        history's INSERT, and the one-shot jobs' completion."""
        if finishes:
            c.execute(
                self._q["execution_finish_final"],
                {"finishes": batch_json(list(finishes)), "now": finishes[0]["now"]},
            )

    def _set_next_fires(self, c: Connection, heads: Mapping[str, int | None], now: int) -> None:
        """One statement over the batch (``jobs_set_next_fire_many``), not one per job: a
        dispatch page of 5,000 cron runs sent 5,000 statements."""
        if heads:
            c.execute(self._q["jobs_set_next_fire_many"], {"heads": batch_json(heads), "now": now})

    def _move_final(self, c: Connection, ids: str) -> None:
        """One data-modifying CTE: DELETE ... RETURNING into the history's INSERT."""
        c.execute(self._q["runs_archive"], {"ids": ids})

    # --- day partitions of the history (HistoryTransactions' hooks) ---------------------------
    def _day_partitions(self, c: Connection, parent: str) -> set[int]:
        """The days that have a partition of ``parent``."""
        return {
            _day_number(r["name"][-8:])
            for r in c.execute(self._q["partitions_of"], {"parent": parent})
        }

    def _create_day_partitions(self, days: Sequence[int]) -> list[str]:
        """Each missing day partition in a transaction of its own, under the maintenance lock:
        lock the DEFAULT partition (no run lands there meanwhile), create the day's table, move
        the day's rows out of DEFAULT into it, ATTACH it."""
        created = []
        for parent in HISTORY_TABLES:
            with self._read() as c:
                missing = [d for d in days if d not in self._day_partitions(c, parent)]
            for day in missing:
                name = f"{parent}_p{day_date(day)}"
                with self._maintenance_tx() as c:
                    if day in self._day_partitions(c, parent):
                        continue  # another scheduler created it meanwhile
                    ddl: dict[str, object] = {"parent": parent, "partition": name}
                    ddl |= {"lo": day * DAY_US, "hi": (day + 1) * DAY_US}
                    c.execute(self._q["partition_lock_default"].format(**ddl))
                    c.execute(self._q["partition_create"].format(**ddl))
                    c.execute(self._q["partition_fill"].format(**ddl))
                    c.execute(self._q["partition_attach"].format(**ddl))
                created.append(name)
        if created:
            log.info("created history partitions %s", ", ".join(created))
        return created

    def _drop_day_partitions(self, first_kept: int, protected: Sequence[int]) -> list[str]:
        """Detach and drop a day's partitions (history and attempts) in one transaction each day;
        a day whose DETACH cannot get its lock within lock_timeout is left to the next pass."""
        with self._read() as c:
            days = set().union(*(self._day_partitions(c, parent) for parent in HISTORY_TABLES))
        dropped = []
        for day in sorted(d for d in days if d < first_kept and d not in protected):
            names = [f"{parent}_p{day_date(day)}" for parent in HISTORY_TABLES]
            try:
                with self._maintenance_tx() as c:
                    for parent, name in zip(HISTORY_TABLES, names, strict=True):
                        if day not in self._day_partitions(c, parent):
                            continue  # dropped meanwhile
                        ddl = {"parent": parent, "partition": name}
                        c.execute(self._q["partition_detach"].format(**ddl))
                        c.execute(self._q["partition_drop"].format(**ddl))
                        dropped.append(name)
            except (StoreUnavailableError, psycopg.errors.DeadlockDetected) as exc:
                cause = exc.__cause__ if isinstance(exc, StoreUnavailableError) else exc
                if not isinstance(cause, _BUSY):
                    raise
                log.warning("history partitions of %s are busy; dropped at a later pass", day)
        if dropped:
            log.info("dropped history partitions past the retention: %s", ", ".join(dropped))
        return dropped

    def statistics_refresh(self) -> list[str]:
        """Each table in a transaction of its own, under the try-lock; a table a vacuum holds
        is left to the next pass (its ANALYZE waits at most ``lock_timeout_brief``, which
        gives up before its wait would cancel autovacuum's work on the table)."""
        with self._read() as c:
            args = {"tables": batch_json(STATISTICS_TABLES), "min_pages": STATISTICS_MIN_PAGES}
            behind = [r["relname"] for r in c.execute(self._q["tables_behind_statistics"], args)]
        analyzed = []
        for table in behind:
            try:
                with self._tx() as c:
                    if not c.execute(self._q["statistics_lock"]).fetchone()["taken"]:
                        break  # another scheduler's pass
                    c.execute(self._q["lock_timeout_brief"])
                    c.execute(self._q["statistics_target_low"])
                    c.execute(self._q["table_analyze"].format(table=table))  # one of ours
                analyzed.append(table)
            except StoreUnavailableError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                    raise
                log.debug("%s is being vacuumed; analyzed at a later pass", table)
        if analyzed:
            log.info("analyzed %s: they outgrew their planner statistics", ", ".join(analyzed))
        return analyzed

    @contextmanager
    def _maintenance_tx(self) -> Iterator[StoreConnection]:
        """A transaction of history upkeep: one process at a time, and a DDL lock waited for at
        most ``lock_timeout`` (a DDL waiting longer would hold up every run behind it)."""
        with self._tx() as c:
            c.execute(self._q["history_maintenance_lock"])
            c.execute(self._q["lock_timeout_short"])
            yield c

    def migrate(self) -> list[int]:
        """Apply the migrations not applied yet, each in its own transaction, one process at a
        time; returns the versions applied."""
        applied = []
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS onbeat_migrations"
                " (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM onbeat_migrations")}
            for version, script in migrations("postgres"):
                if version in done:
                    continue
                conn.execute(script.encode())  # no parameters: many statements in one go
                conn.execute(
                    "INSERT INTO onbeat_migrations VALUES (%s, %s)", (version, self._now_us())
                )
                applied.append(version)
        return applied

    def write_refusal(self) -> str | None:
        if self._write_refused is None:
            return None
        try:
            with self._tx() as c:
                c.execute("CREATE TEMP TABLE onbeat_write_probe (filler bytea) ON COMMIT DROP")
                c.execute(
                    "INSERT INTO onbeat_write_probe VALUES (decode(repeat('00', 65536), 'hex'))"
                )
        except StoreWriteRefusedError:
            return self._write_refused
        log.warning("the store accepts writes again")
        self._write_refused = None
        return None

    def session_end_stalled(self) -> int:
        """The server's ``idle_in_transaction_session_timeout``, enforced on our sessions where
        the server does not: one frozen mid-pipeline shows ``active``, and one frozen after a
        pipelined ``executemany`` is idle with its timer off (psycopg sends a Flush after the
        pipeline's Sync, and PostgreSQL stops the timer on every message it reads but starts it
        again only at a Sync)."""
        with self._read() as c:
            ended = c.execute(
                self._q["sessions_end_stalled"], {"after": IDLE_IN_TRANSACTION_TIMEOUT}
            ).fetchall()
        return len(ended)

    wakes_other_processes = True

    def notify_dispatch(self) -> None:
        """Wake the schedulers of other processes on this database and schema (they LISTEN on
        ``dispatch_channel``; see ``onbeat.dispatch_wake``): work is due within their window.
        Sent right after the submission committed; StoreUnavailableError if it cannot be."""
        with self._read() as c:
            c.execute(f"SELECT pg_notify({DISPATCH_CHANNEL_SQL}, '')")

    def close(self) -> None:
        self._pool.close()

    def now(self) -> datetime:
        """The injected clock's time, else the server's carried forward from the last read on
        the monotonic clock. A read older than ``CLOCK_RESYNC`` is renewed in a thread of its
        own: an event loop asking the time never waits for the server (nor for a server that
        is down: the last reading goes on being carried forward)."""
        if self._clock is not None:
            return self._clock.now()
        with self._clock_lock:
            anchor = self._server_anchor
            if anchor is None:  # at open: the first reading, however slow (the next renews it)
                anchor = self._server_anchor = self._read_server_clock(math.inf)
            elif time.monotonic() - anchor[0] > CLOCK_RESYNC and not self._resyncing:
                self._resyncing = True
                threading.Thread(target=self._resync, name="onbeat-clock", daemon=True).start()
        return anchor[1] + timedelta(seconds=time.monotonic() - anchor[0])

    def _read_server_clock(self, max_round_trip: float = CLOCK_READ_MAX_ROUND_TRIP) -> Anchor:
        """The server's clock and the monotonic instant it stands for: the end of the round trip,
        so "now" is never ahead of the server's, and behind by the round trip at most. (The
        middle would halve the error but let it be ahead: a worker starting a run it claimed
        ahead at its instant started it early, by half of a 116 ms read at a restart in N1.)
        A round trip longer than
        ``max_round_trip`` is refused (StoreUnavailableError): the process paused, or the answer
        waited, between the server's reading and ours, and an anchor taken then would put this
        process's "now" behind by the pause (its leases born expired, due runs not yet due)."""
        with self._read() as c:
            sent = time.monotonic()
            row = c.execute("SELECT clock_timestamp()").fetchone()
            answered = time.monotonic()
        if answered - sent > max_round_trip:
            raise StoreUnavailableError(
                f"PostgreSQL: reading its clock took {answered - sent:.2f}s; not trusted"
            )
        assert row is not None
        server: datetime = row[0]
        return answered, server.astimezone(UTC)

    def _resync(self) -> None:
        try:
            anchor = self._read_server_clock()
        except Exception as exc:  # down or closing: carry the last reading on, try again later
            log.debug("reading the server's clock failed: %s", exc)
            with self._clock_lock:
                assert self._server_anchor is not None  # set at open; resyncs renew it
                mono, server = self._server_anchor
                now = time.monotonic()
                self._server_anchor = (now, server + timedelta(seconds=now - mono))
                self._resyncing = False
            return
        with self._clock_lock:
            self._server_anchor, self._resyncing = anchor, False


DISPATCH_CHANNEL_SQL = "left('onbeat_dispatch_' || current_schema(), 63)"
"""The NOTIFY channel of dispatch wake-ups, per schema, so that two stores in one database
(tests, or two deployments) do not wake each other's schedulers."""


def pending_migrations(url: str) -> list[int]:
    """The migration versions the database at ``url`` has not applied, oldest first. Reads only;
    StoreOpenError if it cannot be reached."""
    versions = [version for version, _ in migrations("postgres")]
    try:
        with psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT)) as conn:
            if conn.execute("SELECT to_regclass('onbeat_migrations')").fetchone() == (None,):
                return versions
            applied = {r[0] for r in conn.execute("SELECT version FROM onbeat_migrations")}
    except psycopg.Error as exc:
        raise StoreOpenError(redact_url(url), why(exc)) from exc
    return [v for v in versions if v not in applied]


def _day_number(yyyymmdd: str) -> int:
    """The UTC day number of a partition's ``YYYYMMDD`` suffix."""
    return int(datetime.strptime(yyyymmdd, "%Y%m%d").replace(tzinfo=UTC).timestamp()) // 86_400
