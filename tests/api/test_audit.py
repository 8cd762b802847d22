"""``GET /jobs/{id}/audit``: every fire time of the schedule against the execution records."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import httpx
import pytest

from onbeat import App
from onbeat.auth import Role
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem, bearer, run_due


async def quarter_hourly_job(
    app: App, clock: FakeClock, hours: int = 1, tenant: str = "default"
) -> str:
    """A ``*/15`` cron job created at 12:00, run by the engine for ``hours`` hours."""
    job = app.schedule("echo", cron="*/15 * * * *", tenant=tenant)
    for _ in range(4 * hours):
        clock.advance(15 * 60)
        await run_due(app, clock)
    return job.id


async def test_audit__every_fire_has_its_record(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    response = await client.get(f"/jobs/{job_id}/audit")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "job_id": job_id,
        "since": "2026-01-05T12:00:00Z",  # default: the job's creation
        "until": "2026-01-05T13:00:00Z",  # default: now
        "expected": 4,
        "missing": [],
        "records": {"succeeded": 4},
    }


async def test_audit__a_fire_without_a_record_is_missing(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    [lost] = [e for e in onbeat_app.list_executions(job_id) if e.scheduled_for.minute == 30]
    path = onbeat_app.settings.database_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db, db:  # the record vanishes behind onbeat's back
        db.execute("DELETE FROM attempts WHERE execution_id = ?", (lost.id,))
        db.execute("DELETE FROM runs WHERE id = ?", (lost.id,))
        db.execute("DELETE FROM execution_history WHERE id = ?", (lost.id,))
    report = (await client.get(f"/jobs/{job_id}/audit")).json()
    assert (report["expected"], report["missing"], report["records"]) == (
        4,
        ["2026-01-05T12:30:00Z"],
        {"succeeded": 3},
    )


async def test_audit__a_range_with_offsets(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    params = {"since": "2026-01-05T13:20:00+01:00", "until": "2026-01-05T12:50:00Z"}
    report = (await client.get(f"/jobs/{job_id}/audit", params=params)).json()
    assert (report["since"], report["until"], report["expected"], report["missing"]) == (
        "2026-01-05T12:20:00Z",
        "2026-01-05T12:50:00Z",
        2,
        [],
    )
    assert report["records"] == {"succeeded": 2}


async def test_audit__until_in_the_future_stops_at_now(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    params = {"until": "2030-01-01T00:00:00Z"}
    report = (await client.get(f"/jobs/{job_id}/audit", params=params)).json()
    assert (report["until"], report["expected"], report["missing"]) == (
        "2026-01-05T13:00:00Z",
        4,
        [],
    )


async def test_audit__no_fire_yet_is_an_empty_report(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 3 * * *")
    report = (await client.get(f"/jobs/{job.id}/audit")).json()
    assert (report["expected"], report["missing"], report["records"]) == (0, [], {})


async def test_audit__a_paused_stretch_expects_nothing(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)  # 12:15 .. 13:00 fire
    await client.post(f"/jobs/{job_id}/pause")
    clock.advance(3600)  # 13:15 .. 14:00 would have fired
    await run_due(onbeat_app, clock)
    await client.post(f"/jobs/{job_id}/resume")
    report = (await client.get(f"/jobs/{job_id}/audit")).json()
    assert (report["expected"], report["missing"]) == (4, [])


async def test_audit__since_the_start_of_time_is_a_valid_range(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    response = await client.get(f"/jobs/{job_id}/audit", params={"since": "0001-01-01T00:00:00Z"})
    assert response.status_code == 200, response.text
    assert (response.json()["expected"], response.json()["missing"]) == (4, [])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "2026-01-05T12:00:00"}, "since"),
        ({"until": "2026-01-05T12:00:00"}, "until"),
        ({"since": "yesterday"}, "since"),
        ({"until": ""}, "until"),
        ({"since": "2026-01-05T12:30:00Z", "until": "2026-01-05T12:10:00Z"}, "since"),
        ({"since": "2027-01-01T00:00:00Z"}, "since"),  # after now
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
        ({"until": "9999-12-31T23:59:59-14:00"}, "until"),
        ({"since": "2026-01-05T12:00:00Z" + " " * 60}, "since"),
    ],
)
async def test_audit__a_bad_range_is_422_naming_the_bound(
    client: httpx.AsyncClient,
    onbeat_app: App,
    clock: FakeClock,
    params: dict[str, Any],
    field: str,
) -> None:
    job_id = await quarter_hourly_job(onbeat_app, clock)
    assert_problem(await client.get(f"/jobs/{job_id}/audit", params=params), 422, field)


async def test_audit__unknown_or_another_tenants_job_is_404(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    theirs = await quarter_hourly_job(onbeat_app, clock, tenant="rival")
    assert_problem(await client.get("/jobs/0123456789abcdef0123456789abcdef/audit"), 404)
    _, key = onbeat_app.create_api_key("acme", Role.READER)
    assert_problem(await client.get(f"/jobs/{theirs}/audit", headers=bearer(key)), 404)
    _, own = onbeat_app.create_api_key("rival", Role.READER)
    assert (await client.get(f"/jobs/{theirs}/audit", headers=bearer(own))).status_code == 200
