"""Stores: the source of truth. See ``base.Store``; backends sit side by side in this package."""

from __future__ import annotations

from onbeat.clock import Clock
from onbeat.errors import StoreOpenError
from onbeat.store.base import Store

__all__ = ["Store", "open_store"]


def open_store(url: str, clock: Clock, shard_count: int = 16) -> Store:
    """Pick the backend from the URL scheme: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``
    or ``postgresql://user@host:port/database``.
    Raises StoreOpenError, saying why in one line, if the store cannot be opened."""
    if url.startswith("sqlite:///"):
        from onbeat.store.sqlite import SQLiteStore

        return SQLiteStore(url.removeprefix("sqlite:///"), clock, shard_count)
    if url.startswith(("postgresql://", "postgres://")):
        from onbeat.store.postgres import PostgresStore

        return PostgresStore(url, clock, shard_count)
    raise StoreOpenError(
        repr(url), "unsupported scheme (expected sqlite:///PATH or postgresql://HOST/DATABASE)"
    )
