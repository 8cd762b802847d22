"""One validation for both surfaces: the same bad values, fed to the Python API and to the REST API,
are refused by both with the same message, naming the same field (the REST body's path for the
schedule's ``cron``/``at``/``timezone``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from onbeat import App, ValidationError
from tests.api.conftest import assert_problem, snapshot

NAN, INF = float("nan"), float("inf")
DEEP: dict[str, Any] = {"x": []}
_inner = DEEP["x"]
for _ in range(64):  # params nested 66 levels: one past the limit
    _inner.append([])
    _inner = _inner[0]

REST_FIELD = {"cron": "schedule.expression", "at": "schedule.at", "timezone": "schedule.timezone"}
BAD_NUMBERS = [True, "1", NAN, INF, -INF, 10**30, 10**400]
"""Wrong for every number: a bool, a string, not finite, huge."""

BAD_OPTIONS: list[tuple[str, Any]] = [
    *(("max_attempts", v) for v in [*BAD_NUMBERS, -1, 0, 1001, 2.5, 2.0]),
    *(("priority", v) for v in [*BAD_NUMBERS, 101, -101, 1.0, 1.5]),
    *(("timeout", v) for v in [*BAD_NUMBERS, -1, 0, 0.0, 1e12]),
    *(("backoff", v) for v in [*BAD_NUMBERS, -1, -0.5, 1e12]),
    *(("backoff_max", v) for v in [*BAD_NUMBERS, -1, 1e12]),
    *(("jitter", v) for v in [*BAD_NUMBERS, -1, 1e12]),
    *(("overlap", v) for v in ["sometimes", "", "SKIP", 5, True, ["skip"]]),
    *(("misfire", v) for v in ["never", 0, False, {"run": "once"}]),
    *(
        ("params", v)
        for v in [
            [1, 2],
            "x",
            5,
            True,
            {"x": NAN},
            {"x": [INF]},
            {"blob": "x" * 70_000},
            {"x": "\ud800"},
            {"\udfff": 1},
            DEEP,
        ]
    ),
    *(("cron", v) for v in ["", 5, "61 * * * *", "0 0 30 2 *", "* " * 200, ["* * * * *"]]),
    *(("at", v) for v in ["", 5, "tomorrow", "2026-02-01T10:00:00", "2026-02-01T10:00:00Z" * 4]),
    *(("timezone", v) for v in ["", 5, "Mars/Base", "x" * 65, "../../etc/passwd", "\ud800"]),
]
"""(argument, bad value) pairs that JSON can carry (NaN and Infinity as the JS literals)."""

CREATE_ONLY: list[tuple[str, Any]] = [
    *(("catchup_window", v) for v in [*BAD_NUMBERS, -1, 1e12]),
    *(("task", v) for v in ["", 5, None, "x" * 201, "nope", "\ud800"]),
]


def _create_body(arg: str, value: Any) -> dict[str, Any]:
    """The POST /jobs body that gives the REST API what ``App.schedule(**{arg: value})`` gives
    the Python one."""
    if arg == "task":
        return {"task": value}
    if arg == "cron":
        return {"task": "echo", "schedule": {"type": "cron", "expression": value}}
    if arg == "at":
        return {"task": "echo", "schedule": {"type": "once", "at": value}}
    if arg == "timezone":
        schedule = {"type": "cron", "expression": "* * * * *", "timezone": value}
        return {"task": "echo", "schedule": schedule}
    return {"task": "echo", arg: value}


def _schedule_args(arg: str, value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``App.schedule`` arguments for the same submission."""
    if arg == "task":
        return (value,), {}
    if arg == "timezone":
        return ("echo",), {"cron": "* * * * *", "timezone": value}
    return ("echo",), {arg: value}


def _patch_body(arg: str, value: Any) -> dict[str, Any]:
    if arg in ("cron", "at", "timezone"):
        return {"schedule": {{"cron": "expression"}.get(arg, arg): value}}
    return {arg: value}


def _refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(ValidationError) as refused:
        call()
    return refused.value.field, refused.value.message


async def _rest_refusal(response: httpx.Response) -> tuple[str, str]:
    doc = assert_problem(response, 422)
    assert len(doc["errors"]) == 1, doc
    return doc["errors"][0]["field"], doc["errors"][0]["message"]


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as their JavaScript literals


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(("arg", "value"), BAD_OPTIONS + CREATE_ONLY, ids=repr)
async def test_schedule__python_and_rest_refuse_alike(
    client: httpx.AsyncClient, onbeat_app: App, arg: str, value: Any
) -> None:
    onbeat_app.schedule("echo")
    before = snapshot(onbeat_app)
    args, kwargs = _schedule_args(arg, value)
    field, message = _refusal(lambda: onbeat_app.schedule(*args, **kwargs))
    assert field == arg
    response = await client.post("/jobs", content=_json(_create_body(arg, value)), headers=JSON)
    assert await _rest_refusal(response) == (REST_FIELD.get(arg, arg), message)
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize(("arg", "value"), BAD_OPTIONS, ids=repr)
async def test_update_job__python_and_rest_refuse_alike(
    client: httpx.AsyncClient, onbeat_app: App, arg: str, value: Any
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    before = snapshot(onbeat_app)
    field, message = _refusal(lambda: onbeat_app.update_job(job.id, **{arg: value}))
    assert field == arg
    response = await client.patch(
        f"/jobs/{job.id}", content=_json(_patch_body(arg, value)), headers=JSON
    )
    assert await _rest_refusal(response) == (REST_FIELD.get(arg, arg), message)
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize("key", ["", "k" * 256])
async def test_idempotency_key__python_and_rest_refuse_alike(
    client: httpx.AsyncClient, onbeat_app: App, key: str
) -> None:
    field, message = _refusal(lambda: onbeat_app.schedule("echo", idempotency_key=key))
    response = await client.post("/jobs", json={"task": "echo"}, headers={"Idempotency-Key": key})
    assert await _rest_refusal(response) == (field, message) == ("Idempotency-Key", message)


@pytest.mark.parametrize("timezone", ["Europe/Berlin", 5, ""])
async def test_update_job__rezoning_a_one_shot_job_is_refused_alike(
    client: httpx.AsyncClient, onbeat_app: App, timezone: Any
) -> None:
    job = onbeat_app.schedule("echo", at="2026-06-01T00:00:00Z")
    field, message = _refusal(lambda: onbeat_app.update_job(job.id, timezone=timezone))
    response = await client.patch(f"/jobs/{job.id}", json={"schedule": {"timezone": timezone}})
    assert await _rest_refusal(response) == ("schedule.timezone", message)
    assert field == "timezone"
