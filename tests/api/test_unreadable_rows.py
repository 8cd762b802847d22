"""A job row onbeat cannot render (written into the store with SQL, behind onbeat's back) never
takes a listing down: the listing leaves it out and logs it, and reading that one job is a clear
problem document, not an internal error."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing

import httpx
import pytest

from onbeat import App
from onbeat.errors import UnreadableRecordError
from tests.api.conftest import assert_problem

CORRUPTIONS = {
    "params not JSON": ("params = '{not json'", "params is not JSON"),
    "params not an object": ("params = '[1, 2]'", "params must be a JSON object"),
    "params NaN": ("""params = '{"x": NaN}'""", "params contains NaN"),
    "max_attempts 2.5": ("max_attempts = 2.5", "max_attempts must be an integer"),
    "priority text": ("priority = 'high'", "priority must be an integer"),
    "timeout negative": ("timeout = -1", "timeout must be a number of seconds"),
    "unknown overlap": ("overlap = 'sometimes'", "'sometimes' is not a valid OverlapPolicy"),
    "bad cron": (
        "schedule_kind = 'cron', schedule_expression = 'every day'",
        "cron invalid expression 'every day'",
    ),
    "created_at text": ("created_at = 'yesterday'", "unsupported type"),
}


def corrupt(app: App, job_id: str, assignments: str) -> None:
    path = app.settings.database_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (job_id,))


@pytest.mark.parametrize(("assignments", "says"), CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
async def test_list_jobs__leaves_an_unreadable_row_out_and_logs_it(
    client: httpx.AsyncClient,
    onbeat_app: App,
    caplog: pytest.LogCaptureFixture,
    assignments: str,
    says: str,
) -> None:
    jobs = [onbeat_app.schedule("echo", {"n": n}, cron="0 * * * *").id for n in range(5)]
    bad = jobs[2]
    corrupt(onbeat_app, bad, assignments)
    good = [j for j in jobs if j != bad]
    seen: list[str] = []
    cursor = None
    with caplog.at_level(logging.ERROR, logger="onbeat.store"):
        for _ in range(len(jobs)):  # two per page: the bad row sits inside a page
            response = await client.get(
                "/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}
            )
            assert response.status_code == 200, response.text
            seen += [item["id"] for item in response.json()["items"]]
            cursor = response.json()["next_cursor"]
            if cursor is None:
                break
    assert seen == good
    assert [j.id for j in onbeat_app.list_jobs()] == good  # the Python API, too
    logged = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert logged and all(says in message for message in logged), caplog.text


@pytest.mark.parametrize(("assignments", "says"), CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
async def test_get_job__unreadable_row_is_a_problem_naming_it(
    client: httpx.AsyncClient, onbeat_app: App, assignments: str, says: str
) -> None:
    bad = onbeat_app.schedule("echo", cron="0 * * * *").id
    corrupt(onbeat_app, bad, assignments)
    for response in (
        await client.get(f"/jobs/{bad}"),
        await client.get(f"/jobs/{bad}/executions"),
        await client.post(f"/jobs/{bad}/pause"),
    ):
        doc = assert_problem(response, 500)
        assert doc["type"] == "urn:onbeat:problem:unreadable-record"
        assert bad in doc["detail"] and says in doc["detail"], doc
    with pytest.raises(UnreadableRecordError, match=says):
        onbeat_app.get_job(bad)
