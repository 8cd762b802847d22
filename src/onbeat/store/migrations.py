"""Which schema migrations a store lacks, found without applying any: ``--no-migrate`` refuses to
start on a store that lacks some, and ``onbeat migrate`` reports what it applied.

Every backend records the versions it applied in its ``onbeat_migrations`` table.
"""

from __future__ import annotations

import importlib
import sqlite3
from contextlib import closing
from pathlib import Path

from onbeat.errors import StoreOpenError
from onbeat.settings import redact_url
from onbeat.store.queries import migrations

__all__ = ["pending_migrations"]


def pending_migrations(url: str) -> list[int]:
    """The migration versions the store at ``url`` has not applied, oldest first: every one for
    a store not created yet. Reads only. StoreOpenError if the store cannot be read."""
    if url.startswith("sqlite:///"):
        return _sqlite_pending(Path(url.removeprefix("sqlite:///")))
    if url.startswith(("postgresql://", "postgres://")):
        try:
            postgres = importlib.import_module("onbeat.store.postgres")
        except ImportError as exc:
            raise StoreOpenError(
                redact_url(url), f"PostgreSQL support is not installed ({exc})"
            ) from exc
        pending: list[int] = postgres.pending_migrations(url)
        return pending
    raise StoreOpenError(
        repr(redact_url(url)), "unsupported scheme (expected sqlite:///PATH or postgresql://...)"
    )


def _sqlite_pending(path: Path) -> list[int]:
    versions = [version for version, _ in migrations("sqlite")]
    if not path.is_file():
        return versions  # opening it would create it, or fail saying why
    try:
        with closing(sqlite3.connect(path)) as connection:
            if not connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'onbeat_migrations'"
            ).fetchone():
                return versions
            applied = {
                row[0] for row in connection.execute("SELECT version FROM onbeat_migrations")
            }
    except sqlite3.Error as exc:
        from onbeat.store.sqlite import _open_error  # the same words as opening it would say

        raise _open_error(path, exc) from exc
    return [v for v in versions if v not in applied]
