"""A PostgreSQL 15 cluster of the test's own, for the scenarios that restart or crash it (S6):
the shared server on 5432 serves other suites and must never be touched.

``initdb`` and ``pg_ctl`` refuse to run as root, so they run as the ``postgres`` user
(``runuser``) on a data directory that user owns: a fresh directory under the system's temp
dir (a pytest ``tmp_path`` is private to root), removed on exit after its server log is copied
into the artifacts. Trust auth on loopback only; ``fsync`` and ``synchronous_commit`` stay on
(RELIABILITY.md's durability settings): a crash must lose nothing acknowledged.

``initdb`` runs once per process: later clusters copy its data directory (``cp -a``, a fraction
of a second where ``initdb`` takes several on a busy box)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.client.conftest import free_port
from tests.faults.process import wait_until

BIN = Path(os.environ.get("ONBEAT_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
OWNER = "postgres"


def _as_owner(tool: str, *args: str, timeout: float = 120) -> None:
    done = subprocess.run(
        ["runuser", "-u", OWNER, "--", str(BIN / tool), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{tool} {' '.join(args)}: {done.stdout}{done.stderr}"


@functools.cache
def _template() -> Path:
    """A fresh ``initdb`` data directory, made once per process and removed at its exit."""
    directory = Path(tempfile.mkdtemp(prefix="onbeat-faults-pg-template-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    shutil.chown(directory, OWNER, OWNER)
    data = directory / "data"
    # --no-sync: only initdb's own final flush of the new files; the server keeps fsync on.
    _as_owner("initdb", "-D", str(data), "-A", "trust", "-U", OWNER, "--no-sync")
    return data


class PrivatePostgres:
    """``initdb`` + ``pg_ctl`` as ``postgres``; ``url`` is its superuser's, database ``postgres``."""

    def __init__(self, logs: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.logs = logs
        self.directory = Path(tempfile.mkdtemp(prefix="onbeat-faults-pg-"))
        shutil.chown(self.directory, OWNER, OWNER)
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.url = f"postgresql://{OWNER}@127.0.0.1:{self.port}/postgres?connect_timeout=5"

    def init(self) -> None:
        """The template's copy (owner and modes kept), with this cluster's settings."""
        subprocess.run(["cp", "-a", str(_template()), str(self.data)], check=True)
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory}'",
            "max_connections": "200",
            "fsync": "on",
            "synchronous_commit": "on",
            "shared_buffers": "64MB",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())

    def pg_ctl(self, action: str, *args: str) -> float:
        """``pg_ctl <action>`` (``-w``: it returns once done); returns the wall time it did."""
        _as_owner("pg_ctl", action, "-D", str(self.data), "-l", str(self.log), "-w", *args)
        return time.time()

    def start(self) -> float:
        started = self.pg_ctl("start")
        wait_until(self.answers, 30, f"PostgreSQL on port {self.port}")
        return started

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.pg_ctl("stop", "-m", "immediate")
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.log.exists():
            shutil.copy(self.log, self.logs / "postgres.log")
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(logs: Path) -> Iterator[PrivatePostgres]:
    cluster = PrivatePostgres(logs)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.close()
