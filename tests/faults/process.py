"""Helpers every process-level test shares: where the checkout is, the ledger app, waiting for a
condition or a log line, reading a ledger file."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
APP = "tests.faults.ledger_app:app"
FLEET_PYTHONPATH = f"{REPO / 'src'}{os.pathsep}{REPO}"
"""The product's processes import onbeat and the ledger app from the checkout."""


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
