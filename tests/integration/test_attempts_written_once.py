"""An attempt is written once, when it ends: while it runs, its run's row is its record. Read on
both backends through raw SQL beside the store (the contract suite sees only what the store
returns, which is the same either way).

Also the upgrade: a version before this one wrote each attempt as it started. Such an attempt,
still running when the new version takes over, is read once (not again from the run's row) and
ended in place.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onbeat.model import AttemptOutcome
from onbeat.store import Store, open_store
from onbeat.testing import FakeClock
from onbeat.testing.postgres import store_schema
from onbeat.testing.store_contract import SHARD_COUNT, WORKER, _failed, _get, _ok, _start

Query = Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]


@contextmanager
def _store(backend: str, directory: Path) -> Iterator[tuple[Store, Query]]:
    clock = FakeClock()
    if backend == "sqlite":
        url, path = f"sqlite:///{directory}/onbeat.db", directory / "onbeat.db"
        store = open_store(url, clock, shard_count=SHARD_COUNT)

        def query(sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            with closing(sqlite3.connect(path)) as db, db:
                return db.execute(sql.replace("%s", "?"), args).fetchall()

        try:
            yield store, query
        finally:
            store.close()
        return
    with store_schema() as url:
        store = open_store(url, clock, shard_count=SHARD_COUNT)

        def query(sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
            with psycopg.connect(url, autocommit=True) as db:
                cursor = db.execute(sql, args)
                return cursor.fetchall() if cursor.description else []

        try:
            yield store, query
        finally:
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Query]]:
    if request.param == "postgres":
        request.applymarker(pytest.mark.external_service)
    with _store(request.param, tmp_path) as pair:
        yield pair


STORED = (
    "SELECT fencing_token, outcome, worker, finished_at IS NULL FROM attempts"
    " WHERE execution_id = %s"
)


def test_attempt__stored_once_when_it_ends_and_read_from_the_run_meanwhile(
    store: tuple[Store, Query],
) -> None:
    s, query = store
    run = _start(s)
    run_id, token = run.execution.id, run.execution.fencing_token
    assert query(STORED, (run_id,)) == [], "written at its start"
    [attempt] = _get(s, run_id).attempts
    assert (attempt.outcome, attempt.worker, attempt.fencing_token) == (
        AttemptOutcome.RUNNING,
        WORKER,
        token,
    )
    assert s.execution_finish_many([_failed(run, retry_in=30.0)]) == [run_id]  # a retry
    assert query(STORED, (run_id,)) == [(token, "failed", WORKER, False)]
    [ended] = _get(s, run_id).attempts
    assert ended.outcome is AttemptOutcome.FAILED


def test_attempt__stored_at_its_start_by_the_version_before__ended_in_place(
    store: tuple[Store, Query],
) -> None:
    s, query = store
    run = _start(s)
    run_id, token = run.execution.id, run.execution.fencing_token
    started = _get(s, run_id).attempts[0].started_at
    query(  # what the version before wrote at the start
        "INSERT INTO attempts (execution_id, scheduled_for, attempt, worker, fencing_token,"
        " started_at, outcome) SELECT id, scheduled_for, attempt, lease_owner, fencing_token,"
        " started_at, 'running' FROM runs WHERE id = %s",
        (run_id,),
    )
    [attempt] = _get(s, run_id).attempts
    assert (attempt.outcome, attempt.fencing_token, attempt.started_at) == (
        AttemptOutcome.RUNNING,
        token,
        started,
    )
    assert s.execution_finish_many([_ok(run)]) == [run_id]
    assert query(STORED, (run_id,)) == [(token, "succeeded", WORKER, False)]
