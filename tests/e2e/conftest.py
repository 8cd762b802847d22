"""Real ``onbeat up`` processes on a temporary SQLite file, with the ledger app
(``tests/faults/ledger_app.py``): each run writes start and end lines to a file of its own, so lost
and duplicate runs are counted independently of the store."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.conftest import free_port
from tests.faults.process import APP as APP
from tests.faults.process import REPO as REPO
from tests.faults.process import read_ledger as read_ledger
from tests.faults.process import wait_for_output as wait_for_output
from tests.faults.process import wait_until as wait_until

StartNode = Callable[..., subprocess.Popen[bytes]]
"""``start(env, log, *args)``: starts ``onbeat up --app <ledger app> *args`` (with ``--port`` of a
free port unless ``--no-api`` is among ``args``), its output appended to ``log``."""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Short leases and intervals, so failures are detected within seconds."""
    yield {
        **os.environ,
        # This checkout's onbeat, whatever the virtualenv has installed.
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
        "ONBEAT_DATABASE_URL": f"sqlite:///{tmp_path / 'onbeat.db'}",
        "ONBEAT_TEST_LEDGER": str(tmp_path / "ledger.jsonl"),
        "ONBEAT_LEASE_TTL": "2",
        "ONBEAT_HEARTBEAT_INTERVAL": "0.5",
        "ONBEAT_SHARD_LEASE_TTL": "2",
        "ONBEAT_SHARD_RENEW_INTERVAL": "0.5",
        "ONBEAT_SWEEP_INTERVAL": "1",
        "ONBEAT_SWEEP_OVERDUE": "3",
        "ONBEAT_LOG_LEVEL": "WARNING",
    }


@pytest.fixture
def start_node() -> Iterator[StartNode]:
    """Starts `onbeat up` processes; any still running when the test ends is killed and reaped."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
        port = () if "--no-api" in args else ("--port", str(free_port()))
        with log.open("ab") as out:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "onbeat", "up", "--app", APP, *port, *args],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


StartOnbeat = Callable[..., subprocess.Popen[bytes]]
"""``start(env, log, *args)``: starts ``onbeat *args`` (any command), its output appended to ``log``."""


@pytest.fixture
def start_onbeat() -> Iterator[StartOnbeat]:
    """Starts `onbeat` processes; any still running when the test ends is killed and reaped."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "onbeat", *args],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
