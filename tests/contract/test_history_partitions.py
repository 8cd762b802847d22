"""PostgreSQL's day partitions of the execution history (and of attempts): created ahead, filled
from the DEFAULT partition when a day's partition comes late, dropped past the retention except a
day that holds an unresolved dead letter. What every backend must do is in the contract suite
(``HistoryContract``); this is how PostgreSQL does it, read from its catalog."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from onbeat.model import ExecutionStatus, RetryPolicy
from onbeat.store.postgres import PostgresStore
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import fresh_schema
from onbeat.testing.store_contract import _failed, _get, _new, _ok, _start


@pytest.fixture
def url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()  # 2026-01-05 12:00 UTC


def _partitions(url: str, parent: str) -> list[str]:
    with psycopg.connect(url) as c:
        return [
            r[0]
            for r in c.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = %s::regclass ORDER BY 1",
                (parent,),
            )
        ]


def _partition_of(url: str, table: str, column: str, value: str) -> str:
    with psycopg.connect(url) as c:
        row = c.execute(
            f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", (value,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_maintain__creates_the_day_partitions_from_yesterday_to_the_days_ahead(
    url: str, clock: FakeClock
) -> None:
    store = PostgresStore(url, clock)
    try:
        upkeep = store.history_maintain(retention_days=30, ahead_days=7)
        assert store.history_maintain(retention_days=30, ahead_days=7).created == []
    finally:
        store.close()
    days = [f"202601{d:02}" for d in range(4, 13)]  # yesterday, today and 7 days ahead
    for parent in ("execution_history", "attempts"):
        assert _partitions(url, parent) == [f"{parent}_default"] + [f"{parent}_p{d}" for d in days]
    assert len(upkeep.created) == 2 * len(days)


def test_maintain__moves_the_rows_a_day_had_in_default_into_its_partition(
    url: str, clock: FakeClock
) -> None:
    store = PostgresStore(url, clock)
    try:
        run = _start(store)  # no partition yet: its record lands in DEFAULT
        store.execution_finish_many([_ok(run)])
        run_id = run.execution.id
        assert _partition_of(url, "execution_history", "id", run_id) == "execution_history_default"
        assert _partition_of(url, "attempts", "execution_id", run_id) == "attempts_default"
        store.history_maintain(retention_days=30, ahead_days=1)
        assert _partition_of(url, "execution_history", "id", run_id) == (
            "execution_history_p20260105"
        )
        assert _partition_of(url, "attempts", "execution_id", run_id) == "attempts_p20260105"
        got = _get(store, run_id)
        assert (got.status, len(got.attempts)) == (ExecutionStatus.SUCCEEDED, 1)
    finally:
        store.close()


def test_maintain__drops_expired_days_and_keeps_a_day_with_a_dead_letter(
    url: str, clock: FakeClock
) -> None:
    store = PostgresStore(url, clock)
    try:
        store.history_maintain(retention_days=30, ahead_days=3)
        ok = _start(store)  # 2026-01-05
        store.execution_finish_many([_ok(ok)])
        clock.advance(timedelta(days=1).total_seconds())
        dead = _start(store, _new(retry=RetryPolicy(max_attempts=1)))  # 2026-01-06
        store.execution_finish_many([_failed(dead)])
        clock.advance(timedelta(days=40).total_seconds())
        upkeep = store.history_maintain(retention_days=30, ahead_days=3)
        assert "execution_history_p20260105" in upkeep.dropped
        assert "attempts_p20260105" in upkeep.dropped
        assert upkeep.kept == ["20260106"]
        assert store.execution_get(ok.execution.id) is None
        assert _get(store, dead.execution.id).status is ExecutionStatus.FAILED
        assert "execution_history_p20260106" in _partitions(url, "execution_history")
        store.dead_letter_drop(dead.execution.id)
        assert "execution_history_p20260106" in store.history_maintain(30, 3).dropped
    finally:
        store.close()
