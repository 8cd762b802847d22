"""NUL in a URL, on PostgreSQL (whose text cannot hold NUL): an id or a tenant name carrying one
names nothing (404), a query value carrying one is malformed (400); neither reaches the store,
where it was an error and a 500. Found while building the fault suite's S9, which now sends
these to a live API too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from onbeat import App
from onbeat.api import create_app
from onbeat.testing.postgres import store_schema
from tests.api.authz import NUL_IDS, ROUTES, WITH_ID, Route
from tests.api.conftest import add_test_tasks, assert_problem

pytestmark = pytest.mark.external_service


@pytest.fixture
async def pg_client() -> AsyncIterator[httpx.AsyncClient]:
    """The API of an App on PostgreSQL, with no key (every tenant's paths are open to it)."""
    with store_schema() as url:
        app = add_test_tasks(App(url))
        transport = httpx.ASGITransport(app=create_app(app), raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://onbeat.test/api/v1"
        ) as c:
            yield c
        app.close()


@pytest.mark.parametrize("route", WITH_ID, ids=str)
async def test_nul_in_a_path_id__404(pg_client: httpx.AsyncClient, route: Route) -> None:
    response = await pg_client.request(route.method, route.url(NUL_IDS), json=route.body)
    assert_problem(response, 404)


@pytest.mark.parametrize("route", [r for r in ROUTES if r.method == "GET"], ids=str)
async def test_nul_in_a_query_value__400_naming_it(
    pg_client: httpx.AsyncClient, route: Route
) -> None:
    ids = {
        "job_id": "0" * 32,
        "execution_id": "0" * 32,
        "dead_letter_id": "0" * 32,
        "tenant": "acme",
    }
    response = await pg_client.get(route.url(ids), params={**route.query, "task": "a\x00b"})
    assert_problem(response, 400, "task")
