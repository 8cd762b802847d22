"""What the tiny benchmark runs share: run a ``bench/`` script, read its ``BENCH_JSON`` line, and
list the schemas and databases benchmarks make (each must drop its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg

from onbeat.testing.postgres import TEST_SERVER
from tests.faults.process import REPO


def _names(query: str) -> set[str]:
    with psycopg.connect(TEST_SERVER) as conn:
        return {row[0] for row in conn.execute(query).fetchall()}


def bench_schemas() -> set[str]:
    return _names("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'onbeat_bench_%'")


def peer_databases() -> set[str]:
    """The databases ``bench/peers/run.py`` makes for onbeat's entries."""
    return _names("SELECT datname FROM pg_database WHERE datname LIKE 'peers_onbeat%'")


def run_bench(script: str, *args: str) -> dict[str, Any]:
    """The script's ``BENCH_JSON`` summary; it must exit 0 (nothing lost, duplicated or early)."""
    done = subprocess.run(
        [sys.executable, script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON ")]
    summary: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    return summary
