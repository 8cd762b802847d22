"""Every named SQL statement is used, and every one used exists (no dead or missing SQL)."""

from __future__ import annotations

import re
from pathlib import Path

import onbeat.store.sqlite
from onbeat.store.queries import load_queries, migrations


def test_queries__every_sqlite_statement_is_used_and_every_used_one_exists() -> None:
    source = Path(onbeat.store.sqlite.__file__).read_text()
    used = set(re.findall(r'Q\["(\w+)"\]', source))
    assert used == set(load_queries("sqlite"))


def test_migrations__numbered_from_one_without_gaps() -> None:
    versions = [version for version, _ in migrations("sqlite")]
    expected = range(1, max(versions) + 1)
    assert versions == list(expected)


def test_queries__waiting_runs_are_found_by_the_reason_plan_gives_them() -> None:
    """The wake-up statement spells plan.WAITING out as a literal."""
    from onbeat.plan import WAITING

    assert f"LIKE '{WAITING}%'" in load_queries("sqlite")["executions_wake_waiting"]
