"""Stores: the source of truth. See ``base.Store``; backends sit side by side in this package."""

from __future__ import annotations

import importlib

from onbeat.clock import Clock
from onbeat.errors import StoreOpenError
from onbeat.settings import DEFAULT_SHARDS, redact_url
from onbeat.store.base import Store
from onbeat.store.migrations import pending_migrations

__all__ = ["Store", "open_store", "pending_migrations"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(
    url: str, clock: Clock | None, shard_count: int = DEFAULT_SHARDS, *, migrate: bool = True
) -> Store:
    """Pick the backend from the URL scheme: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``
    or ``postgresql://...``. ``clock``: a test's; None: the store's own (PostgreSQL: the server's
    clock; SQLite: this host's). Opening applies pending migrations; with ``migrate=False`` it
    applies none and refuses a store that lacks any (StoreOpenError saying to run
    ``onbeat migrate``). Raises StoreOpenError, saying why in one line, if the store cannot be
    opened."""
    if not migrate:
        pending = pending_migrations(url)
        if pending:
            lacks = (
                "it has no onbeat schema yet"
                if pending[0] == 1
                else f"its schema lacks migration(s) {', '.join(map(str, pending))}"
            )
            raise StoreOpenError(
                redact_url(url),
                f"{lacks}: run `onbeat migrate` first, or let this process migrate "
                "(drop --no-migrate / ONBEAT_MIGRATE=false)",
            )
    if url.startswith("sqlite:///"):
        from onbeat.store.sqlite import SQLiteStore

        return SQLiteStore(url.removeprefix("sqlite:///"), clock, shard_count)
    if url.startswith(POSTGRES_SCHEMES):
        return _open_postgres(url, clock, shard_count, migrate)
    raise StoreOpenError(
        repr(redact_url(url)), "unsupported scheme (expected sqlite:///PATH or postgresql://...)"
    )


def _open_postgres(url: str, clock: Clock | None, shard_count: int, migrate: bool) -> Store:
    """``PostgresStore``, imported only when asked for: ``import onbeat`` pulls no driver in.
    Whatever stops it from connecting becomes one StoreOpenError line."""
    try:
        postgres = importlib.import_module("onbeat.store.postgres")
    except ImportError as exc:
        raise StoreOpenError(
            redact_url(url), f"PostgreSQL support is not installed ({exc})"
        ) from exc
    try:
        store: Store = postgres.PostgresStore(url, clock, shard_count, migrate)
    except StoreOpenError:
        raise
    except Exception as exc:
        raise StoreOpenError(redact_url(url), one_line(exc)) from exc
    return store


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its class and the first line of its message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
