"""``GET /metrics``: the Prometheus text format, behind the API's keys, with request latency by
route template."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from onbeat import App
from onbeat.api import create_app
from onbeat.auth import Role
from onbeat.metrics import Metrics
from tests.api.conftest import bearer


def metrics_client(app: App, metrics: Metrics) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(app, metrics=metrics))
    return httpx.AsyncClient(transport=transport, base_url="http://onbeat.test")


async def test_metrics__parse_and_time_requests_by_route_template_never_by_id(
    onbeat_app: App,
) -> None:
    metrics = Metrics()
    job = onbeat_app.schedule("echo")
    async with metrics_client(onbeat_app, metrics) as client:
        assert (await client.get(f"/api/v1/jobs/{job.id}")).status_code == 200
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert "onbeat_start_delay_seconds" in families
    [count] = [
        s
        for s in families["onbeat_api_request_duration_seconds"].samples
        if s.name.endswith("_count") and s.labels["method"] == "GET"
        if s.labels["route"] == "/api/v1/jobs/{job_id}"
    ]
    assert count.value == 1
    assert job.id not in response.text


async def test_metrics__needs_a_key_once_one_exists_and_any_valid_key_reads_it(
    onbeat_app: App,
) -> None:
    reader_key = onbeat_app.create_api_key("acme", Role.READER)[1]
    async with metrics_client(onbeat_app, Metrics()) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=bearer("ob_wrong"))).status_code == 401
        response = await client.get("/metrics", headers=bearer(reader_key))
    assert response.status_code == 200
    assert "onbeat_runs_in_flight" in response.text


async def test_metrics__open_without_a_key_while_none_exists(onbeat_app: App) -> None:
    async with metrics_client(onbeat_app, Metrics()) as client:
        assert (await client.get("/metrics")).status_code == 200
