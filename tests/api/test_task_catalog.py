"""The API of a process without the user's code (``onbeat api``): it knows the tasks workers
published to the store, with their defaults, and refuses the others; an unreachable store is 503."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App
from onbeat.api import create_app
from onbeat.app import PUBLISHED_TASK_TTL
from onbeat.errors import StoreUnavailableError
from onbeat.model import RetryPolicy
from onbeat.store.base import TaskDefaults
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem

MAIL = TaskDefaults("mail.send", RetryPolicy(7, 3.0, 90.0), timeout=45.0, is_async=True)


@pytest.fixture
def codeless(tmp_path: Path, clock: FakeClock) -> Iterator[App]:
    """An App with no task registered, as ``onbeat api`` has; a worker elsewhere published MAIL."""
    app = App(f"sqlite:///{tmp_path / 'db'}", clock=clock, task_ttl=600)
    app.store.task_publish("worker-1", [MAIL])
    yield app
    app.close()


@pytest.fixture
async def api(codeless: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(codeless))
    async with httpx.AsyncClient(transport=transport, base_url="http://onbeat.test/api/v1") as c:
        yield c


async def test_create_job__a_published_task_gets_its_defaults(api: httpx.AsyncClient) -> None:
    response = await api.post("/jobs", json={"task": "mail.send", "params": {"to": "a@b.c"}})
    assert response.status_code == 201, response.text
    job = response.json()
    assert (job["task"], job["max_attempts"], job["timeout"]) == ("mail.send", 7, 45.0)
    assert (job["backoff"], job["backoff_max"]) == (3.0, 90.0)


async def test_create_job__an_unpublished_task_is_422_naming_it(api: httpx.AsyncClient) -> None:
    response = await api.post("/jobs", json={"task": "mail.sned"})
    doc = assert_problem(response, 422, "task")
    assert "unknown task 'mail.sned'" in doc["detail"]


async def test_create_job__a_task_no_worker_published_within_task_ttl_is_refused(
    api: httpx.AsyncClient, codeless: App, clock: FakeClock
) -> None:
    clock.advance(601)
    assert_problem(await api.post("/jobs", json={"task": "mail.send"}), 422, "task")
    codeless.store.task_publish("worker-2", [MAIL])  # a worker with the task is back
    assert (await api.post("/jobs", json={"task": "mail.send"})).status_code == 201


async def test_create_job__a_published_task_is_read_once_per_ttl(
    api: httpx.AsyncClient, codeless: App, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[object] = []
    catalog = codeless.store.task_catalog

    def counted(*args: Any) -> Any:
        reads.append(args)
        return catalog(*args)

    monkeypatch.setattr(codeless.store, "task_catalog", counted)
    for _ in range(3):
        assert (await api.post("/jobs", json={"task": "mail.send"})).status_code == 201
    assert len(reads) == 1
    clock.advance(PUBLISHED_TASK_TTL)
    assert (await api.post("/jobs", json={"task": "mail.send"})).status_code == 201
    assert len(reads) == 2
    assert_problem(await api.post("/jobs", json={"task": "mail.sned"}), 422, "task")
    assert_problem(await api.post("/jobs", json={"task": "mail.sned"}), 422, "task")
    assert len(reads) == 4, "an unknown task is read again: a worker may publish it any moment"


async def test_list_tasks__published_tasks_with_their_defaults(api: httpx.AsyncClient) -> None:
    response = await api.get("/tasks")
    assert response.status_code == 200
    assert response.json()["items"] == [
        {
            "name": "mail.send",
            "is_async": True,
            "max_attempts": 7,
            "backoff": 3.0,
            "backoff_max": 90.0,
            "timeout": 45.0,
        }
    ]


def test_get_task__this_process_s_registry_comes_first(codeless: App) -> None:
    @codeless.task(name="mail.send", max_attempts=2)
    def send(ctx: Any) -> None: ...

    assert codeless.get_task("mail.send").retry.max_attempts == 2
    assert [t.retry.max_attempts for t in codeless.list_tasks()] == [2]


async def test_unreachable_store__503_with_retry_after(
    api: httpx.AsyncClient, codeless: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("connection to the store lost")

    monkeypatch.setattr(codeless.store, "job_create_many", unreachable)
    monkeypatch.setattr(codeless.store, "job_list", unreachable)
    created = await api.post("/jobs", json={"task": "mail.send"})
    doc = assert_problem(created, 503)
    assert doc["type"] == "urn:onbeat:problem:store-unavailable"
    assert created.headers["Retry-After"] == "5"
    assert_problem(await api.get("/jobs"), 503)


async def test_create_jobs__a_batch_reads_the_catalog_once_not_once_per_job(
    api: httpx.AsyncClient, codeless: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[list[str] | None] = []
    read_catalog = codeless.store.task_catalog

    def counted(seen_within: float, names: Any = None) -> Any:
        reads.append(None if names is None else list(names))
        return read_catalog(seen_within, names)

    monkeypatch.setattr(codeless.store, "task_catalog", counted)
    jobs = [{"task": "mail.send", "params": {"n": n}} for n in range(50)]
    response = await api.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 201, response.text
    assert {j["max_attempts"] for j in response.json()["items"]} == {7}  # the published defaults
    assert reads == [["mail.send"]]
    reads.clear()
    refused = await api.post("/jobs/batch", json={"jobs": [*jobs[:2], {"task": "mail.sned"}]})
    assert_problem(refused, 422, "jobs[2].task")
