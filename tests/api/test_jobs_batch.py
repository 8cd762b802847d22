"""``POST /jobs/batch``: many jobs in one request and one transaction, all or none."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from onbeat import App
from tests.api.conftest import assert_problem, snapshot

CRON = {"type": "cron", "expression": "*/5 * * * *", "timezone": "Europe/Berlin"}


async def test_create_jobs__answers_each_job_in_order_and_stores_them(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    body = {
        "jobs": [
            {"task": "echo", "params": {"n": 1}},
            {"task": "echo", "params": {"n": 2}, "schedule": CRON, "priority": 7},
            {"task": "echo", "schedule": {"type": "once", "at": "2999-01-01T00:00:00Z"}},
        ]
    }
    response = await client.post("/jobs/batch", json=body)
    assert response.status_code == 201, response.text
    items = response.json()["items"]
    assert [j["params"] for j in items] == [{"n": 1}, {"n": 2}, {}]
    assert [j["schedule"]["type"] for j in items] == ["now", "cron", "once"]
    assert items[1]["priority"] == 7 and items[1]["next_fire_times"]
    for job in items:
        stored = (await client.get(f"/jobs/{job['id']}")).json()
        assert stored["id"] == job["id"] and stored["params"] == job["params"]
    assert len(onbeat_app.list_jobs()) == 3


@pytest.mark.parametrize(
    ("jobs", "field"),
    [
        ([{"task": "echo"}, {"task": "echo", "schedule": {"type": "cron"}}], "jobs[1].schedule"),
        ([{"task": "echo"}, {"task": "nope"}], "jobs[1].task"),
        (
            [{"task": "echo", "schedule": {**CRON, "expression": "61 * * * *"}}],
            "jobs[0].schedule.expression",
        ),
        ([{"task": "echo"}, {"task": "echo", "priority": 101}], "jobs[1].priority"),
        ([], "jobs"),
        ([{"task": "echo"}] * 1001, "jobs"),
    ],
)
async def test_create_jobs__one_bad_job_is_422_naming_it_and_stores_none(
    client: httpx.AsyncClient, onbeat_app: App, jobs: list[dict[str, Any]], field: str
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    problem = assert_problem(await client.post("/jobs/batch", json={"jobs": jobs}), 422)
    assert any(e["field"].startswith(field) for e in problem["errors"]), problem
    assert snapshot(onbeat_app) == before


async def test_create_jobs__a_retried_batch_with_its_key_creates_nothing_more(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    body = {"jobs": [{"task": "echo", "params": {"n": n}} for n in range(3)]}
    headers = {"Idempotency-Key": "nightly-import-42"}
    first = await client.post("/jobs/batch", json=body, headers=headers)
    assert first.status_code == 201, first.text
    assert first.headers["Idempotent-Replayed"] == "false"
    again = await client.post("/jobs/batch", json=body, headers=headers)
    assert again.status_code == 201, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert [j["id"] for j in again.json()["items"]] == [j["id"] for j in first.json()["items"]]
    assert len(onbeat_app.list_jobs()) == 3
    other = await client.post("/jobs/batch", json=body, headers={"Idempotency-Key": "other"})
    assert other.headers["Idempotent-Replayed"] == "false"
    assert len(onbeat_app.list_jobs()) == 6


async def test_create_jobs__a_key_reused_for_another_batch_is_refused_and_nothing_stored(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    headers = {"Idempotency-Key": "k"}
    jobs = [{"task": "echo", "params": {"n": n}} for n in range(2)]
    assert (await client.post("/jobs/batch", json={"jobs": jobs}, headers=headers)).is_success
    changed = [jobs[0], {"task": "echo", "params": {"n": 99}}, {"task": "echo"}]
    response = await client.post("/jobs/batch", json={"jobs": changed}, headers=headers)
    assert_problem(response, 422, "Idempotency-Key")
    assert len(onbeat_app.list_jobs()) == 2


async def test_create_jobs__a_key_too_long_for_a_batch_is_refused(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    body = {"jobs": [{"task": "echo"}]}
    response = await client.post("/jobs/batch", json=body, headers={"Idempotency-Key": "k" * 251})
    assert_problem(response, 422, "Idempotency-Key")
    assert onbeat_app.list_jobs() == []
