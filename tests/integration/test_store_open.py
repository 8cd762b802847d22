"""Opening a SQLite store: several nodes set up one new database file at the same moment."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import pytest

from onbeat.store.queries import migrations
from onbeat.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
OPENERS = 8
FILES = 20
OPEN_ON_GO = f"""
import sys
from onbeat.store.sqlite import SQLiteStore
sys.stdin.readline()  # go
for n in range({FILES}):  # every opener on the same new file at about the same moment
    SQLiteStore(f"{{sys.argv[1]}}/{{n}}.db", shard_count=4).close()
"""


def test_open__waits_while_another_connection_writes_to_the_new_file(tmp_path: Path) -> None:
    """SQLite refuses the switch to WAL at once (no busy wait) while another connection writes;
    opening must wait for it, not die with "database is locked"."""
    path = tmp_path / "onbeat.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # as a node setting up the same file is, for a moment
        with ThreadPoolExecutor(1) as pool:
            opening = pool.submit(SQLiteStore, path)
            with pytest.raises(TimeoutError):  # still waiting, not failed
                opening.result(timeout=0.5)
            other.execute("COMMIT")
            opening.result(timeout=30).close()


@pytest.mark.slow
def test_open__nodes_setting_up_one_new_file_at_once_all_succeed_and_migrate_once(
    tmp_path: Path,
) -> None:
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_ON_GO, str(tmp_path)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(OPENERS)
    ]
    for opener in openers:  # all started (importing), then all told to open at once
        assert opener.stdin is not None
        opener.stdin.write("go\n")
        opener.stdin.flush()
    errors = [opener.communicate(timeout=60)[1] for opener in openers]
    assert [opener.returncode for opener in openers] == [0] * OPENERS, errors
    for n in range(FILES):
        with closing(sqlite3.connect(tmp_path / f"{n}.db")) as db:
            applied = db.execute("SELECT version FROM onbeat_migrations ORDER BY version")
            assert [v for (v,) in applied] == [v for v, _ in migrations("sqlite")]
            assert db.execute("SELECT count(*) FROM shard_leases").fetchone() == (4,)
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
