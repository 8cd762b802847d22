"""``open_store(..., migrate=False)`` and ``pending_migrations``: a process started with
``--no-migrate`` never changes the schema, and refuses a store whose schema is behind."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from onbeat.errors import StoreOpenError
from onbeat.store import open_store, pending_migrations
from onbeat.store.queries import migrations
from onbeat.testing import FakeClock

ALL = [version for version, _ in migrations("sqlite")]
NEWEST = ALL[-1]
_TABLES_CREATED = re.compile(r"CREATE TABLE (\w+)")


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_pending_migrations__every_one_until_opened_then_none(
    tmp_path: Path, clock: FakeClock
) -> None:
    url = _url(tmp_path / "onbeat.db")
    assert pending_migrations(url) == ALL
    assert not (tmp_path / "onbeat.db").exists()  # looking created nothing
    open_store(url, clock).close()
    assert pending_migrations(url) == []


def test_open_store__no_migrate_refuses_a_store_without_schema_and_creates_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    url = _url(tmp_path / "onbeat.db")
    with pytest.raises(StoreOpenError, match="no onbeat schema yet: run `onbeat migrate` first"):
        open_store(url, clock, migrate=False)
    assert list(tmp_path.iterdir()) == []


def test_open_store__no_migrate_refuses_a_schema_behind_and_leaves_it_as_it_is(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "onbeat.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as db:  # as an older version left it
        db.execute(
            "CREATE TABLE onbeat_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
        )
        for version, script in migrations("sqlite")[:-1]:
            db.executescript(script)
            db.execute("INSERT INTO onbeat_migrations VALUES (?, 0)", (version,))
    with pytest.raises(StoreOpenError, match=f"its schema lacks migration\\(s\\) {NEWEST}:"):
        open_store(_url(path), clock, migrate=False)
    assert pending_migrations(_url(path)) == [NEWEST]
    open_store(_url(path), clock).close()  # migrating (the default) brings it up to date
    assert pending_migrations(_url(path)) == []
    open_store(_url(path), clock, migrate=False).close()


def test_pending_migrations__a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("shopping list\n" * 100)
    with pytest.raises(StoreOpenError, match="the file is not an SQLite database"):
        pending_migrations(_url(path))


def test_open_store__an_unknown_scheme_is_named_without_its_password(clock: FakeClock) -> None:
    with pytest.raises(StoreOpenError, match="unsupported scheme") as refused:
        open_store("mysql://onbeat:s3cret@db/onbeat", clock)
    assert "s3cret" not in str(refused.value)


def test_migration_0008__counts_the_runs_running_at_the_upgrade(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The fleet limits' counters start right: a store upgraded while runs are running counts
    them, per tenant and for the fleet."""
    from onbeat.limits import GLOBAL
    from onbeat.testing.store_contract import _new, _start

    path = tmp_path / "onbeat.db"
    store = open_store(_url(path), clock)
    for tenant in ("acme", "acme", "zeta"):
        _start(store, _new(tenant=tenant))
    store.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:  # as version 7 left it
        db.execute("DROP TABLE tenant_usage")
        db.execute("DROP TABLE tenant_limits")
        db.execute("DELETE FROM onbeat_migrations WHERE version = 8")
    store = open_store(_url(path), clock)
    try:
        running = {t: store.tenant_usage(t).running for t in (GLOBAL, "acme", "zeta")}
    finally:
        store.close()
    assert running == {GLOBAL: 3, "acme": 2, "zeta": 1}
