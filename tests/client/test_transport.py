"""What the client sends and how it reads what comes back, on a mock transport: every route of the
API has a method, auth and idempotency headers, and the errors a live node rarely produces
(timeouts, proxies' HTML, Retry-After, a service that is not onbeat)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat.api import create_app
from onbeat.client import (
    ApiConnectionError,
    ApiError,
    ApiTimeoutError,
    ApiValidationError,
    AsyncClient,
    Client,
    JobSpec,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    _Api,
    _Endpoint,
)
from tests.client.conftest import make_app

Handler = Callable[[httpx.Request], httpx.Response]


def mock_client(handler: Handler, api_key: str | None = None) -> Client:
    return Client("http://onbeat.test", api_key, transport=httpx.MockTransport(handler))


def problem(status: int, **extra: Any) -> dict[str, Any]:
    return {"type": "urn:x", "title": "T", "status": status, "detail": "d", "errors": [], **extra}


# Arguments that make each method send its request (the answers are not read here).
SAMPLE_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "create_job": (("echo",), {}),
    "create_jobs": (([JobSpec("echo")],), {}),
    "get_job": (("j1",), {}),
    "list_jobs": ((), {}),
    "update_job": (("j1",), {"priority": 1}),
    "pause": (("j1",), {}),
    "resume": (("j1",), {}),
    "run_now": (("j1",), {}),
    "cancel": (("j1",), {}),
    "audit": (("j1",), {}),
    "list_executions": (("j1",), {}),
    "get_execution": (("e1",), {}),
    "list_dead_letters": ((), {}),
    "replay_dead_letter": (("d1",), {}),
    "drop_dead_letter": (("d1",), {}),
    "get_tenant_limits": (("t1",), {}),
    "set_tenant_limits": (("t1",), {"max_in_flight": 3}),
    "list_tasks": ((), {}),
    "preview": (("* * * * *",), {}),
    "health": ((), {}),
    "ready": ((), {}),
}


def test_client__has_a_method_for_every_route_of_the_api(tmp_path: Path) -> None:
    endpoints = {n for n, v in vars(_Api).items() if isinstance(v, _Endpoint)}
    assert endpoints == set(SAMPLE_CALLS)
    sent: set[tuple[str, str]] = set()

    def record(request: httpx.Request) -> httpx.Response:
        sent.add((request.method, request.url.path))
        return httpx.Response(204)

    with mock_client(record) as client:
        for name, (args, kwargs) in SAMPLE_CALLS.items():
            with contextlib.suppress(ApiError):  # 204 is no job: only the request matters here
                getattr(client, name)(*args, **kwargs)
    app = make_app(tmp_path / "db")
    spec = create_app(app).openapi()
    app.close()
    routes = {
        (method.upper(), re.sub(r"\{[^}]+\}", "{}", path))
        for path, operations in spec["paths"].items()
        for method in operations
        if path.startswith("/api/v1/")
    }
    called = {(m, re.sub(r"/(j1|e1|d1|t1)(?=/|$)", "/{}", path)) for m, path in sent}
    assert called == routes


def test_client__sends_the_key_the_body_and_the_idempotency_key() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(422, json=problem(422))

    with mock_client(answer, api_key="onb_k_secret") as client:
        with pytest.raises(ApiValidationError):
            client.create_job(
                "echo",
                {"a": [1]},
                at=datetime(2099, 1, 1, 12, tzinfo=UTC),
                overlap="queue",
                idempotency_key="k-1",
            )
        with pytest.raises(ApiValidationError):
            client.update_job("a/b c", timezone="Asia/Tokyo")
    create, patch = seen
    assert create.headers["authorization"] == "Bearer onb_k_secret"
    assert create.headers["idempotency-key"] == "k-1"
    assert create.headers["content-type"] == "application/json"
    assert json.loads(create.content) == {
        "task": "echo",
        "params": {"a": [1]},
        "schedule": {"type": "once", "at": "2099-01-01T12:00:00+00:00", "timezone": "UTC"},
        "overlap": "queue",
    }
    assert patch.url.raw_path == b"/api/v1/jobs/a%2Fb%20c"
    assert json.loads(patch.content) == {"schedule": {"timezone": "Asia/Tokyo"}}
    assert "secret" not in repr(client)


def test_create_jobs__each_item_is_the_body_create_job_sends() -> None:
    bodies: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(422, json=problem(422))

    at = datetime(2099, 1, 1, 12, tzinfo=UTC)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("echo",), {}),
        (("echo", {"a": [1]}), {"at": at, "overlap": "queue", "max_attempts": 2}),
        (("echo",), {"cron": "0 3 * * *", "timezone": "Asia/Tokyo", "jitter": 0.5}),
    ]
    with mock_client(answer) as client:
        for args, kwargs in calls:
            with pytest.raises(ApiValidationError):
                client.create_job(*args, **kwargs)
        with pytest.raises(ApiValidationError):
            client.create_jobs([JobSpec(*args, **kwargs) for args, kwargs in calls])
        with pytest.raises(TypeError, match=r"jobs\[1\] must be a JobSpec"):
            client.create_jobs([JobSpec("echo"), {"task": "echo"}])  # type: ignore[list-item]
    *singles, batch = bodies
    assert batch == {"jobs": singles}
    assert singles[1]["schedule"] == {"type": "once", "at": at.isoformat(), "timezone": "UTC"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://h:1", "http://h:1/api/v1"),
        ("http://h:1/", "http://h:1/api/v1"),
        ("https://h/api/v1/", "https://h/api/v1"),
        ("http://h/onbeat", "http://h/onbeat/api/v1"),
    ],
)
def test_client__base_url_gets_the_api_prefix_once(given: str, expected: str) -> None:
    with Client(given) as client:
        assert client.base_url == expected


@pytest.mark.parametrize("bad", ["localhost:8000", "ftp://h", "http://"])
def test_client__a_base_url_that_is_not_http_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        Client(bad)


def test_errors__a_timeout_is_an_api_timeout_error_naming_the_url() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with mock_client(hang) as client, pytest.raises(ApiTimeoutError) as raised:
        client.create_job("echo")
    assert isinstance(raised.value, ApiConnectionError) and isinstance(raised.value, TimeoutError)
    assert "http://onbeat.test/api/v1/jobs" in str(raised.value)
    assert "idempotency key" in str(raised.value)


def test_errors__a_response_that_is_not_a_problem_document_still_raises_typed() -> None:
    def proxy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html><body>Bad   gateway</body></html>")

    with mock_client(proxy) as client, pytest.raises(ServerError) as raised:
        client.get_job("j")
    assert (raised.value.status, raised.value.problem.title) == (502, "Bad Gateway")
    assert raised.value.problem.detail == "<html><body>Bad gateway</body></html>"
    assert raised.value.url == "http://onbeat.test/api/v1/jobs/j"


def test_errors__retry_after_in_seconds_or_as_a_date() -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    answers = iter(
        [
            httpx.Response(503, json=problem(503), headers={"Retry-After": "7"}),
            httpx.Response(429, json=problem(429), headers={"Retry-After": later}),
            httpx.Response(429, json=problem(429), headers={"Retry-After": "soon"}),
        ]
    )
    with mock_client(lambda request: next(answers)) as client:
        with pytest.raises(ServiceUnavailableError) as unavailable:
            client.ready()
        assert unavailable.value.retry_after == 7.0
        with pytest.raises(RateLimitError) as limited:
            client.list_jobs()
        assert limited.value.retry_after is not None and 100 < limited.value.retry_after <= 120
        with pytest.raises(RateLimitError) as unreadable:
            client.list_jobs()
        assert unreadable.value.retry_after is None


def test_errors__a_service_that_is_not_onbeat_is_an_unexpected_response() -> None:
    def other(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, html="<h1>It works!</h1>")

    with mock_client(other) as client, pytest.raises(ApiError) as raised:
        client.get_job("j")
    assert raised.value.problem.title == "Unexpected response"
    assert "onbeat.test" in raised.value.problem.detail


async def test_errors__async_timeout_is_an_api_timeout_error() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    transport = httpx.MockTransport(hang)
    async with AsyncClient("http://onbeat.test", transport=transport) as client:
        with pytest.raises(ApiTimeoutError, match=re.escape("http://onbeat.test/api/v1/tasks")):
            await client.list_tasks()
