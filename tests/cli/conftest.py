"""A real ``onbeat up`` process on a temporary SQLite file, and a runner for the real ``onbeat``
command against it."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from onbeat.client import Client
from tests.client.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
APP = "tests.cli.cli_app:app"
START_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0


def base_env() -> dict[str, str]:
    """This environment without any ONBEAT_* setting, importing onbeat and the tests from here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONBEAT_")}
    return {**env, "PYTHONPATH": str(REPO), "ONBEAT_LOG_LEVEL": "WARNING"}


@dataclass
class Node:
    url: str
    database_url: str

    def client(self, api_key: str | None = None) -> Client:
        return Client(self.url, api_key)


@contextlib.contextmanager
def running_node(tmp: Path, log_level: str = "WARNING") -> Iterator[Node]:
    """``onbeat up --app tests.cli.cli_app:app`` on a free port, until the block ends; waits for
    its "onbeat API:" line (with a deadline), stops it with SIGTERM. Its stderr (the log) goes to
    ``tmp / "node.log"``."""
    port = free_port()
    database_url = f"sqlite:///{tmp / 'onbeat.db'}"
    env = {**base_env(), "ONBEAT_POLL_INTERVAL": "0.05", "ONBEAT_SHUTDOWN_GRACE": "1"}
    command = [sys.executable, "-m", "onbeat", "up", "--app", APP, "--port", str(port)]
    command += ["--log-level", log_level]
    with (tmp / "node.log").open("wb") as log:
        process = subprocess.Popen(
            [*command, "--database-url", database_url],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # keeps reading, so the node never blocks on a full pipe
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, name="onbeat-up-stdout", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                log_text = (tmp / "node.log").read_text()
                raise RuntimeError(f"onbeat up did not print its API URL; its log:\n{log_text}")
            if line.startswith("onbeat API:"):
                break
        yield Node(f"http://127.0.0.1:{port}", database_url)
    finally:
        process.terminate()
        try:
            process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(START_TIMEOUT)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """One node for the CLI tests that need no API key (each works on jobs it creates)."""
    with running_node(tmp_path_factory.mktemp("cli-node")) as started:
        yield started


def onbeat(
    *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``onbeat`` command (``ONBEAT_URL`` = ``url``) and return what it did."""
    full_env = {**base_env(), **({"ONBEAT_URL": url} if url else {}), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "onbeat", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def onbeat_all(
    *calls: Sequence[str], url: str | None = None, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Run independent ``onbeat`` commands at once (each is mostly interpreter start-up)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda args: onbeat(*args, url=url, env=env), calls))
