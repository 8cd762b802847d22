"""What PostgreSQL sessions of a store promise the rest of the fleet: a process frozen inside a
transaction (SIGSTOP, a VM pause, a debugger) does not hold its row locks, such as the fleet's
in-flight counter that every claim, outcome and reap takes, for longer than
``IDLE_IN_TRANSACTION_TIMEOUT``: the server ends its transaction. (The fault suite's S2 froze a
worker between two statements and every reap of the fleet waited for it.)"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from onbeat.store.postgres import IDLE_IN_TRANSACTION_TIMEOUT, PostgresStore
from onbeat.testing.postgres import fresh_schema

pytestmark = pytest.mark.external_service


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def test_a_frozen_transaction_releases_its_locks_within_the_idle_timeout(url: str) -> None:
    frozen, other = PostgresStore(url), PostgresStore(url)
    try:
        with frozen._pool.connection() as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT * FROM tenant_usage WHERE tenant = '' FOR UPDATE")
            # ... and the process freezes here: it sends nothing more.
            began = time.monotonic()
            with psycopg.connect(url, autocommit=True) as waiter:
                waiter.execute("SET lock_timeout = '10s'")
                waiter.execute("SELECT * FROM tenant_usage WHERE tenant = '' FOR UPDATE")
            waited = time.monotonic() - began
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # it wakes up
                conn.execute("COMMIT")
        assert IDLE_IN_TRANSACTION_TIMEOUT - 0.5 < waited < IDLE_IN_TRANSACTION_TIMEOUT + 2
        assert other.now() is not None  # the pool of the frozen store replaces the connection
        assert frozen.now() is not None
    finally:
        frozen.close()
        other.close()
