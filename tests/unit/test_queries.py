"""Every named SQL statement is used, and every one used exists, in every backend (no dead or
missing SQL); the shared transactions find each of their statements in every backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import onbeat.store.postgres
import onbeat.store.sqlite
from onbeat.store.queries import load_queries, migrations

_BACKEND_MODULES = {"sqlite": onbeat.store.sqlite, "postgres": onbeat.store.postgres}
_STATEMENT = re.compile(r'(?:\bQ|self\._q)\["(\w+)"\]')


_SHARED = sorted((Path(onbeat.store.sqlite.__file__).parent / "sql_store").glob("*.py"))
"""The transactions every SQL backend shares, one module per role."""


def _used_in(*paths: Path) -> set[str]:
    return set().union(*(_STATEMENT.findall(path.read_text()) for path in paths))


def _used_in_module(module: object) -> set[str]:
    return _used_in(Path(module.__file__))  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", sorted(_BACKEND_MODULES))
def test_queries__every_statement_is_used_and_every_used_one_exists(backend: str) -> None:
    used = _used_in(*_SHARED) | _used_in_module(_BACKEND_MODULES[backend])
    assert used == set(load_queries(backend))


def test_queries__the_shared_transactions_use_the_same_statements_everywhere() -> None:
    shared = _used_in(*_SHARED)
    for backend in _BACKEND_MODULES:
        assert shared <= set(load_queries(backend)), backend


@pytest.mark.parametrize("backend", sorted(_BACKEND_MODULES))
def test_migrations__numbered_from_one_without_gaps(backend: str) -> None:
    versions = [version for version, _ in migrations(backend)]
    assert versions == list(range(1, max(versions) + 1))


@pytest.mark.parametrize("backend", sorted(_BACKEND_MODULES))
def test_queries__waiting_runs_are_found_by_the_reason_plan_gives_them(backend: str) -> None:
    """The wake-up statements spell plan.WAITING out as a literal (PostgreSQL's final outcomes
    wake their jobs' waiting runs inside execution_finish_final)."""
    from onbeat.plan import WAITING

    queries = load_queries(backend)
    assert f"LIKE '{WAITING}%'" in queries["executions_wake_waiting"]
    if backend == "postgres":
        assert f"LIKE '{WAITING}%'" in queries["execution_finish_final"]
