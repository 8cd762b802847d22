"""A store that refuses writes (its disk is full): writes answer 503 with a problem document and
Retry-After, /readyz says not ready until a write succeeds again, and nothing already stored is
lost or damaged. The disk fills for real: a small tmpfs (where this may mount one), else SQLite's
own page cap."""

from __future__ import annotations

import contextlib
import errno
import sqlite3
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App, TaskContext
from onbeat.api import create_app
from onbeat.store.sqlite import SQLiteStore
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem

PAD = "x" * 16_000
"""Params padding: each job needs a few fresh pages."""


class Disk:
    """Where the database lives, and how to fill it up and free it again."""

    directory: Path

    def fill(self, app: App) -> None: ...

    def free(self, app: App) -> None: ...


@dataclass
class Tmpfs(Disk):
    """A 2 MiB tmpfs, filled by a file written until the filesystem says ENOSPC."""

    directory: Path

    def fill(self, app: App) -> None:
        filler = (self.directory / "filler").open("wb", buffering=0)
        with filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 65536)
        with pytest.raises(OSError) as full:
            (self.directory / "one-more").write_bytes(b"\0" * 65536)
        assert full.value.errno == errno.ENOSPC

    def free(self, app: App) -> None:
        (self.directory / "filler").unlink()
        (self.directory / "one-more").unlink(missing_ok=True)


@dataclass
class PageCap(Disk):
    """SQLite's max_page_count, set to the database's size: no page more may be allocated."""

    directory: Path

    def _connection(self, app: App) -> sqlite3.Connection:
        store = app.store
        assert isinstance(store, SQLiteStore)
        return store._conn  # the cap is per connection: the store's own

    def fill(self, app: App) -> None:
        connection = self._connection(app)
        [pages] = connection.execute("PRAGMA page_count").fetchone()
        connection.execute(f"PRAGMA max_page_count = {pages}")

    def free(self, app: App) -> None:
        self._connection(app).execute("PRAGMA max_page_count = 1000000")


@contextlib.contextmanager
def tmpfs() -> Iterator[Path]:
    mount_point = Path(tempfile.mkdtemp())
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
        mount_point.rmdir()


@pytest.fixture(params=["tmpfs", "page-cap"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    if request.param == "page-cap":
        yield PageCap(tmp_path)
        return
    with tmpfs() as mount_point:
        yield Tmpfs(mount_point)


@pytest.fixture
async def full_setup(disk: Disk, clock: FakeClock) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    app = App(f"sqlite:///{disk.directory / 'onbeat.db'}", clock=clock)

    @app.task(name="echo")
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    transport = httpx.ASGITransport(app=create_app(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://onbeat.test/api/v1") as c:
        yield app, c
    app.close()


def _counts(path: Path) -> tuple[str, list[str], int, int]:
    """integrity_check, the job ids, and the executions and job events there are."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        [integrity] = db.execute("PRAGMA integrity_check").fetchone()
        jobs = [job_id for (job_id,) in db.execute("SELECT id FROM jobs ORDER BY id")]
        [executions] = db.execute("SELECT count(*) FROM executions").fetchone()
        [events] = db.execute("SELECT count(*) FROM job_events").fetchone()
    return integrity, jobs, executions, events


async def test_full_disk__writes_are_503_and_not_ready_until_a_write_succeeds_again(
    disk: Disk, full_setup: tuple[App, httpx.AsyncClient]
) -> None:
    app, client = full_setup
    stored = []
    for n in range(3):
        created = await client.post("/jobs", json={"task": "echo", "params": {"n": n}})
        assert created.status_code == 201
        stored.append(created.json()["id"])
    disk.fill(app)

    for _ in range(100):  # what is left of the last free pages goes first
        response = await client.post("/jobs", json={"task": "echo", "params": {"pad": PAD}})
        if response.status_code != 201:
            break
        stored.append(response.json()["id"])
    else:
        pytest.fail("the store never refused a write")
    doc = assert_problem(response, 503)
    assert doc["type"] == "urn:onbeat:problem:store-refuses-writes"
    assert "refuses writes (database or disk is full)" in doc["detail"]
    assert response.headers["retry-after"] == "30"

    for _ in range(2):  # and stays not ready: reads still work, writes do not
        ready = await client.get("/readyz")
        assert "refuses writes" in assert_problem(ready, 503)["detail"]
        assert ready.headers["retry-after"] == "30"
    listed = await client.get("/jobs", params={"limit": 500})
    assert [job["id"] for job in listed.json()["items"]] == stored

    disk.free(app)
    ready = await client.get("/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    again = await client.post("/jobs", json={"task": "echo", "params": {"pad": PAD}})
    assert again.status_code == 201, again.text
    stored.append(again.json()["id"])

    app.close()
    integrity, jobs, executions, events = _counts(disk.directory / "onbeat.db")
    assert (integrity, jobs) == ("ok", stored)
    assert executions == events == len(stored)  # one first run and one "created" event each
