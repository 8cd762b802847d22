"""``/jobs``: submit, read, list, edit, pause, resume, run and cancel, success and failure."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from typing import Any

import httpx
import pytest

from onbeat import App, ExecutionStatus, JobStatus
from onbeat.api.app import create_app
from onbeat.api.middleware import MAX_HEAD_BYTES
from onbeat.store.base import CreatedJob, NewJob
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem, run_due, snapshot

JSON = {"content-type": "application/json"}


async def post_job(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/jobs", json={"task": "echo", **body})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


# --- POST /jobs -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "host"),
    [("http://onbeat.test", None), ("https://a.example:8443", None), ("http://x", "b.example")],
)
async def test_create_job__location_names_the_job_at_the_host_asked(
    onbeat_app: App, base: str, host: str | None
) -> None:
    """The Location (made once per host and route, then reused) is what ``url_for`` gives for
    each Host and root path a request comes with, not the first request's."""
    for root_path in ("", "/behind-proxy"):
        transport = httpx.ASGITransport(app=create_app(onbeat_app), root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            headers = {"host": host} if host else {}
            for _ in range(2):  # the second from the cache
                response = await c.post(
                    "/api/v1/jobs", json={"task": "echo", "schedule": {"type": "now"}},
                    headers=headers,
                )  # fmt: skip
                assert response.status_code == 201, response.text
                netloc = host or base.split("://")[1]
                assert response.headers["location"] == (
                    f"{base.split('://')[0]}://{netloc}{root_path}/api/v1/jobs/"
                    f"{response.json()['id']}"
                )


async def test_create_job__cron_answers_201_with_next_fire_times(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/jobs",
        json={
            "task": "echo",
            "params": {"to": "ops@example.com"},
            "schedule": {
                "type": "cron",
                "expression": "0 9 * * MON-FRI",
                "timezone": "Europe/Berlin",
            },
            "overlap": "queue",
            "priority": 5,
        },
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["location"].endswith(f"/api/v1/jobs/{job['id']}")
    assert isinstance(job["id"], str)
    assert job["schedule"] == {
        "type": "cron",
        "expression": "0 9 * * MON-FRI",
        "at": None,
        "timezone": "Europe/Berlin",
    }
    assert job["params"] == {"to": "ops@example.com"}
    assert (job["status"], job["overlap"], job["misfire"], job["priority"]) == (
        "active",
        "queue",
        "run_once",
        5,
    )
    assert job["next_fire_at"] == "2026-01-06T08:00:00Z"
    assert [f["at"] for f in job["next_fire_times"]] == [
        "2026-01-06T08:00:00Z",
        "2026-01-07T08:00:00Z",
        "2026-01-08T08:00:00Z",
        "2026-01-09T08:00:00Z",
        "2026-01-12T08:00:00Z",
    ]
    assert all(f["dst"] is None for f in job["next_fire_times"])


async def test_create_job__defaults_to_now_with_the_task_policies(
    client: httpx.AsyncClient,
) -> None:
    job = await post_job(client)
    assert job["schedule"]["type"] == "now"
    assert (job["max_attempts"], job["timeout"], job["backoff"], job["backoff_max"]) == (
        5,
        30,
        2,
        60,
    )
    assert job["next_fire_times"] == [{"at": "2026-01-05T12:00:00Z", "dst": None}]
    assert job["created_at"] == "2026-01-05T12:00:00Z"


async def test_create_job__once_normalises_at_to_utc(client: httpx.AsyncClient) -> None:
    job = await post_job(client, schedule={"type": "once", "at": "2026-02-01T10:00:00+01:00"})
    assert job["schedule"]["at"] == "2026-02-01T09:00:00Z"
    assert job["next_fire_times"] == [{"at": "2026-02-01T09:00:00Z", "dst": None}]


INVALID_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"task": "nope"}, "task"),
    ({"params": {}}, "task"),
    ({"task": ""}, "task"),
    (
        {"task": "echo", "schedule": {"type": "cron", "expression": "61 * * * *"}},
        "schedule.expression",
    ),
    ({"task": "echo", "schedule": {"type": "cron"}}, "schedule.expression"),
    (
        {"task": "echo", "schedule": {"type": "cron", "expression": "0 0 30 2 *"}},
        "schedule.expression",
    ),
    (
        {
            "task": "echo",
            "schedule": {"type": "cron", "expression": "* * * * *", "timezone": "Mars/Base"},
        },
        "schedule.timezone",
    ),
    ({"task": "echo", "schedule": {"type": "once", "at": "2026-02-01T10:00:00"}}, "schedule.at"),
    ({"task": "echo", "schedule": {"type": "once", "at": "tomorrow"}}, "schedule.at"),
    ({"task": "echo", "schedule": {"type": "once"}}, "schedule.at"),
    ({"task": "echo", "schedule": {"type": "now", "at": "2026-02-01T10:00:00Z"}}, "schedule.at"),
    ({"task": "echo", "schedule": {"type": "weekly"}}, "schedule.type"),
    ({"task": "echo", "schedule": {"type": "now", "colour": "red"}}, "schedule.colour"),
    ({"task": "echo", "max_attempts": 0}, "max_attempts"),
    ({"task": "echo", "max_attempts": "3"}, "max_attempts"),
    ({"task": "echo", "priority": True}, "priority"),
    ({"task": "echo", "priority": 101}, "priority"),
    ({"task": "echo", "timeout": 0}, "timeout"),
    ({"task": "echo", "jitter": -1}, "jitter"),
    ({"task": "echo", "backoff": 1e12}, "backoff"),
    ({"task": "echo", "overlap": "sometimes"}, "overlap"),
    ({"task": "echo", "misfire": None, "colour": "red"}, "colour"),
    ({"task": "echo", "params": [1, 2]}, "params"),
    ({"task": "echo", "params": {"blob": "x" * 70_000}}, "params"),
]


