"""Real ``onbeat up`` processes on a temporary SQLite file, with the ledger app
(``tests/faults/ledger_app.py``): each run writes start and end lines to a file of its own, so lost
and duplicate runs are counted independently of the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
APP = "tests.faults.ledger_app:app"

StartNode = Callable[..., subprocess.Popen[bytes]]
"""``start(env, log, *args)``: starts ``onbeat up --app <ledger app> *args`` (with ``--port`` of a
free port unless ``--no-api`` is among ``args``), its output appended to ``log``."""


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Complete lines only: a line being appended while we read has no newline yet."""
    if not path.exists():
        return []
    *complete, _partial = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


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


def wait_for_output(
    process: subprocess.Popen[bytes], log: Path, text: str, timeout: float = 60
) -> None:
    """Until ``log`` holds ``text``; fails at once, with the log, if ``process`` exits first."""

    def printed() -> bool:
        if process.poll() is not None:
            raise AssertionError(
                f"{process.args!r} exited ({process.returncode}) before printing {text!r}:\n"
                + log.read_text()[-3000:]
            )
        return text in log.read_text()

    wait_until(printed, timeout, f"{text!r} in {log.name}")
