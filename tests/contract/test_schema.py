"""Each backend's ``schema.sql`` (the whole schema, to read) is what its migrations build.

A migration added without updating ``schema.sql``, or the other way round, fails here: the two are
compared as the database describes them (columns with types, nullability, defaults and collations;
indexes with their columns and predicates; constraints; partitions with their bounds; views with
their columns and definitions), not as text.
"""

from __future__ import annotations

import sqlite3
from importlib import resources
from pathlib import Path

import psycopg

from onbeat.store.postgres import PostgresStore
from onbeat.store.queries import migrations
from onbeat.store.sqlite import SQLiteStore
from onbeat.testing.postgres import fresh_schema

Catalog = dict[str, list[tuple[object, ...]]]


def _schema_sql(backend: str) -> str:
    return resources.files("onbeat.store").joinpath(f"sql/{backend}/schema.sql").read_text()


def _sqlite_catalog(path: Path) -> Catalog:
    with sqlite3.connect(path) as c:
        tables = [
            r[0]
            for r in c.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' AND name != 'onbeat_migrations' ORDER BY name"
            )
        ]
        catalog: Catalog = {}
        for table in tables:
            catalog[f"{table}.columns"] = [
                tuple(r[1:]) for r in c.execute(f"PRAGMA table_xinfo({table})")
            ]
            catalog[f"{table}.foreign_keys"] = [
                tuple(r[2:]) for r in c.execute(f"PRAGMA foreign_key_list({table})")
            ]
            for _, index, unique, origin, partial in c.execute(f"PRAGMA index_list({table})"):
                columns = [tuple(r) for r in c.execute(f"PRAGMA index_xinfo({index})")]
                predicate = c.execute(
                    "SELECT substr(sql, instr(upper(sql), ' WHERE ')) FROM sqlite_master"
                    " WHERE name = ? AND sql IS NOT NULL",
                    (index,),
                ).fetchone()
                name = index if origin == "c" else f"{table}.auto.{origin}.{columns}"
                catalog[f"index {name}"] = [(unique, partial, *columns, predicate)]
        for view, sql in c.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY name"
        ):
            catalog[f"view {view}"] = [
                (" ".join(sql.split()),),
                *(tuple(r[1:]) for r in c.execute(f"PRAGMA table_xinfo({view})")),
            ]
        return catalog


def _postgres_catalog(url: str) -> Catalog:
    with psycopg.connect(url) as c:
        schema = c.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        args = {"schema": schema[0]}
        columns = c.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default,"
            " collation_name, is_identity FROM information_schema.columns"
            " WHERE table_schema = %(schema)s AND table_name != 'onbeat_migrations'"
            " ORDER BY table_name, ordinal_position",
            args,
        ).fetchall()
        indexes = c.execute(
            "SELECT tablename, indexname, replace(indexdef, %(schema)s || '.', '')"
            " FROM pg_indexes WHERE schemaname = %(schema)s AND tablename != 'onbeat_migrations'"
            " ORDER BY indexname",
            args,
        ).fetchall()
        constraints = c.execute(
            "SELECT rel.relname, con.conname, pg_get_constraintdef(con.oid)"
            " FROM pg_constraint con JOIN pg_class rel ON rel.oid = con.conrelid"
            " JOIN pg_namespace ns ON ns.oid = rel.relnamespace"
            " WHERE ns.nspname = %(schema)s AND rel.relname != 'onbeat_migrations'"
            " ORDER BY rel.relname, con.conname",
            args,
        ).fetchall()
        partitions = c.execute(
            "SELECT parent.relname, child.relname, pg_get_expr(child.relpartbound, child.oid),"
            " pg_get_partkeydef(parent.oid)"
            " FROM pg_inherits i JOIN pg_class parent ON parent.oid = i.inhparent"
            " JOIN pg_class child ON child.oid = i.inhrelid"
            " JOIN pg_namespace ns ON ns.oid = parent.relnamespace"
            " WHERE ns.nspname = %(schema)s AND child.relkind IN ('r', 'p') ORDER BY 1, 2",
            args,
        ).fetchall()
        views = c.execute(
            "SELECT viewname, definition FROM pg_views WHERE schemaname = %(schema)s"
            " ORDER BY viewname",
            args,
        ).fetchall()
        storage = c.execute(  # a table's fillfactor, say
            "SELECT rel.relname, rel.reloptions FROM pg_class rel"
            " JOIN pg_namespace ns ON ns.oid = rel.relnamespace"
            " WHERE ns.nspname = %(schema)s AND rel.reloptions IS NOT NULL ORDER BY 1",
            args,
        ).fetchall()
    return {
        "columns": columns,
        "indexes": indexes,
        "constraints": constraints,
        "partitions": partitions,
        "views": views,
        "storage": storage,
    }


def test_sqlite__migrations_build_schema_sql(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "migrated.db").close()
    with sqlite3.connect(tmp_path / "declared.db") as c:
        c.executescript(_schema_sql("sqlite"))
    migrated, declared = (
        _sqlite_catalog(tmp_path / "migrated.db"),
        _sqlite_catalog(tmp_path / "declared.db"),
    )
    assert migrated == declared
    assert {"runs.columns", "execution_history.columns", "view executions"} <= set(migrated)


def test_postgres__migrations_build_schema_sql() -> None:
    with fresh_schema() as migrated_url, fresh_schema() as declared_url:
        PostgresStore(migrated_url).close()
        with psycopg.connect(declared_url, autocommit=True) as c:
            c.execute(_schema_sql("postgres").encode())
        migrated, declared = _postgres_catalog(migrated_url), _postgres_catalog(declared_url)
    assert migrated == declared
    assert len(migrated["columns"]) > 50, "nothing was compared"
    assert len(migrated["partitions"]) == 2 and len(migrated["views"]) == 1


