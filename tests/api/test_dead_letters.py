"""``/executions`` and ``/dead-letters``: attempt history, listing, replay and drop."""

from __future__ import annotations

import httpx

from onbeat import App, ExecutionStatus
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem, make_dead_letter, snapshot


async def test_get_execution__with_its_attempts(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    execution_id = await make_dead_letter(onbeat_app, clock)
    response = await client.get(f"/executions/{execution_id}")
    assert response.status_code == 200
    execution = response.json()
    assert (execution["status"], execution["attempt"], execution["last_error"]) == (
        "failed",
        1,
        "RuntimeError: boom 1",
    )
    [attempt] = execution["attempts"]
    assert (attempt["attempt"], attempt["outcome"], attempt["error"]) == (
        1,
        "failed",
        "RuntimeError: boom 1",
    )
    assert attempt["started_at"].endswith("Z")


async def test_get_execution__unknown_id_is_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/executions/0123456789abcdef0123456789abcdef"), 404)


async def test_list_dead_letters__pages(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    ids = sorted([await make_dead_letter(onbeat_app, clock) for _ in range(3)])
    first = (await client.get("/dead-letters", params={"limit": 2})).json()
    second = (
        await client.get("/dead-letters", params={"limit": 2, "cursor": first["next_cursor"]})
    ).json()
    assert [d["id"] for d in first["items"] + second["items"]] == ids
    assert second["next_cursor"] is None
    dead = first["items"][0]
    assert (dead["task"], dead["params"], dead["attempts"], dead["last_error"]) == (
        "fail",
        {},
        1,
        "RuntimeError: boom 1",
    )
    assert dead["execution_id"] == dead["id"]
    assert_problem(await client.get("/dead-letters", params={"cursor": "bm9wZQ"}), 400, "cursor")


async def test_replay_dead_letter__runs_the_execution_again(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    execution_id = await make_dead_letter(onbeat_app, clock)
    response = await client.post(f"/dead-letters/{execution_id}/replay")
    assert response.status_code == 200, response.text
    execution = response.json()
    assert (execution["id"], execution["status"], execution["attempt"]) == (
        execution_id,
        "scheduled",
        0,
    )
    assert len(execution["attempts"]) == 1  # the history is kept
    assert (await client.get("/dead-letters")).json()["items"] == []
    assert onbeat_app.get_execution(execution_id).status is ExecutionStatus.SCHEDULED


async def test_drop_dead_letter__204_then_404(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    execution_id = await make_dead_letter(onbeat_app, clock)
    response = await client.delete(f"/dead-letters/{execution_id}")
    assert (response.status_code, response.content) == (204, b"")
    assert (await client.get("/dead-letters")).json() == {"items": [], "next_cursor": None}
    assert onbeat_app.get_execution(execution_id).status is ExecutionStatus.FAILED
    before = snapshot(onbeat_app)
    assert_problem(await client.delete(f"/dead-letters/{execution_id}"), 404)
    assert_problem(await client.post(f"/dead-letters/{execution_id}/replay"), 404)
    assert snapshot(onbeat_app) == before
