"""Fresh PostgreSQL schemas for tests, on the server the tests use.

The server is ``ONBEAT_TEST_POSTGRES_URL`` (default: the local one, database ``test``). Each
schema is its own namespace for onbeat's tables, so tests run side by side on one database. A
missing server is an error, never a skip. Test connections commit without waiting for the WAL
flush (``synchronous_commit=off``): a test never survives a server crash anyway, and it makes a
commit cost a round trip rather than a disk flush.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg

TEST_SERVER = os.environ.get("ONBEAT_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
_KEPT_TABLES = ("onbeat_migrations",)
_reusable: list[str] = []
"""Schemas a store was migrated into and that were emptied after their test: migrating costs a
few hundred milliseconds, emptying a few."""


def schema_url(schema: str, server: str = TEST_SERVER) -> str:
    options = quote(f"-csearch_path={schema} -csynchronous_commit=off")
    return f"{server}{'&' if '?' in server else '?'}options={options}"


@contextmanager
def fresh_schema(server: str = TEST_SERVER) -> Iterator[str]:
    """Yield the URL of an empty schema (no tables), dropped afterwards."""
    name = _create(server)
    try:
        yield schema_url(name, server)
    finally:
        _drop(server, name)


@contextmanager
def store_schema(server: str = TEST_SERVER) -> Iterator[str]:
    """Yield the URL of a schema that holds no rows, though perhaps onbeat's migrated tables;
    it is emptied afterwards and handed to a later test."""
    name = _reusable.pop() if _reusable else _create(server)
    try:
        yield schema_url(name, server)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = %s", (name,)
                )
                if r[0] not in _KEPT_TABLES
            ]
            if tables:
                listed = ", ".join(f'"{name}"."{t}"' for t in tables)
                conn.execute(f"TRUNCATE {listed} RESTART IDENTITY CASCADE")
        _reusable.append(name)


def _create(server: str) -> str:
    name = f"onbeat_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def _drop(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@atexit.register
def _drop_reusable() -> None:
    while _reusable:
        try:
            _drop(TEST_SERVER, _reusable.pop())
        except psycopg.Error:
            return
