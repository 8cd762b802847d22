"""No dashboard page reads the whole store: every statement a page runs is an index range
(``EXPLAIN QUERY PLAN``), and a tenant's pages do the same work however many rows other tenants
and older history add (SQLite virtual-machine steps, counted with a progress handler).

The store is filled directly by ``bench/dashboard.py``'s ``fill`` (what the engine would write).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from bench.dashboard import fill

from onbeat import App
from onbeat.auth import Role
from onbeat.store.sqlite import SQLiteStore
from onbeat.testing import FakeClock
from tests.dashboard.conftest import key_for, log_in, new_browser

SMALL_TABLES = frozenset(
    {"shard_leases", "schedulers", "api_keys", "secrets", "onbeat_migrations", "tasks"}
)
"""Bounded by the shard count, the number of keys or of task names, not by the work stored."""
RUNNING_ONLY = frozenset({"runs_lease_expiry", "runs_lease_owner"})
"""Partial indexes of running executions: bounded by the workers' concurrency."""
_FROM = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?:AS\s+)?(\w+))?", re.IGNORECASE)
_SCAN = re.compile(r"^SCAN (\w+)(?: USING (?:COVERING )?INDEX (\w+))?")
_NOT_ALIASES = {"where", "join", "on", "order", "group", "limit", "left", "inner", "union", "using"}


class Recording:
    """A stand-in for the store's connection that notes every statement with its parameters."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.statements: list[tuple[str, Any]] = []

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        self.statements.append((sql, parameters))
        return self.connection.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


@pytest.fixture
def filled_app(onbeat_app: App, clock: FakeClock) -> Iterator[App]:
    """acme's jobs and runs, some of them in the last hour, beside the App's own store."""
    path = Path(onbeat_app.settings.database_url.removeprefix("sqlite:///"))
    fill(path, jobs=60, executions=600, now=clock.now(), tenants=[("acme", 1.0)], running=4)
    yield onbeat_app


def _pages(app: App) -> list[str]:
    [acme_job, *_] = app.store.job_search(tenant="acme", limit=1)
    [letter, *_] = app.list_dead_letters(1, tenant="acme")
    [run, *_] = app.list_executions(acme_job.id, 1)
    return [
        "/",
        "/jobs",
        "/jobs?status=paused",
        f"/jobs?q={acme_job.task[:4]}",
        f"/jobs?q={acme_job.id[:6]}",
        f"/jobs?after={acme_job.id}",
        f"/jobs?status=active&q={acme_job.task}&after={acme_job.id}",
        f"/jobs/{acme_job.id}",
        f"/jobs/{acme_job.id}?before={run.id}",
        "/dead-letters",
        f"/dead-letters?after={letter.execution_id}",
        "/preview?kind=cron&expression=*/5+*+*+*+*",
    ]


async def _visit(app: App, paths: list[str], key: str | None) -> None:
    async with new_browser(app) as browser:
        if key is not None:
            await log_in(browser, key)
        for path in paths:
            page = await browser.get(path)
            assert page.status_code == 200, (path, page.text)


def _scans(connection: sqlite3.Connection, sql: str, parameters: Any) -> list[str]:
    """The plan lines of ``sql`` that read a whole table or a whole unbounded index."""
    tables = {}
    for table, alias in _FROM.findall(sql):
        tables[table] = table
        if alias and alias.lower() not in _NOT_ALIASES:
            tables[alias] = table
    bad = []
    for *_, detail in connection.execute("EXPLAIN QUERY PLAN " + sql, parameters):
        found = _SCAN.match(detail)
        if found is None or "VIRTUAL TABLE" in detail:  # json_each of a list of ids
            continue
        name, index = found.groups()
        table = tables.get(name, name)
        if table in SMALL_TABLES or index in RUNNING_ONLY or name == "CONSTANT":
            continue
        bad.append(f"{detail}  <-  {_code(sql)[:120]}")
    return bad


def _code(sql: str) -> str:
    """``sql`` without its comment lines."""
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def _is_read(sql: str) -> bool:
    return _code(sql).lstrip().upper().startswith(("SELECT", "WITH"))


async def test_query_plans__every_statement_of_every_page_is_an_index_range(
    filled_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = filled_app.store
    assert isinstance(store, SQLiteStore)
    paths = _pages(filled_app)
    recording = Recording(store._conn)
    monkeypatch.setattr(store, "_conn", recording)
    await _visit(filled_app, paths, key=None)  # no key exists: every tenant
    await _visit(filled_app, paths, key=key_for(filled_app, "acme", Role.WRITER))
    selects = [(s, p) for s, p in recording.statements if _is_read(s)]
    assert len({s for s, _ in selects}) > 15, "the pages ran fewer statements than expected"
    path = filled_app.settings.database_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as connection:
        scans = [line for sql, params in selects for line in _scans(connection, sql, params)]
    assert scans == []


@contextmanager
def _vm_steps(store: SQLiteStore) -> Iterator[list[int]]:
    """Counts, in hundreds, the SQLite virtual-machine steps the store's connection runs."""
    counter = [0]

    def step() -> int:
        counter[0] += 1
        return 0

    store._conn.set_progress_handler(step, 100)
    try:
        yield counter
    finally:
        store._conn.set_progress_handler(None, 0)


async def test_a_tenants_pages_cost_the_same_whatever_other_tenants_and_old_history_hold(
    filled_app: App, clock: FakeClock
) -> None:
    store = filled_app.store
    assert isinstance(store, SQLiteStore)
    key = key_for(filled_app, "acme", Role.READER)
    paths = _pages(filled_app)

    async def steps_per_page() -> dict[str, int]:
        out = {}
        async with new_browser(filled_app) as browser:
            await log_in(browser, key)
            for path in paths:
                with _vm_steps(store) as counter:
                    assert (await browser.get(path)).status_code == 200
                out[path] = counter[0]
        return out

    before = await steps_per_page()
    path = Path(filled_app.settings.database_url.removeprefix("sqlite:///"))
    fill(
        path,
        jobs=1500,
        executions=15000,
        now=clock.now(),
        tenants=[("rival", 0.5), ("zeta", 0.5)],
        last_hour=0.0,
        running=0,
        failed=0.3,  # thousands of dead letters
        seed=2,
    )
    after = await steps_per_page()
    # Ten times the rows deepen a B-tree by a level at most: a few steps more per index seek.
    grown = {p: (before[p], after[p]) for p in paths if after[p] > before[p] * 1.1 + 5}
    assert grown == {}, "pages whose work grew with other tenants' rows (steps/100 before, after)"
