"""A node's graceful stop is bounded: one that hangs past ``shutdown_grace`` plus
``SHUTDOWN_OVERRUN`` exits (1) with every thread's stack on stderr, instead of waiting for a
SIGKILL that leaves no trace of where it hung."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import base_env

STUCK_NODE = """
import asyncio, sys
from onbeat import App, node
from onbeat.worker import Worker

async def stuck_shutdown(self):
    await asyncio.Event().wait()

Worker.shutdown = stuck_shutdown
node.SHUTDOWN_OVERRUN = 0.5
app = App(sys.argv[1], shutdown_grace=0.5)
asyncio.run(node.serve(app, None, scheduler=False, banner="up"))
"""


def run_node(script: str, tmp_path: Path) -> subprocess.Popen[str]:
    node = subprocess.Popen(
        [sys.executable, "-c", script, f"sqlite:///{tmp_path / 'onbeat.db'}"],
        env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert node.stdout is not None
    assert node.stdout.readline() == "up\n"  # its signal handlers are in place
    return node


def test_node_stop__one_that_hangs_exits_with_every_tasks_and_threads_stack(tmp_path: Path) -> None:
    node = run_node(STUCK_NODE, tmp_path)
    node.send_signal(signal.SIGTERM)
    _, stderr = node.communicate(timeout=30)
    assert node.returncode == 1, stderr
    assert "the graceful stop is not over 1s after the signal" in stderr
    assert "in stuck_shutdown" in stderr  # where it hung: the await chain of each task
    assert "Thread 0x" in stderr  # and every thread's stack


def test_node_stop__one_that_ends_is_not_cut_short(tmp_path: Path) -> None:
    """The deadline is cancelled once the node has stopped: a program that goes on after
    ``serve`` returns is not exited under it."""
    script = STUCK_NODE.replace("Worker.shutdown = stuck_shutdown", "") + (
        "import time; time.sleep(1.5); print('still here', flush=True)\n"
    )
    node = run_node(script, tmp_path)
    node.send_signal(signal.SIGTERM)
    stdout, stderr = node.communicate(timeout=30)
    assert (node.returncode, stdout) == (0, "still here\n"), stderr
