"""Fresh, isolated queue URLs for the table delay queue's tests: one table per test.

PostgreSQL tests use the database named by ``ONBEAT_TEST_POSTGRES_URL`` (default: the local
``test`` database) and a table of their own, dropped afterwards; they fail, never skip, when
PostgreSQL is not running. SQLite tests use a file in the test's own directory.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
from psycopg import sql

from onbeat.testing.postgres import TEST_SERVER

POSTGRES_URL = TEST_SERVER


@asynccontextmanager
async def fresh_queue_url(driver: str, directory: Path) -> AsyncIterator[str]:
    """The URL of an empty queue table nobody else uses; PostgreSQL's is dropped on exit."""
    table = f"onbeat_queue_test_{uuid.uuid4().hex[:12]}"
    if driver == "sqlite":
        yield f"sqlite:///{directory}/queue.db?table={table}"
        return
    assert driver == "postgres", driver
    try:
        yield f"{POSTGRES_URL}?table={table}"
    finally:
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