def test_postgres__the_migrations_are_recorded_and_run_once() -> None:
    with fresh_schema() as url:
        store = PostgresStore(url)
        try:
            assert store.migrate() == [], "a second pass applied migrations again"
        finally:
            store.close()
        with psycopg.connect(url) as c:
            versions = [r[0] for r in c.execute("SELECT version FROM onbeat_migrations")]
    assert versions == [v for v, _ in migrations("postgres")]


_OLD_ROWS = [
    "INSERT INTO jobs (id, tenant, task, params, schedule_kind, timezone, max_attempts,"
    " backoff_base, backoff_cap, overlap, misfire, catchup_window, priority, jitter, status,"
    " shard, created_at, updated_at) VALUES ('job1', 'default', 't', '{}', 'cron', 'UTC', 1,"
    " 1, 1, 'skip', 'run_once', 0, 0, 0, 'active', 0, 1, 1)",
    "INSERT INTO executions (id, job_id, shard, trigger, scheduled_for, due_at, status, priority,"
    " created_at) VALUES ('ok', 'job1', 0, 'schedule', 100, 100, 'succeeded', 0, 1),"
    " ('dead', 'job1', 0, 'schedule', 200, 200, 'failed', 0, 1),"
    " ('next', 'job1', 0, 'schedule', 300, 300, 'scheduled', 0, 1)",
    "INSERT INTO attempts (execution_id, attempt, worker, fencing_token, started_at, outcome)"
    " VALUES ('ok', 1, 'w', 1, 100, 'succeeded'), ('dead', 1, 'w', 1, 200, 'failed')",
    "INSERT INTO dead_letters (execution_id, job_id, tenant, attempts, created_at)"
    " VALUES ('dead', 'job1', 'default', 1, 250)",
]
_MOVED = [
    ("SELECT id FROM runs ORDER BY id", [("next",)]),
    ("SELECT id FROM execution_history ORDER BY id", [("dead",), ("ok",)]),
    ("SELECT id FROM executions ORDER BY id", [("dead",), ("next",), ("ok",)]),
    ("SELECT execution_id, scheduled_for FROM attempts ORDER BY 1", [("dead", 200), ("ok", 100)]),
    ("SELECT execution_id, scheduled_for FROM dead_letters", [("dead", 200)]),
]


_SQLITE_HISTORY_MIGRATION = 9
"""SQLite's migration that split executions into runs and execution_history."""


def test_sqlite__the_history_migration_moves_every_run_where_it_belongs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:  # as the version before it left a store
        c.execute(
            "CREATE TABLE onbeat_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER)"
        )
        for version, script in migrations("sqlite")[: _SQLITE_HISTORY_MIGRATION - 1]:
            c.executescript(script)
            c.execute("INSERT INTO onbeat_migrations VALUES (?, 0)", (version,))
        for statement in _OLD_ROWS:
            c.execute(statement)
    SQLiteStore(path).close()
    with sqlite3.connect(path) as c:
        assert [c.execute(query).fetchall() for query, _ in _MOVED] == [rows for _, rows in _MOVED]


_HISTORY_MIGRATION = 5
"""PostgreSQL's migration that split executions into runs and execution_history."""


def test_postgres__the_history_migration_moves_every_run_where_it_belongs() -> None:
    with fresh_schema() as url:
        with psycopg.connect(url, autocommit=True) as c:  # as the version before it left a store
            c.execute(
                "CREATE TABLE onbeat_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT)"
            )
            for version, script in migrations("postgres")[: _HISTORY_MIGRATION - 1]:
                c.execute(script.encode())
                c.execute("INSERT INTO onbeat_migrations VALUES (%s, 0)", (version,))
            for statement in _OLD_ROWS:
                c.execute(statement.encode())
        PostgresStore(url).close()
        with psycopg.connect(url) as c:
            assert [c.execute(query.encode()).fetchall() for query, _ in _MOVED] == [
                rows for _, rows in _MOVED
            ]


_STRIPES_MIGRATION = 6
"""PostgreSQL's migration that spread tenant_usage's counters over stripes."""


def test_postgres__the_stripes_migration_keeps_every_counter() -> None:
    with fresh_schema() as url:
        with psycopg.connect(url, autocommit=True) as c:  # as the version before it left a store
            c.execute(
                "CREATE TABLE onbeat_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT)"
            )
            for version, script in migrations("postgres")[: _STRIPES_MIGRATION - 1]:
                c.execute(script.encode())
                c.execute("INSERT INTO onbeat_migrations VALUES (%s, 0)", (version,))
            c.execute(
                "INSERT INTO tenant_usage (tenant, running, tat)"
                " VALUES ('', 7, NULL), ('acme', 5, 1700000000000000), ('zeta', 2, NULL)"
                " ON CONFLICT (tenant) DO UPDATE SET running = excluded.running"
            )
        store = PostgresStore(url)
        try:
            usage = {t: store.tenant_usage(t) for t in ("", "acme", "zeta", "none")}
        finally:
            store.close()
        assert [(u.running, u.tat) for u in usage.values()] == [
            (7, None),
            (5, usage["acme"].tat),
            (2, None),
            (0, None),
        ]
        assert usage["acme"].tat is not None
        assert int(usage["acme"].tat.timestamp() * 1_000_000) == 1_700_000_000_000_000
