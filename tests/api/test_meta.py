"""Tasks, schedule previews, health, readiness, unknown routes and the OpenAPI document."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from onbeat import App
from tests.api.conftest import PROBLEM, assert_problem


async def test_list_tasks__registered_tasks_with_default_policies(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/tasks")
    assert response.status_code == 200
    assert response.json() == {
        "items": [
            {
                "name": "echo",
                "is_async": False,
                "max_attempts": 5,
                "backoff": 2.0,
                "backoff_max": 60.0,
                "timeout": 30.0,
            },
            {
                "name": "fail",
                "is_async": False,
                "max_attempts": 1,
                "backoff": 1.0,
                "backoff_max": 300.0,
                "timeout": None,
            },
        ],
        "next_cursor": None,
    }


async def test_preview__flags_the_spring_forward_gap(client: httpx.AsyncClient) -> None:
    params: dict[str, str | int] = {
        "expression": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "after": "2026-03-27T12:00:00+00:00",
        "count": 3,
    }
    response = await client.get("/schedules/preview", params=params)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "fire_times": [
            {"at": "2026-03-28T01:30:00Z", "dst": None},
            {"at": "2026-03-29T01:00:00Z", "dst": "gap"},
            {"at": "2026-03-30T00:30:00Z", "dst": None},
        ]
    }


async def test_preview__flags_the_fall_back_overlap(client: httpx.AsyncClient) -> None:
    params: dict[str, str | int] = {
        "expression": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "after": "2026-10-24T14:00:00+02:00",
        "count": 2,
    }
    response = await client.get("/schedules/preview", params=params)
    assert response.json()["fire_times"] == [
        {"at": "2026-10-25T00:30:00Z", "dst": "overlap"},
        {"at": "2026-10-26T01:30:00Z", "dst": None},
    ]


async def test_preview__starts_now_and_shows_ten_by_default(client: httpx.AsyncClient) -> None:
    response = await client.get("/schedules/preview", params={"expression": "@hourly"})
    fire_times = response.json()["fire_times"]
    assert len(fire_times) == 10
    assert fire_times[0] == {"at": "2026-01-05T13:00:00Z", "dst": None}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "expression"),
        ({"expression": ""}, "expression"),
        ({"expression": "* * *"}, "expression"),
        ({"expression": "0 0 31 2 *"}, "expression"),
        ({"expression": "x" * 257}, "expression"),
        ({"expression": "* * * * *", "timezone": "Europe/Atlantis"}, "timezone"),
        ({"expression": "* * * * *", "timezone": "../../etc/passwd"}, "timezone"),
        ({"expression": "* * * * *", "after": "2026-01-01T00:00:00"}, "after"),
        ({"expression": "* * * * *", "after": "yesterday"}, "after"),
        ({"expression": "* * * * *", "after": "9999-12-31T23:59:59-14:00"}, "after"),
        ({"expression": "* * * * *", "count": 0}, "count"),
        ({"expression": "* * * * *", "count": 101}, "count"),
    ],
)
async def test_preview__invalid_query_is_422_naming_it(
    client: httpx.AsyncClient, params: dict[str, Any], field: str
) -> None:
    assert_problem(await client.get("/schedules/preview", params=params), 422, field)


async def test_preview__unencoded_plus_gets_a_hint(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/schedules/preview?expression=@daily&after=2026-01-01T00:00:00+01:00"
    )
    doc = assert_problem(response, 422, "after")
    assert "%2B" in doc["detail"]


async def test_preview__near_the_end_of_time_returns_what_there_is(
    client: httpx.AsyncClient,
) -> None:
    params: dict[str, str | int] = {
        "expression": "@yearly",
        "after": "9999-06-01T00:00:00Z",
        "count": 5,
    }
    response = await client.get("/schedules/preview", params=params)
    assert response.status_code == 200
    assert response.json() == {"fire_times": []}


async def test_healthz__ok(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


async def test_readyz__ok_when_the_store_answers(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert (response.status_code, response.json()) == (
        200,
        {"status": "ready", "checks": {"store": "ok", "store_writes": "ok"}},
    )


async def test_readyz__503_when_the_store_does_not_answer(
    client: httpx.AsyncClient, onbeat_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(**_: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(onbeat_app, "list_jobs", unreachable)
    doc = assert_problem(await client.get("/readyz"), 503)
    assert "store" in doc["detail"]


async def test_unknown_route__404_problem(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/nothing-here"), 404)


async def test_wrong_method__405_problem_with_allow(client: httpx.AsyncClient) -> None:
    response = await client.put("/jobs")
    assert_problem(response, 405)
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


async def test_wrong_method_on_a_literal_path__allow_names_only_its_own_methods(
    client: httpx.AsyncClient,
) -> None:
    """/jobs/batch also matches the template /jobs/{job_id}, but it is another resource: its
    Allow is what the spec declares for it (Schemathesis, S9: allow_header_conformance)."""
    for method in ("OPTIONS", "PUT"):
        response = await client.request(method, "/jobs/batch")
        assert_problem(response, 405)
        assert response.headers["allow"] == "POST"


async def test_openapi__declares_every_error_as_a_problem_document(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("http://onbeat.test/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    operations = [op for path in spec["paths"].values() for op in path.values()]
    assert len(operations) == 21
    for operation in operations:
        for status, declared in operation["responses"].items():
            if status[0] in "45":
                assert list(declared["content"]) == [PROBLEM], (operation["operationId"], status)
    assert (await client.get("http://onbeat.test/docs")).status_code == 200
