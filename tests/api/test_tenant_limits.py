"""``/tenants/{tenant}/limits``: a tenant's own fleet limits, read by its keys, set by its admin."""

from __future__ import annotations

import httpx

from onbeat import App
from onbeat.auth import Role
from onbeat.limits import TenantLimits
from onbeat.testing import FakeClock
from tests.api.conftest import assert_problem, bearer, run_due, snapshot


async def test_get__no_limits_of_its_own_and_nothing_running(client: httpx.AsyncClient) -> None:
    response = await client.get("/tenants/acme/limits")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "tenant": "acme",
        "max_in_flight": None,
        "max_starts_per_second": None,
        "running": 0,
    }


async def test_put__sets_the_limits_the_store_enforces_and_null_restores_the_default(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    body = {"max_in_flight": 7, "max_starts_per_second": 2.5}
    response = await client.put("/tenants/acme/limits", json=body)
    assert response.status_code == 200, response.text
    assert response.json() | body == response.json()
    assert onbeat_app.store.tenant_limits_get("acme") == TenantLimits(7, 2.5)
    assert (await client.get("/tenants/acme/limits")).json()["max_in_flight"] == 7
    response = await client.put("/tenants/acme/limits", json={"max_in_flight": 3})
    assert onbeat_app.store.tenant_limits_get("acme") == TenantLimits(3, None)
    assert onbeat_app.store.tenant_limits_get("rival") == TenantLimits()


async def test_get__counts_the_runs_running(
    client: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    """A finished run is counted out again (the echo task returns at once)."""
    onbeat_app.schedule("echo", tenant="acme")
    await run_due(onbeat_app, clock)
    assert (await client.get("/tenants/acme/limits")).json()["running"] == 0
    assert onbeat_app.store.tenant_usage("acme").running == 0


async def test_put__out_of_range_values_are_422_and_change_nothing(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    onbeat_app.schedule("echo", tenant="acme")  # the store is open, with rows
    before = snapshot(onbeat_app)
    for body, field in (
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": 1.5}, "max_in_flight"),
        ({"max_in_flight": 2**63}, "max_in_flight"),
        ({"max_starts_per_second": 0}, "max_starts_per_second"),
        ({"max_starts_per_second": 5e-324}, "max_starts_per_second"),
        ({"max_in_flight": False}, "max_in_flight"),
        ({"max_starts_per_second": "3"}, "max_starts_per_second"),
        ({"max_starts_per_second": 1e300}, "max_starts_per_second"),
        ({"burst": 3}, "burst"),
    ):
        assert_problem(await client.put("/tenants/acme/limits", json=body), 422, field)
    assert snapshot(onbeat_app) == before


async def test_keys__readers_read_only_admins_set_and_other_tenants_are_404(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    keys = {role: bearer(onbeat_app.create_api_key("acme", role)[1]) for role in Role}
    body = {"max_in_flight": 1}
    for role in (Role.READER, Role.WRITER):
        assert (await client.get("/tenants/acme/limits", headers=keys[role])).status_code == 200
        put = await client.put("/tenants/acme/limits", json=body, headers=keys[role])
        assert_problem(put, 403, "Authorization")
    admin = keys[Role.ADMIN]
    assert (await client.put("/tenants/acme/limits", json=body, headers=admin)).status_code == 200
    assert_problem(await client.get("/tenants/rival/limits", headers=admin), 404)
    assert_problem(await client.put("/tenants/rival/limits", json=body, headers=admin), 404)
    assert onbeat_app.store.tenant_limits_get("rival") == TenantLimits()
