"""The store's and the table queue's connection pools after their PostgreSQL server went away:
the server is taken away by a ``TcpGate`` between the pools and the real server.

Regressions:
- psycopg_pool doubles its wait after every failed connection attempt (1, 2, 4, 8, 16 s ...), so
  a worker's pool could come back half a minute after its server, its runs' leases run out and
  the runs started again elsewhere (the fault suite's N1: a reaper back within a second, a
  worker 2 s later; a longer outage, later still). Now every pool tries about once a second.
- psycopg_pool logged every attempt (now about 1.5 lines a second per pool of every process):
  a pool's first failure is logged, then one line per 30 s.
- The server closed the store pool's idle connections (a restart, ``pg_terminate_backend``)
  and each failed one pass of its own, each pass backing its loop off.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from onbeat.errors import QueueUnavailableError, StoreUnavailableError
from onbeat.queue import open_queue
from onbeat.store.postgres import PostgresStore
from onbeat.store.postgres_session import POOL_LOG_FILTER
from onbeat.testing import FakeClock
from onbeat.testing.postgres import fresh_schema
from tests.queue_backends import fresh_queue_url
from tests.tcp_gate import TcpGate, tcp_gate

pytestmark = pytest.mark.external_service

OUTAGE = 8.0
"""Seconds the server stays away: psycopg_pool's default backoff tries at 1, 3 and 7 s, then 15 s."""
BACK_WITHIN = 2.0
"""Seconds after the server's return by which a caller waiting for a connection has one."""


@pytest.fixture
def gated_store() -> Iterator[tuple[PostgresStore, TcpGate]]:
    with fresh_schema() as url, tcp_gate(url) as gate:
        store = PostgresStore(gate.url(url))
        try:
            yield store, gate
        finally:
            store.close()


def _first_success_after(call: Callable[[], object], errors: type[Exception]) -> float:
    """Call until a call succeeds; the monotonic time it returned."""
    while True:
        try:
            call()
        except errors:
            continue
        return time.monotonic()


def test_store__back_within_a_second_or_two_of_its_server(
    gated_store: tuple[PostgresStore, TcpGate], caplog: pytest.LogCaptureFixture
) -> None:
    """Also: the pool's attempts (about one a second) log one line, not one each."""
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    POOL_LOG_FILTER.forget()  # an earlier test's outage within 30 s would hold this one's back
    store, gate = gated_store
    store.api_key_count_active()
    gate.shut()
    back_at: list[float] = []
    caller = threading.Thread(
        target=lambda: back_at.append(
            _first_success_after(store.api_key_count_active, StoreUnavailableError)
        )
    )
    caller.start()  # its calls fail, then one waits for a connection while the server is away
    time.sleep(OUTAGE)  # the fault: the server away for this long
    gate.open()
    returned_at = time.monotonic()
    caller.join(timeout=15)
    assert back_at, "no store call succeeded within 15 s of the server's return"
    assert back_at[0] - returned_at < BACK_WITHIN
    pool_lines = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
    attempts = [line for line in pool_lines if "connecting" in line or "reconnection" in line]
    assert len(attempts) == 1 and "error connecting in 'onbeat'" in attempts[0], pool_lines


def test_store__dropped_connections_fail_one_call_at_most(
    gated_store: tuple[PostgresStore, TcpGate],
) -> None:
    store, gate = gated_store
    with ExitStack() as held:  # four connections in the pool, all idle afterwards
        for _ in range(4):
            held.enter_context(store._pool.connection())
    gate.shut()  # the server closes every connection (a restart, pg_terminate_backend)
    gate.open()
    failed = 0
    while True:
        try:
            store.api_key_count_active()
            break
        except StoreUnavailableError:
            failed += 1
    assert failed <= 1


async def test_table_queue__back_within_a_second_or_two_of_its_server(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with fresh_queue_url("postgres", tmp_path) as url:
        with tcp_gate(url) as gate:
            queue = open_queue(gate.url(url), clock)
            try:
                await queue.size()
                gate.shut()

                async def first_success() -> float:
                    while True:
                        try:
                            await queue.size()
                        except QueueUnavailableError:
                            continue
                        return time.monotonic()

                caller = asyncio.create_task(first_success())
                await asyncio.sleep(OUTAGE)  # the fault: the server away for this long
                gate.open()
                returned_at = time.monotonic()
                back_at = await asyncio.wait_for(caller, timeout=15)
                assert back_at - returned_at < BACK_WITHIN
            finally:
                await queue.close()


def test_store__ping_fails_while_the_server_is_away_and_now_does_not(
    gated_store: tuple[PostgresStore, TcpGate],
) -> None:
    """The reaper's first round trip after an outage is ``ping``: ``now`` carries the server's
    time forward without asking it, so it answered during N1's PostgreSQL crash and the reaper's
    lease TTL of grace ran out before the server was back (15 healthy runs rescued)."""
    store, gate = gated_store
    store.ping()
    gate.shut()
    with pytest.raises(StoreUnavailableError):
        store.ping()
    store.now()  # carried forward: no round trip
    gate.open()
    _first_success_after(store.ping, StoreUnavailableError)