@pytest.mark.parametrize(("body", "field"), INVALID_BODIES)
async def test_create_job__invalid_field_is_422_naming_it_and_stores_nothing(
    client: httpx.AsyncClient, onbeat_app: App, body: dict[str, Any], field: str
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    assert_problem(await client.post("/jobs", json=body), 422, field)
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"task": "echo", "params": {"x": NaN}}', "params"),
        (b'{"task": "echo", "timeout": Infinity}', "timeout"),
        (b'{"task": "echo", "timeout": 1e999}', "timeout"),
        (b'{"task": "echo", "params": {"x": "\\ud800"}}', "params"),
        (b'{"task": "\\udfff"}', "task"),
        (b'["echo"]', "body"),
        (b"", "body"),
    ],
)
async def test_create_job__json_that_is_not_a_valid_job_is_422(
    client: httpx.AsyncClient, onbeat_app: App, raw: bytes, field: str
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    assert_problem(await client.post("/jobs", content=raw, headers=JSON), 422, field)
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"task": "echo"', "not valid JSON"),
        (b"{'task': 'echo'}", "not valid JSON"),
        (b'{"task": "\xff\xfe"}', "not valid UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"task": "echo", "priority": ' + b"9" * 5000 + b"}", "could not be parsed"),
    ],
)
async def test_create_job__unreadable_body_is_400(
    client: httpx.AsyncClient, onbeat_app: App, raw: bytes, says: str
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    doc = assert_problem(await client.post("/jobs", content=raw, headers=JSON), 400, "body")
    assert says in doc["errors"][0]["message"]
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize(("depth", "status"), [(63, 201), (64, 422), (900, 422), (2000, 400)])
async def test_create_job__params_nesting_is_capped(
    client: httpx.AsyncClient, depth: int, status: int
) -> None:
    raw = b'{"task": "echo", "params": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    response = await client.post("/jobs", content=raw, headers=JSON)
    assert response.status_code == status, response.text
    if status == 201:
        job_id = response.json()["id"]
        assert (await client.get(f"/jobs/{job_id}")).status_code == 200


async def test_create_job__body_over_the_cap_is_413(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    big = b'{"task": "echo", "params": {"x": "' + b"x" * (1024 * 1024) + b'"}}'
    assert_problem(await client.post("/jobs", content=big, headers=JSON), 413, "body")

    async def chunked() -> Any:  # no Content-Length: judged by the bytes received
        for _ in range(20):
            yield b" " * 65536

    assert_problem(await client.post("/jobs", content=chunked(), headers=JSON), 413, "body")
    assert snapshot(onbeat_app) == before


async def test_create_job__head_over_the_cap_is_431(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    """A request line and headers longer than MAX_HEAD_BYTES are refused whatever parsed them,
    and one just under it is served."""
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    body = {"task": "echo"}
    note = {"X-Note": "n" * (MAX_HEAD_BYTES + 1)}
    doc = assert_problem(await client.post("/jobs", json=body, headers=note), 431, "headers")
    assert str(MAX_HEAD_BYTES) in doc["detail"]
    long_query = await client.get("/jobs", params={"q": "q" * (MAX_HEAD_BYTES + 1)})
    assert_problem(long_query, 431, "headers")
    assert snapshot(onbeat_app) == before
    fits = {"X-Note": "n" * (MAX_HEAD_BYTES - 1024)}
    assert (await client.post("/jobs", json=body, headers=fits)).status_code == 201


# --- Idempotency-Key --------------------------------------------------------------------------
async def test_create_job__idempotency_key_returns_the_first_job(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    body = {"task": "echo", "params": {"n": 1}}
    first = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k-1"})
    again = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k-1"})
    other = await client.post("/jobs", json=body, headers={"Idempotency-Key": "k-2"})
    assert first.status_code == again.status_code == other.status_code == 201
    assert again.json()["id"] == first.json()["id"] != other.json()["id"]
    assert (first.headers["idempotent-replayed"], again.headers["idempotent-replayed"]) == (
        "false",
        "true",
    )
    assert "idempotent-replayed" not in (await client.post("/jobs", json=body)).headers
    assert len(onbeat_app.list_jobs()) == 3


async def test_create_job__concurrent_retries_with_one_key_have_exactly_one_creator(
    client: httpx.AsyncClient, onbeat_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a POST replayed is decided by the insert itself: two retries that both get past
    every check before either inserts make one job, and exactly one says it created it."""
    arrived = threading.Barrier(2, timeout=10)
    create = onbeat_app.store.job_create

    def create_together(new: NewJob) -> CreatedJob:
        arrived.wait()  # both requests are in the store call before either inserts
        return create(new)

    monkeypatch.setattr(onbeat_app.store, "job_create", create_together)
    body, key = {"task": "echo", "params": {"n": 1}}, {"Idempotency-Key": "k-race"}
    answers = await asyncio.gather(*(client.post("/jobs", json=body, headers=key) for _ in "ab"))
    assert [a.status_code for a in answers] == [201, 201]
    assert answers[0].json()["id"] == answers[1].json()["id"]
    replayed = sorted(a.headers.get("idempotent-replayed", "false") for a in answers)
    assert replayed == ["false", "true"]
    assert len(onbeat_app.list_jobs()) == 1


async def test_create_job__idempotency_key_reused_with_another_body_is_422(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    await client.post("/jobs", json={"task": "echo"}, headers={"Idempotency-Key": "k"})
    before = snapshot(onbeat_app)
    response = await client.post(
        "/jobs", json={"task": "echo", "priority": 1}, headers={"Idempotency-Key": "k"}
    )
    assert_problem(response, 422, "Idempotency-Key")
    assert snapshot(onbeat_app) == before


async def test_create_job__rejected_request_does_not_use_up_its_idempotency_key(
    client: httpx.AsyncClient,
) -> None:
    key = {"Idempotency-Key": "k"}
    assert_problem(await client.post("/jobs", json={"task": "nope"}, headers=key), 422, "task")
    assert (await client.post("/jobs", json={"task": "echo"}, headers=key)).status_code == 201


async def test_create_job__overlong_idempotency_key_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/jobs", json={"task": "echo"}, headers={"Idempotency-Key": "k" * 256}
    )
    assert_problem(response, 422, "Idempotency-Key")


# --- GET /jobs/{id} ---------------------------------------------------------------------------
async def test_get_job__definition_and_recent_executions_newest_first(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 * * * *"})
    await client.post(f"/jobs/{job['id']}/run")
    await run_due(onbeat_app, clock)
    clock.advance(10)
    await client.post(f"/jobs/{job['id']}/run")

    response = await client.get(f"/jobs/{job['id']}")
    assert response.status_code == 200
    got = response.json()
    assert {k: v for k, v in got.items() if k not in ("executions", "updated_at")} == {
        k: v for k, v in job.items() if k != "updated_at"
    }
    executions = got["executions"]
    assert [e["scheduled_for"] for e in executions] == [
        "2026-01-05T13:00:00Z",
        "2026-01-05T12:00:10Z",
        "2026-01-05T12:00:00Z",
    ]
    assert [(e["trigger"], e["status"], e["attempt"]) for e in executions] == [
        ("schedule", "scheduled", 0),
        ("manual", "scheduled", 0),
        ("manual", "succeeded", 1),
    ]
    [attempt] = executions[2]["attempts"]
    assert (attempt["attempt"], attempt["outcome"], attempt["error"]) == (1, "succeeded", None)
    assert executions[2]["result"] == {}


async def test_get_job__unknown_id_is_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/jobs/0123456789abcdef0123456789abcdef"), 404)
    assert_problem(await client.get("/jobs/%00%FF"), 404)


# --- GET /jobs --------------------------------------------------------------------------------
async def test_list_jobs__keyset_pages_cover_every_job_once(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    # Pages are in id order: creation order to the millisecond (ids made within one are random).
    created = sorted(onbeat_app.schedule("echo", {"n": n}).id for n in range(7))
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/jobs", params=params)).json()
        pages += 1
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert (seen, pages) == (created, 3)
    whole = (await client.get("/jobs", params={"limit": 7})).json()
    assert ([j["id"] for j in whole["items"]], whole["next_cursor"]) == (created, None)


async def test_list_jobs__filters_by_status_and_task(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    echo = [onbeat_app.schedule("echo", cron="0 * * * *").id for _ in range(3)]
    fail = onbeat_app.schedule("fail", cron="0 * * * *").id
    onbeat_app.pause(echo[1])
    paused = (await client.get("/jobs", params={"status": "paused"})).json()
    assert [j["id"] for j in paused["items"]] == [echo[1]]
    by_task = (await client.get("/jobs", params={"task": "fail"})).json()
    assert [j["id"] for j in by_task["items"]] == [fail]
    both = (await client.get("/jobs", params={"task": "echo", "status": "active"})).json()
    assert [j["id"] for j in both["items"]] == sorted([echo[0], echo[2]])


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({"cursor": "!!!"}, 400, "cursor"),
        ({"cursor": "a"}, 400, "cursor"),
        ({"cursor": _cursor("foo")}, 400, "cursor"),
        ({"cursor": _cursor("executions:0123456789abcdef0123456789abcdef")}, 400, "cursor"),
        ({"cursor": _cursor("jobs:' OR 1=1 --")}, 400, "cursor"),
        ({"cursor": "x" * 201}, 422, "cursor"),
        ({"limit": 0}, 422, "limit"),
        ({"limit": 501}, 422, "limit"),
        ({"limit": "ten"}, 422, "limit"),
        ({"status": "sleeping"}, 422, "status"),
    ],
)
async def test_list_jobs__bad_query_is_a_problem_naming_it(
    client: httpx.AsyncClient, params: dict[str, Any], status: int, field: str
) -> None:
    assert_problem(await client.get("/jobs", params=params), status, field)


# --- PATCH /jobs/{id} -------------------------------------------------------------------------
async def test_update_job__changes_params_and_policies(client: httpx.AsyncClient) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 * * * *"})
    response = await client.patch(
        f"/jobs/{job['id']}",
        json={"params": {"v": 2}, "max_attempts": 9, "overlap": "allow", "timeout": 5},
    )
    assert response.status_code == 200, response.text
    got = response.json()
    assert (got["params"], got["max_attempts"], got["overlap"], got["timeout"]) == (
        {"v": 2},
        9,
        "allow",
        5,
    )
    assert got["schedule"] == job["schedule"]
    assert got["next_fire_at"] == job["next_fire_at"]


async def test_update_job__new_schedule_supersedes_planned_runs(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 * * * *"})
    response = await client.patch(
        f"/jobs/{job['id']}",
        json={"schedule": {"expression": "30 6 * * *", "timezone": "Asia/Tokyo"}},
    )
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["schedule"]["expression"] == "30 6 * * *"
    assert got["next_fire_at"] == "2026-01-05T21:30:00Z"
    executions = onbeat_app.list_executions(job["id"])  # the old 13:00 was never due: gone
    assert [(e.status, e.scheduled_for.isoformat()) for e in executions] == [
        (ExecutionStatus.SCHEDULED, "2026-01-05T21:30:00+00:00")
    ]


async def test_update_job__timezone_alone_rezones_a_cron_job(client: httpx.AsyncClient) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 9 * * *"})
    got = (
        await client.patch(f"/jobs/{job['id']}", json={"schedule": {"timezone": "Europe/Berlin"}})
    ).json()
    assert got["schedule"] == {
        "type": "cron",
        "expression": "0 9 * * *",
        "at": None,
        "timezone": "Europe/Berlin",
    }
    assert got["next_fire_at"] == "2026-01-06T08:00:00Z"


async def test_update_job__an_unchanged_schedule_keeps_the_planned_run(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 * * * *"})
    response = await client.patch(
        f"/jobs/{job['id']}",
        json={"schedule": {"type": "cron", "expression": " 0 * * * * ", "timezone": "UTC"}},
    )
    assert response.status_code == 200, response.text
    [execution] = onbeat_app.list_executions(job["id"])
    assert execution.status is ExecutionStatus.SCHEDULED


async def test_update_job__a_new_schedule_with_the_same_next_fire_keeps_a_planned_run(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job = await post_job(client, schedule={"type": "cron", "expression": "0 * * * *"})
    clock.advance(40 * 60)
    response = await client.patch(
        f"/jobs/{job['id']}", json={"schedule": {"expression": "0,30 * * * *"}}
    )
    assert response.status_code == 200
    pending = [e for e in onbeat_app.list_executions(job["id"]) if not e.status.is_final]
    assert [e.scheduled_for.isoformat() for e in pending] == ["2026-01-05T13:00:00+00:00"]


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (
            "cron",
            {"schedule": {"expression": "* * * * *", "at": "2026-02-01T00:00:00Z"}},
            "schedule",
        ),
        ("cron", {"schedule": {}}, "schedule"),
        ("cron", {"schedule": {"type": "now"}}, "schedule.type"),
        ("cron", {"schedule": {"type": "once"}}, "schedule.at"),
        ("cron", {"schedule": {"type": "cron", "at": "2026-02-01T00:00:00Z"}}, "schedule.at"),
        ("cron", {"schedule": {"expression": "not cron"}}, "schedule.expression"),
        ("cron", {"schedule": {"timezone": "Nowhere/City"}}, "schedule.timezone"),
        ("once", {"schedule": {"timezone": "Europe/Berlin"}}, "schedule.timezone"),
        ("once", {"schedule": {"type": "cron"}}, "schedule.expression"),
        ("once", {"schedule": {"type": "once", "expression": "* * * * *"}}, "schedule.expression"),
        ("cron", {"params": {"x": "\ud800"}}, "params"),
        ("cron", {"max_attempts": 1001}, "max_attempts"),
        ("cron", {"misfire": "never"}, "misfire"),
        ("cron", {"catchup_window": 10}, "catchup_window"),
        ("cron", {"task": "fail"}, "task"),
    ],
)
async def test_update_job__invalid_change_is_422_and_changes_nothing(
    client: httpx.AsyncClient, onbeat_app: App, kind: str, body: dict[str, Any], field: str
) -> None:
    if kind == "cron":
        job = onbeat_app.schedule("echo", cron="0 * * * *")
    else:
        job = onbeat_app.schedule("echo", at="2026-02-01T00:00:00Z")
    before = snapshot(onbeat_app)
    raw = json.dumps(body).encode()  # ASCII-escaped, so a lone surrogate reaches the server
    assert_problem(await client.patch(f"/jobs/{job.id}", content=raw, headers=JSON), 422, field)
    assert snapshot(onbeat_app) == before


async def test_update_job__unknown_id_is_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.patch("/jobs/missing", json={"priority": 1}), 404)


# --- pause / resume / run / cancel ------------------------------------------------------------
async def test_pause_and_resume__round_trip(client: httpx.AsyncClient, onbeat_app: App) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    paused = await client.post(f"/jobs/{job.id}/pause")
    assert (paused.status_code, paused.json()["status"]) == (200, "paused")
    assert (await client.post(f"/jobs/{job.id}/pause")).json()["status"] == "paused"
    resumed = await client.post(f"/jobs/{job.id}/resume")
    assert (resumed.status_code, resumed.json()["status"]) == (200, "active")


async def test_run_job__creates_a_manual_execution(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    response = await client.post(f"/jobs/{job.id}/run")
    assert response.status_code == 201, response.text
    execution = response.json()
    assert (execution["job_id"], execution["trigger"], execution["status"]) == (
        job.id,
        "manual",
        "scheduled",
    )
    assert execution["scheduled_for"] == "2026-01-05T12:00:00Z"
    assert response.headers["location"].endswith(f"/api/v1/executions/{execution['id']}")


async def test_cancel_job__tombstones_pending_executions(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    response = await client.delete(f"/jobs/{job.id}")
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    assert response.json()["next_fire_times"] == []
    [execution] = onbeat_app.list_executions(job.id)
    assert (execution.status, execution.reason) == (ExecutionStatus.CANCELLED, "job cancelled")
    assert onbeat_app.get_job(job.id).status is JobStatus.CANCELLED


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/pause", None),
        ("POST", "/resume", None),
        ("POST", "/run", None),
        ("PATCH", "", {"priority": 3}),
    ],
)
async def test_cancelled_job__changes_are_409_and_change_nothing(
    client: httpx.AsyncClient, onbeat_app: App, method: str, path: str, body: dict[str, Any] | None
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    onbeat_app.cancel(job.id)
    before = snapshot(onbeat_app)
    assert_problem(await client.request(method, f"/jobs/{job.id}{path}", json=body), 409)
    assert snapshot(onbeat_app) == before


async def test_run_job__paused_job_is_409(client: httpx.AsyncClient, onbeat_app: App) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    onbeat_app.pause(job.id)
    before = snapshot(onbeat_app)
    assert_problem(await client.post(f"/jobs/{job.id}/run"), 409)
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/run"),
        ("DELETE", ""),
        ("GET", "/executions"),
    ],
)
async def test_job_actions__unknown_id_is_404(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    assert_problem(
        await client.request(method, f"/jobs/0123456789abcdef0123456789abcdef{path}"), 404
    )


# --- GET /jobs/{id}/executions ----------------------------------------------------------------
async def test_list_executions__pages_newest_first_and_filters(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    for _ in range(5):
        clock.advance(1)
        onbeat_app.run_now(job.id)
    expected = [e.id for e in onbeat_app.list_executions(job.id)]
    first = (await client.get(f"/jobs/{job.id}/executions", params={"limit": 4})).json()
    second = (
        await client.get(
            f"/jobs/{job.id}/executions", params={"limit": 4, "cursor": first["next_cursor"]}
        )
    ).json()
    assert [e["id"] for e in first["items"] + second["items"]] == expected
    assert second["next_cursor"] is None
    times = [e["scheduled_for"] for e in first["items"] + second["items"]]
    assert times == sorted(times, reverse=True)
    manual = (await client.get(f"/jobs/{job.id}/executions", params={"status": "succeeded"})).json()
    assert manual == {"items": [], "next_cursor": None}


async def test_list_executions__cursor_of_another_job_or_list_is_400(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    a = onbeat_app.schedule("echo", cron="0 * * * *")
    b = onbeat_app.schedule("echo", cron="0 * * * *")
    onbeat_app.run_now(a.id)
    page = (await client.get(f"/jobs/{a.id}/executions", params={"limit": 1})).json()
    assert page["next_cursor"] is not None
    response = await client.get(f"/jobs/{b.id}/executions", params={"cursor": page["next_cursor"]})
    assert_problem(response, 400, "cursor")
    jobs_cursor = _cursor(f"jobs:{a.id}")
    assert_problem(
        await client.get(f"/jobs/{a.id}/executions", params={"cursor": jobs_cursor}), 400, "cursor"
    )
    gone = _cursor("executions:0123456789abcdef0123456789abcdef")
    assert_problem(
        await client.get(f"/jobs/{a.id}/executions", params={"cursor": gone}), 400, "cursor"
    )
    assert_problem(
        await client.get(f"/jobs/{a.id}/executions", params={"status": "done"}), 422, "status"
    )


async def test_list_executions__since_pages_every_run_from_then_on_exactly_once(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")  # plans 13:00
    for _ in range(6):
        clock.advance(60)
        onbeat_app.run_now(job.id)  # 12:01 .. 12:06
    since = "2026-01-05T12:03:00Z"
    expected = [  # newest first: 13:00, 12:06, 12:05, 12:04, 12:03
        e.id for e in onbeat_app.list_executions(job.id) if e.scheduled_for.minute != 1
    ][:5]
    for limit in (1, 2, 3, 5, 6):
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"since": since, "limit": limit}
            page = (
                await client.get(
                    f"/jobs/{job.id}/executions",
                    params=params | ({"cursor": cursor} if cursor else {}),
                )
            ).json()
            pages += 1
            assert len(page["items"]) == limit or page["next_cursor"] is None  # no short pages
            seen += [e["id"] for e in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == expected, limit
        assert pages == -(-len(expected) // limit), limit  # and no empty last page
    at_offset = {"since": "2026-01-05T13:03:00+01:00", "status": "scheduled"}
    page = (await client.get(f"/jobs/{job.id}/executions", params=at_offset)).json()
    assert [e["scheduled_for"] for e in page["items"]][:2] == [
        "2026-01-05T13:00:00Z",
        "2026-01-05T12:06:00Z",
    ]
    later = {"since": "2026-01-05T14:00:00Z"}
    assert (await client.get(f"/jobs/{job.id}/executions", params=later)).json() == {
        "items": [],
        "next_cursor": None,
    }


@pytest.mark.parametrize("since", ["2026-01-05T12:00:00", "noon", "0001-01-01T00:00:00+01:00"])
async def test_list_executions__bad_since_is_422(
    client: httpx.AsyncClient, onbeat_app: App, since: str
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    response = await client.get(f"/jobs/{job.id}/executions", params={"since": since})
    assert_problem(response, 422, "since")
