"""``onbeat up`` serves the dashboard at ``/`` and says where (``scripts/up`` runs it)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import APP, REPO, START_TIMEOUT, base_env
from tests.client.conftest import free_port

pytestmark = pytest.mark.slow


def test_onbeat_up__prints_the_dashboard_url_and_serves_it(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "onbeat", "up", "--app", APP, "--port", str(port)]
    command += ["--database-url", f"sqlite:///{tmp_path / 'onbeat.db'}"]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    timer = threading.Timer(START_TIMEOUT, process.kill)  # a node that never says it is up
    timer.start()
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("onbeat dashboard:"):
                break
        assert lines[-1] == f"onbeat dashboard: http://127.0.0.1:{port}/\n", lines
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200
        assert "<h1>Overview" in page.text
    finally:
        timer.cancel()
        process.terminate()
        process.wait(START_TIMEOUT)
        assert process.stdout is not None
        process.stdout.close()
