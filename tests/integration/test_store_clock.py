"""An App given no clock tells time by the PostgreSQL server, not by its host
(docs/architecture.md, "Clock"): a host whose wall clock is an hour ahead must not see runs due an
hour early nor other processes' shard and run leases as expired.

The bug this guards against: ``App`` handed its default ``SystemClock`` to ``open_store``, so
``PostgresStore.now()`` returned the host's wall clock and the server's clock was never read
(found by the fault suite's S7, a worker and a scheduler under libfaketime)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from onbeat import App
from onbeat.clock import SystemClock
from onbeat.errors import StoreUnavailableError
from onbeat.store.postgres import CLOCK_RESYNC, PostgresStore
from onbeat.testing.postgres import fresh_schema

pytestmark = pytest.mark.external_service

SKEW = timedelta(hours=1)
AGREE = timedelta(seconds=1)
"""How close the store's time is to the server's own reading (a query's round trip, a busy box)."""
PAUSE = 2 * AGREE.total_seconds()
SLOW_TRIP = 0.3
"""Within ``CLOCK_READ_MAX_ROUND_TRIP``: a reading this slow is trusted."""


@pytest.fixture
def database_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def host_an_hour_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host's wall clock (what ``SystemClock`` reads) is an hour ahead of the server's."""
    monkeypatch.setattr(SystemClock, "now", lambda _self: datetime.now(UTC) + SKEW)


def _pause_reads(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, *, before: float = 0, after: float = 0
) -> None:
    """Each query of the store's reads waits ``before`` seconds before it is sent and ``after``
    seconds once the server has answered, before the process looks at the answer."""
    read = store._read

    @contextlib.contextmanager
    def paused_read() -> Iterator[Any]:
        with read() as c:
            real_execute = c.execute

            def execute(query: str, *args: Any) -> Any:
                time.sleep(before)
                cursor = real_execute(query, *args)
                time.sleep(after)
                return cursor

            monkeypatch.setattr(c, "execute", execute)
            yield c

    monkeypatch.setattr(store, "_read", paused_read)


def server_now(database_url: str) -> datetime:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    server: datetime = row[0]
    return server


@pytest.mark.usefixtures("host_an_hour_ahead")
def test_app__store_and_components_tell_the_servers_time_not_the_hosts(database_url: str) -> None:
    app = App(database_url, database_url)
    try:
        assert abs(app.store.now() - server_now(database_url)) < AGREE
        # What the node hands its queue, worker and scheduler.
        assert abs(app.clock.now() - server_now(database_url)) < AGREE
    finally:
        app.close()


@pytest.mark.usefixtures("host_an_hour_ahead")
def test_app__an_injected_clock_is_the_stores(database_url: str) -> None:
    clock = SystemClock()
    app = App(database_url, database_url, clock=clock)
    try:
        assert app.clock is clock
        assert app.store.now() - server_now(database_url) > SKEW - AGREE
    finally:
        app.close()


def test_postgres_store__a_stale_reading_is_renewed_without_the_caller_waiting(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(database_url)
    try:
        reading = threading.Event()
        release = threading.Event()
        read = store._read_server_clock

        def slow_read() -> tuple[float, datetime]:
            reading.set()
            release.wait(10)
            return read()

        monkeypatch.setattr(store, "_read_server_clock", slow_read)
        assert store._server_anchor is not None  # read at open
        mono, server = store._server_anchor
        store._server_anchor = (
            mono - CLOCK_RESYNC - 1,
            server - timedelta(seconds=CLOCK_RESYNC + 1),
        )
        began = time.monotonic()
        store.now()  # stale: renewed in a thread, while this call returns at once
        assert reading.wait(5)
        assert time.monotonic() - began < 1
        assert abs(store.now() - server_now(database_url)) < AGREE  # carried forward meanwhile
        release.set()
        deadline = time.monotonic() + 5
        while store._server_anchor[0] < began and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store._server_anchor[0] >= began
    finally:
        store.close()


def test_postgres_store__a_failed_reading_carries_the_last_one_forward(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PostgresStore(database_url)
    try:

        def unreachable() -> tuple[float, datetime]:
            raise psycopg.OperationalError("server down")

        monkeypatch.setattr(store, "_read_server_clock", unreachable)
        assert store._server_anchor is not None
        mono, server = store._server_anchor
        store._server_anchor = (
            mono - CLOCK_RESYNC - 1,
            server - timedelta(seconds=CLOCK_RESYNC + 1),
        )
        began = time.monotonic()
        assert abs(store.now() - server_now(database_url)) < AGREE
        deadline = time.monotonic() + 5
        while store._resyncing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not store._resyncing
        assert store._server_anchor[0] >= began  # tried again only CLOCK_RESYNC from now
        assert abs(store.now() - server_now(database_url)) < AGREE
    finally:
        store.close()


def test_postgres_store__a_slow_round_trip_never_puts_now_ahead_of_the_servers(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow round trip whose server reading came late (the query waited on its way to the
    server, or in it) is anchored at the answer's arrival: "now" may be behind the server's by
    the round trip, never ahead of it. A worker starts a run it claimed ahead at its due time by
    this clock (N1 2026-12-02 with claim_ahead=5: three runs 50-58 ms early, from an anchor in
    the middle of a slow read at a worker's start)."""
    store = PostgresStore(database_url)
    try:
        # the query is slow to reach the server, which reads its clock at the end
        _pause_reads(store, monkeypatch, before=SLOW_TRIP)
        store._server_anchor = store._read_server_clock()
        ours = store.now()
        assert ours <= server_now(database_url)
        assert server_now(database_url) - ours < AGREE
    finally:
        store.close()


def test_postgres_store__a_reading_a_pause_stretched_is_refused_and_the_last_carried_forward(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause between the server's reading and the answer's arrival (the process stopped, a
    thread starved) would anchor "now" that much behind: leases born expired, due runs not due
    (N1 2026-12-01: a run reaped 0.5 s after it started). Such a reading is refused."""
    store = PostgresStore(database_url)
    try:
        # the server has read its clock, and the process pauses before it reads the answer
        _pause_reads(store, monkeypatch, after=PAUSE)
        with pytest.raises(StoreUnavailableError, match="reading its clock took"):
            store._read_server_clock()
        assert store._server_anchor is not None
        mono, server = store._server_anchor
        store._server_anchor = (
            mono - CLOCK_RESYNC - 1,
            server - timedelta(seconds=CLOCK_RESYNC + 1),
        )
        store.now()  # stale: renewed in a thread, which reads through the pause
        deadline = time.monotonic() + 10
        while store._resyncing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not store._resyncing
        assert abs(store.now() - server_now(database_url)) < AGREE  # not PAUSE behind
    finally:
        store.close()
