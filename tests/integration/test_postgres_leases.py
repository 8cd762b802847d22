"""Run leases on PostgreSQL's own clock (no injected clock): a holder merely blocked by the
database, or cut off while the server restarted, keeps its lease (the fault suite's S6).

Regressions: a heartbeat that waited for ``LOCK TABLE runs`` longer than the lease TTL renewed
the lease to a time already past (it was computed when the heartbeat was sent), so the reaper
took the run from a healthy worker; and right after a server restart the reaper took every run
whose lease ran out while the server was down, before any holder could reconnect and renew."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from onbeat.store.postgres import PostgresStore
from onbeat.testing.postgres import fresh_schema
from onbeat.testing.store_contract import WORKER, _claim, _dispatch, _new, _only_run

pytestmark = pytest.mark.external_service

LOCKED_FOR = 1.5
"""Seconds the test holds the table lock: longer than the lease the heartbeat asks for."""
TTL = 1.0


@pytest.fixture
def store() -> Iterator[tuple[PostgresStore, str]]:
    with fresh_schema() as url:
        opened = PostgresStore(url)
        try:
            yield opened, url
        finally:
            opened.close()


def _running(store: PostgresStore, ttl: float) -> str:
    job = store.job_create(_new()).job
    run = _only_run(store, job.id)
    assert run.id in {e.execution_id for e in _dispatch(store)}
    return _claim(store, run.id, ttl=ttl).execution.id


def test_heartbeat__that_waited_for_a_table_lock_renews_from_its_commit(
    store: tuple[PostgresStore, str],
) -> None:
    db, url = store
    run_id = _running(db, TTL)
    token = db.execution_get(run_id).fencing_token  # type: ignore[union-attr]
    with psycopg.connect(url) as locker:
        locker.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        sent = db.now()
        beat = threading.Thread(target=db.execution_heartbeat, args=(WORKER, {run_id: token}, TTL))
        beat.start()
        time.sleep(LOCKED_FOR)  # the fault: the lock held past the lease
        locker.rollback()
    beat.join(timeout=10)
    renewed = db.execution_get(run_id).lease_expires_at  # type: ignore[union-attr]
    assert renewed is not None
    # Renewed from the commit (>= sent + the wait + TTL), not from the send (sent + TTL).
    assert renewed >= sent + timedelta(seconds=LOCKED_FOR + TTL - 0.1)
    assert db.execution_reap(1000) == []


def test_reap__waits_a_lease_ttl_after_the_server_started(
    store: tuple[PostgresStore, str],
) -> None:
    db, url = store
    run_id = _running(db, 0.05)
    expiry = db.execution_get(run_id).lease_expires_at  # type: ignore[union-attr]
    assert expiry is not None
    while db.now() <= expiry:
        time.sleep(0.05)  # the lease running out in server time
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())"
        ).fetchone()
    assert row is not None
    up_for = float(row[0])
    # As if the server had started less than a grace ago: nobody could renew, nothing is reaped.
    assert db.execution_reap(1000, restart_grace=up_for + 3600) == []
    assert [e.id for e in db.execution_reap(1000, restart_grace=0.0)] == [run_id]
