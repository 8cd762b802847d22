"""The fleet as separate processes on one SQLite file: ``onbeat migrate``, then ``onbeat api``,
``onbeat scheduler`` and ``onbeat worker`` each in its own process.

The API has no user code: it accepts a job only for a task a worker published to the store. Runs
go from the scheduler process to the worker process through the delay queue, so that part needs a
queue the processes share; it takes the queue URL as a parameter and is expected to fail (strict)
for any URL ``onbeat.queue.open_queue`` does not accept yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App, ExecutionStatus
from onbeat.clock import SystemClock
from onbeat.queue import open_queue
from tests.client.conftest import free_port
from tests.e2e.conftest import (
    APP,
    REPO,
    StartOnbeat,
    read_ledger,
    wait_for_output,
    wait_until,
)

pytestmark = pytest.mark.slow

REDIS_DB = 11
"""The Redis database these tests use (flushed before each), apart from other test suites'."""
FLEET_QUEUES = {
    "redis": f"redis://127.0.0.1:6379/{REDIS_DB}",
    "store-table": "{database_url}",  # the table-backed queue in the store's own database
}


def _queue_accepted(url: str) -> bool:
    """Whether ``open_queue`` has a backend for ``url`` (probed on a throwaway file if the URL
    is the store's)."""
    with tempfile.TemporaryDirectory() as scratch:
        probe_url = url.format(database_url=f"sqlite:///{scratch}/probe.db")
        try:
            queue = open_queue(probe_url, SystemClock())
        except ValueError:
            return False
        asyncio.run(queue.close())
    return True


def _fleet_queue(name: str) -> Any:
    url = FLEET_QUEUES[name]
    if _queue_accepted(url):
        return pytest.param(url, id=name)
    reason = "needs a cross-process queue"
    return pytest.param(url, id=name, marks=pytest.mark.xfail(strict=True, reason=reason))


def _migrate(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onbeat", "migrate"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def _api(env: dict[str, str], tmp_path: Path, start: StartOnbeat) -> Iterator[httpx.Client]:
    """``onbeat api`` on a free port, and a client of its ``/api/v1``."""
    port = free_port()
    log = tmp_path / "api.log"
    process = start(env, log, "api", "--port", str(port), "--no-migrate")
    wait_for_output(process, log, "onbeat API:")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=10) as client:
        yield client
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_fleet__api_without_code_accepts_only_tasks_a_worker_published(
    env: dict[str, str], tmp_path: Path, start_onbeat: StartOnbeat
) -> None:
    _migrate(env)
    with _api(env, tmp_path, start_onbeat) as api:
        before = api.post("/jobs", json={"task": "work"})
        assert before.status_code == 422, before.text
        assert "unknown task 'work'" in before.json()["detail"]

        worker_log = tmp_path / "worker.log"
        worker = start_onbeat(env, worker_log, "worker", "--app", APP, "--no-migrate")
        wait_for_output(worker, worker_log, "onbeat worker:")

        def published() -> bool:
            return "work" in [t["name"] for t in api.get("/tasks").json()["items"]]

        wait_until(published, 30, "the worker to publish its tasks")
        created = api.post("/jobs", json={"task": "work", "params": {"duration": 0.01}})
        assert created.status_code == 201, created.text
        job = created.json()
        assert (job["max_attempts"], job["backoff"], job["backoff_max"]) == (5, 0.2, 1.0)
        typo = api.post("/jobs", json={"task": "wrok"})
        assert typo.status_code == 422
        assert [e["field"] for e in typo.json()["errors"]] == ["task"]
        assert "unknown task 'wrok'" in typo.json()["detail"]
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker_log.read_text()[-3000:]


@pytest.mark.parametrize("queue_url", [_fleet_queue(name) for name in FLEET_QUEUES])
def test_fleet__scheduler_worker_and_api_processes_run_every_run(
    queue_url: str, env: dict[str, str], tmp_path: Path, start_onbeat: StartOnbeat
) -> None:
    queue_url = queue_url.format(database_url=env["ONBEAT_DATABASE_URL"])
    if queue_url.startswith("redis://"):
        import redis  # type: ignore[import-not-found,unused-ignore]

        redis.Redis.from_url(queue_url).flushdb()
    env = {**env, "ONBEAT_QUEUE_URL": queue_url, "ONBEAT_POLL_INTERVAL": "0.1"}
    _migrate(env)
    scheduler_log, worker_log = tmp_path / "scheduler.log", tmp_path / "worker.log"
    scheduler = start_onbeat(env, scheduler_log, "scheduler", "--no-migrate")
    worker = start_onbeat(env, worker_log, "worker", "--app", APP, "--no-migrate")
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    with _api(env, tmp_path, start_onbeat) as api:
        wait_for_output(scheduler, scheduler_log, "onbeat scheduler:")
        wait_for_output(worker, worker_log, "onbeat worker:")
        wait_until(lambda: api.get("/tasks").json()["items"], 30, "the worker's tasks")
        now = datetime.now(UTC)
        submitted = [{"task": "work", "params": {"duration": 0.05}} for _ in range(20)]
        submitted += [
            {
                "task": "work_sync",
                "schedule": {
                    "type": "once",
                    "at": (now + timedelta(seconds=1 + i / 10)).isoformat(),
                },
            }
            for i in range(20)
        ]
        one_shots = [api.post("/jobs", json=body).json()["id"] for body in submitted]
        cron = api.post(
            "/jobs",
            json={
                "task": "work_sync",
                "schedule": {"type": "cron", "expression": "* * * * * *"},
                "overlap": "allow",
            },
        ).json()
        cutoff = datetime.fromisoformat(cron["created_at"]) + timedelta(seconds=4)
        store = App(env["ONBEAT_DATABASE_URL"])

        def all_ran() -> bool:
            if datetime.now(UTC) < cutoff + timedelta(seconds=1):
                return False
            done = all(store.list_executions(j)[0].status.is_final for j in one_shots)
            cron_runs = [
                e for e in store.list_executions(cron["id"], 100) if e.scheduled_for <= cutoff
            ]
            return done and all(e.status.is_final for e in cron_runs)

        wait_until(all_ran, 60, "every run to finish")
        for process, log in ((scheduler, scheduler_log), (worker, worker_log)):
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, log.read_text()[-3000:]

    ends = Counter(e["execution_id"] for e in read_ledger(ledger) if e["event"] == "end")
    runs = [store.list_executions(j)[0] for j in one_shots]
    runs += [e for e in store.list_executions(cron["id"], 100) if e.scheduled_for <= cutoff]
    assert all(run.status is ExecutionStatus.SUCCEEDED for run in runs)
    assert [run.id for run in runs if ends[run.id] != 1] == []  # each ran exactly once
    assert {e["pid"] for e in read_ledger(ledger)} == {worker.pid}  # in the worker process
    assert store.audit(cron["id"], until=cutoff).missing == []
    store.close()
