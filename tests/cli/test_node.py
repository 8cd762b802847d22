"""The commands that open the store directly (``up``, ``scheduler``, ``worker``, ``api``,
``migrate``, ``keys``) on a database they cannot open: one line naming the path and the reason,
and a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import APP, COMMAND_TIMEOUT, REPO, base_env

pytestmark = pytest.mark.slow

COMMANDS = {
    "up": ["up", "--app", APP],
    "scheduler": ["scheduler"],
    "worker": ["worker", "--app", APP],
    "api": ["api"],
    "migrate": ["migrate"],
    "keys list": ["keys", "list"],
    "keys create": ["keys", "create", "--tenant", "acme", "--role", "admin"],
}
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def run(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "onbeat", *args],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users may enter (pytest's tmp_path sits in a private one)."""
    path = Path(tempfile.mkdtemp())
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _refused(command: str, url: str, prefix: tuple[str, ...] = ()) -> str:
    done = run(*COMMANDS[command], "--database-url", url, prefix=prefix)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("command", COMMANDS)
def test_unopenable_database__nonexistent_directory(command: str) -> None:
    line = _refused(command, "sqlite:///nonexistent/dir/x.db")
    missing = REPO / "nonexistent" / "dir"
    assert line == (
        f"Error: cannot open the store {missing / 'x.db'}: directory {missing} does not exist"
    )
    assert not (REPO / "nonexistent").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_unopenable_database__a_directory(command: str, tmp_path: Path) -> None:
    line = _refused(command, f"sqlite:///{tmp_path}")
    assert line == f"Error: cannot open the store {tmp_path}: it is a directory"


@pytest.mark.parametrize("command", COMMANDS)
def test_unopenable_database__not_a_database(command: str, tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("shopping list\n" * 100)
    line = _refused(command, f"sqlite:///{path}")
    assert line == f"Error: cannot open the store {path}: the file is not an SQLite database"
    assert path.read_text() == "shopping list\n" * 100


@pytest.mark.parametrize("command", COMMANDS)
def test_unopenable_database__no_permission(command: str, shared_dir: Path) -> None:
    path = shared_dir / "onbeat.db"
    path.touch(mode=0o000)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root reads any file: run the command as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop to another user")
        prefix = tuple(AS_NOBODY)
    line = _refused(command, f"sqlite:///{path}", prefix)
    assert line == (
        f"Error: cannot open the store {path}: permission denied (it must be readable and writable)"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_unopenable_database__unsupported_scheme(command: str) -> None:
    line = _refused(command, "mysql://db.example/onbeat")
    assert line == (
        "Error: cannot open the store 'mysql://db.example/onbeat': unsupported scheme "
        "(expected sqlite:///PATH or postgresql://...)"
    )
