"""API keys and tenancy: the auth matrix over every route, and tenant isolation.

Two tenants, "acme" and "rival", each with a cron job, a manual execution and a dead letter. The
caller is acme unless a test says otherwise; rival's rows are the ones it must not see or touch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App
from onbeat.api import create_app
from onbeat.api.auth import resolve_caller, resolve_caller_known
from onbeat.api.cursors import encode_cursor
from onbeat.api.problems import ProblemError
from onbeat.auth import KEYS_EXIST_TTL, Role
from onbeat.errors import NotFoundError, StoreUnavailableError
from onbeat.testing import FakeClock
from tests.api.authz import (
    PUBLIC,
    ROUTES,
    UNKNOWN,
    WITH_ID,
    Route,
    World,
    bad_authorizations,
    tenant_rows,
)
from tests.api.conftest import assert_problem, bearer, snapshot


@pytest.fixture
async def rows(onbeat_app: App, clock: FakeClock) -> World:
    """Both tenants' rows, and no API key yet."""
    return World(
        acme=await tenant_rows(onbeat_app, clock, "acme"),
        rival=await tenant_rows(onbeat_app, clock, "rival"),
    )


@pytest.fixture
def world(onbeat_app: App, rows: World) -> World:
    """Both tenants' rows, and keys of every role for acme and a writer key for rival."""
    for role in Role:
        rows.acme.keys[role] = onbeat_app.create_api_key("acme", role)[1]
    rows.rival.keys[Role.WRITER] = onbeat_app.create_api_key("rival", Role.WRITER)[1]
    return rows


async def call(
    client: httpx.AsyncClient, route: Route, ids: dict[str, str], headers: dict[str, str]
) -> httpx.Response:
    return await client.request(
        route.method, route.url(ids), json=route.body, params=route.query, headers=headers
    )


# --- the matrix covers the API ------------------------------------------------------------------
async def test_matrix__covers_every_operation_of_the_spec(
    client: httpx.AsyncClient, world: World
) -> None:
    spec = (
        await client.get(
            "http://onbeat.test/openapi.json", headers=bearer(world.acme.keys[Role.READER])
        )
    ).json()
    operations = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    covered = {(r.method, f"/api/v1{r.path}") for r in ROUTES}
    assert operations - covered == {("GET", "/api/v1/healthz"), ("GET", "/api/v1/readyz")}
    assert covered <= operations


# --- 401 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_no_key__401_on_every_route_once_a_key_exists(
    client: httpx.AsyncClient, onbeat_app: App, world: World, route: Route
) -> None:
    before = snapshot(onbeat_app)
    response = await call(client, route, world.acme.ids, {})
    assert_problem(response, 401, "Authorization")
    assert response.headers["www-authenticate"] == 'Bearer realm="onbeat"'
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_wrong_key__401_on_every_route(
    client: httpx.AsyncClient, onbeat_app: App, world: World, route: Route
) -> None:
    bad = bad_authorizations(onbeat_app)
    before = snapshot(onbeat_app)
    for authorization in bad:
        response = await call(client, route, world.acme.ids, {"Authorization": authorization})
        assert_problem(response, 401, "Authorization")
        assert (
            response.headers["www-authenticate"] == 'Bearer realm="onbeat", error="invalid_token"'
        )
    assert snapshot(onbeat_app) == before


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_wrong_key__401_even_while_no_key_is_required(
    client: httpx.AsyncClient, onbeat_app: App, rows: World, route: Route
) -> None:
    bad = bad_authorizations(onbeat_app)
    assert not onbeat_app.auth_enabled()
    before = snapshot(onbeat_app)
    for authorization in bad:
        response = await call(client, route, rows.acme.ids, {"Authorization": authorization})
        assert_problem(response, 401, "Authorization")
    assert snapshot(onbeat_app) == before


async def test_authorization_sent_twice__401(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    key = world.acme.keys[Role.WRITER]
    headers = [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")]
    assert_problem(await client.get("/jobs", headers=headers), 401, "Authorization")


async def test_revoking_a_key__401_from_then_on(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    key, secret = onbeat_app.create_api_key("acme", Role.WRITER)
    assert (await client.get("/jobs", headers=bearer(secret))).status_code == 200
    onbeat_app.revoke_api_key(key.id)
    assert_problem(await client.get("/jobs", headers=bearer(secret)), 401, "Authorization")


async def test_network_facing_api__no_key_is_401_after_its_last_key_is_revoked(
    tmp_path: Path, clock: FakeClock
) -> None:
    """An API on a non-loopback address started with a key; revoking that key must not let
    keyless callers in as admin."""
    app = App(f"sqlite:///{tmp_path / 'db'}", clock=clock, host="0.0.0.0")
    key, secret = app.create_api_key("acme", Role.WRITER)
    async with _client(app) as client:
        assert (await client.get("/jobs", headers=bearer(secret))).status_code == 200
        app.revoke_api_key(key.id)
        assert not app.api_keys_exist()
        assert_problem(await client.get("/jobs"), 401, "Authorization")
        assert_problem(await client.post("/jobs", json={"task": "echo"}), 401, "Authorization")
    app.close()


async def test_key_created_by_another_process__no_key_is_401_within_the_ttl(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Whether a key exists is read once per KEYS_EXIST_TTL, not on every keyless request; a
    key created elsewhere (`onbeat keys create`) turns keyless access off within that time."""
    url = f"sqlite:///{tmp_path / 'db'}"
    app, elsewhere = App(url, clock=clock), App(url, clock=clock)
    async with _client(app) as client:
        assert (await client.get("/jobs")).status_code == 200
        elsewhere.create_api_key("acme", Role.WRITER)
        assert (await client.get("/jobs")).status_code == 200  # the answer of 0 s ago
        clock.advance(KEYS_EXIST_TTL)
        assert_problem(await client.get("/jobs"), 401, "Authorization")
    app.close()
    elsewhere.close()


async def test_key_revoked_by_another_process__401_within_the_ttl(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A key found is kept for KEYS_EXIST_TTL, not read on every request: revoked elsewhere
    (`onbeat keys revoke`), it stops working within that time; revoked here, at once."""
    url = f"sqlite:///{tmp_path / 'db'}"
    app, elsewhere = App(url, clock=clock), App(url, clock=clock)
    (first, first_secret), (second, second_secret) = (
        app.create_api_key("acme", Role.WRITER) for _ in range(2)
    )
    async with _client(app) as client:
        for secret in (first_secret, second_secret):
            assert (await client.get("/jobs", headers=bearer(secret))).status_code == 200
        elsewhere.revoke_api_key(first.id)
        assert (await client.get("/jobs", headers=bearer(first_secret))).status_code == 200
        clock.advance(KEYS_EXIST_TTL)
        assert_problem(
            await client.get("/jobs", headers=bearer(first_secret)), 401, "Authorization"
        )
        assert (await client.get("/jobs", headers=bearer(second_secret))).status_code == 200
        app.revoke_api_key(second.id)
        assert_problem(
            await client.get("/jobs", headers=bearer(second_secret)), 401, "Authorization"
        )
    app.close()
    elsewhere.close()


def test_resolve_caller_known__reads_nothing_and_answers_only_what_it_knows(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop's check: None (go to a thread) until the answer was read, then the same
    caller resolve_caller gives, with no store read; a malformed header is refused either way."""
    app = App(f"sqlite:///{tmp_path / 'db'}", clock=clock)
    assert resolve_caller_known(app, None) is None
    assert resolve_caller(app, None).tenant is None
    assert resolve_caller_known(app, None) == resolve_caller(app, None)
    key, secret = app.create_api_key("acme", Role.READER)
    assert resolve_caller_known(app, f"Bearer {secret}") is None
    caller = resolve_caller(app, f"Bearer {secret}")
    assert (caller.tenant, caller.role, caller.key_id) == ("acme", Role.READER, key.id)
    assert resolve_caller_known(app, None) is None  # the key's creation made it unknown
    with pytest.raises(ProblemError):
        resolve_caller(app, None)

    def no_read(*args: object) -> None:
        raise AssertionError("the store was read")

    monkeypatch.setattr(app.store, "api_key_by_hash", no_read)
    monkeypatch.setattr(app.store, "api_key_count_active", no_read)
    assert resolve_caller_known(app, f"Bearer {secret}") == caller
    with pytest.raises(ProblemError) as refused:
        resolve_caller_known(app, None)
    assert refused.value.status == 401
    with pytest.raises(ProblemError):
        resolve_caller_known(app, "Basic abc")
    clock.advance(KEYS_EXIST_TTL)
    assert resolve_caller_known(app, f"Bearer {secret}") is None
    app.close()


def test_list_executions__of_a_job_already_read_is_scoped_to_the_tenant(
    onbeat_app: App, rows: World
) -> None:
    """The job read first (GET /jobs/{id}, the dashboard) is still checked against the tenant."""
    rival_job = onbeat_app.get_job(rows.rival.ids["job_id"])
    assert onbeat_app.list_executions(rival_job, tenant="rival")
    assert onbeat_app.list_executions(rival_job) == onbeat_app.list_executions(rival_job.id)
    with pytest.raises(NotFoundError):
        onbeat_app.list_executions(rival_job, tenant="acme")


def _client(app: App) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(app))
    return httpx.AsyncClient(transport=transport, base_url="http://onbeat.test/api/v1")


async def test_public_paths__need_no_key(client: httpx.AsyncClient, world: World) -> None:
    for path in PUBLIC:
        for headers in ({}, {"Authorization": "Bearer nonsense"}):
            response = await client.get(f"http://onbeat.test{path}", headers=headers)
            assert response.status_code == 200, (path, response.text)


async def test_unknown_route__401_without_a_key(client: httpx.AsyncClient, world: World) -> None:
    """Nothing past the gate is routed for a stranger, not even to a 404 or a 405."""
    assert_problem(await client.get("/nothing-here"), 401)
    assert_problem(await client.put("/jobs"), 401)
    key = bearer(world.acme.keys[Role.READER])
    assert_problem(await client.get("/nothing-here", headers=key), 404)


async def test_huge_body_without_a_key__401_before_it_is_read(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    before = snapshot(onbeat_app)
    big = b'{"task": "echo", "params": {"x": "' + b"x" * (2 * 1024 * 1024) + b'"}}'
    headers = {"content-type": "application/json"}
    assert_problem(await client.post("/jobs", content=big, headers=headers), 401)
    headers |= bearer(world.acme.keys[Role.WRITER])
    assert_problem(await client.post("/jobs", content=big, headers=headers), 413, "body")
    assert snapshot(onbeat_app) == before


# --- roles --------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_reader__reads_but_every_write_is_403(
    client: httpx.AsyncClient, onbeat_app: App, world: World, route: Route
) -> None:
    before = snapshot(onbeat_app)
    response = await call(client, route, world.acme.ids, bearer(world.acme.keys[Role.READER]))
    if route.writes:
        assert_problem(response, 403, "Authorization")
    else:
        assert response.status_code == 200, response.text
    assert snapshot(onbeat_app) == before


async def test_reader__malformed_write_is_403_not_400(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    headers = {"content-type": "application/json"} | bearer(world.acme.keys[Role.READER])
    assert_problem(await client.post("/jobs", content=b"{nope", headers=headers), 403)


@pytest.mark.parametrize("role", [Role.WRITER, Role.ADMIN])
@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_writer_and_admin__every_route_works(
    client: httpx.AsyncClient, world: World, route: Route, role: Role
) -> None:
    response = await call(client, route, world.acme.ids, bearer(world.acme.keys[role]))
    if route.admin and role is Role.WRITER:
        assert_problem(response, 403, "Authorization")
    else:
        assert 200 <= response.status_code < 300, response.text


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_without_keys__every_route_works_without_one(
    client: httpx.AsyncClient, rows: World, route: Route
) -> None:
    response = await call(client, route, rows.acme.ids, {})
    assert 200 <= response.status_code < 300, response.text


# --- tenant isolation -----------------------------------------------------------------------------
@pytest.mark.parametrize("route", WITH_ID, ids=str)
async def test_other_tenants_ids__404_exactly_like_unknown_ones(
    client: httpx.AsyncClient, onbeat_app: App, world: World, route: Route
) -> None:
    key = bearer(world.acme.keys[Role.ADMIN])
    before = snapshot(onbeat_app)
    theirs = assert_problem(await call(client, route, world.rival.ids, key), 404)
    unknown_ids = dict.fromkeys(world.rival.ids, UNKNOWN)
    unknown = assert_problem(await call(client, route, unknown_ids, key), 404)
    assert snapshot(onbeat_app) == before
    for doc in (theirs, unknown):  # the same document but for the id it names
        for rival_id in world.rival.ids.values():
            doc["detail"] = doc["detail"].replace(rival_id, UNKNOWN)
    assert theirs == unknown


async def test_lists__show_only_the_callers_tenant(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    for tenant in (world.acme, world.rival):
        key = bearer(tenant.keys[Role.WRITER])
        jobs = (await client.get("/jobs", headers=key)).json()
        assert [j["id"] for j in jobs["items"]] == tenant.job_ids
        for status in ("active", "completed"):
            page = (await client.get("/jobs", params={"status": status}, headers=key)).json()
            assert {j["id"] for j in page["items"]} <= set(tenant.job_ids)
        failing = (await client.get("/jobs", params={"task": "fail"}, headers=key)).json()
        assert len(failing["items"]) == 1
        assert failing["items"][0]["id"] in tenant.job_ids
        dead = (await client.get("/dead-letters", headers=key)).json()
        assert [d["id"] for d in dead["items"]] == [tenant.ids["dead_letter_id"]]
        detail = (await client.get(f"/jobs/{tenant.ids['job_id']}", headers=key)).json()
        assert {e["job_id"] for e in detail["executions"]} == {tenant.ids["job_id"]}


async def test_lists__pages_never_cross_into_another_tenant(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    """A cursor is an id; one that names another tenant's row only positions the page."""
    key = bearer(world.acme.keys[Role.WRITER])
    for listing, path in (("jobs", "/jobs"), ("dead-letters", "/dead-letters")):
        for last in (*world.rival.ids.values(), "0", "z"):
            page = await client.get(
                path, params={"cursor": encode_cursor(listing, last)}, headers=key
            )
            assert page.status_code == 200, page.text
            ours = world.acme.job_ids if listing == "jobs" else [world.acme.ids["dead_letter_id"]]
            assert {item["id"] for item in page.json()["items"]} <= set(ours)


async def test_executions_cursor_of_another_tenant__400_like_an_unknown_one(
    client: httpx.AsyncClient, world: World
) -> None:
    key = bearer(world.acme.keys[Role.WRITER])
    path = f"/jobs/{world.acme.ids['job_id']}/executions"
    for execution_id in (world.rival.ids["execution_id"], UNKNOWN):
        cursor = encode_cursor("executions", execution_id)
        assert_problem(
            await client.get(path, params={"cursor": cursor}, headers=key), 400, "cursor"
        )


async def test_create_job__belongs_to_the_callers_tenant(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    response = await client.post(
        "/jobs", json={"task": "echo"}, headers=bearer(world.acme.keys[Role.WRITER])
    )
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert onbeat_app.get_job(job_id).tenant == "acme"
    rival = bearer(world.rival.keys[Role.WRITER])
    assert_problem(await client.get(f"/jobs/{job_id}", headers=rival), 404)
    assert job_id not in {
        j["id"] for j in (await client.get("/jobs", headers=rival)).json()["items"]
    }


async def test_without_keys__jobs_go_to_the_default_tenant_and_every_tenant_is_visible(
    client: httpx.AsyncClient, onbeat_app: App, rows: World
) -> None:
    response = await client.post("/jobs", json={"task": "echo"})
    assert response.status_code == 201
    job_id = response.json()["id"]
    assert onbeat_app.get_job(job_id).tenant == "default"
    listed = {j["id"] for j in (await client.get("/jobs")).json()["items"]}
    assert listed == {*rows.acme.job_ids, *rows.rival.job_ids, job_id}
    dead = {d["id"] for d in (await client.get("/dead-letters")).json()["items"]}
    assert dead == {rows.acme.ids["dead_letter_id"], rows.rival.ids["dead_letter_id"]}


# --- Idempotency-Key is per tenant -------------------------------------------------------------
async def test_idempotency_key__scoped_to_the_tenant(
    client: httpx.AsyncClient, onbeat_app: App, world: World
) -> None:
    acme, rival = bearer(world.acme.keys[Role.WRITER]), bearer(world.rival.keys[Role.WRITER])
    body = {"task": "echo", "params": {"n": 1}}
    same = {"Idempotency-Key": "shared-key"}
    first = await client.post("/jobs", json=body, headers=acme | same)
    theirs = await client.post("/jobs", json=body, headers=rival | same)
    assert (first.status_code, theirs.status_code) == (201, 201)
    assert theirs.headers["idempotent-replayed"] == "false"
    assert first.json()["id"] != theirs.json()["id"]
    assert onbeat_app.get_job(theirs.json()["id"]).tenant == "rival"
    # a different body under the same key is no conflict in another tenant
    other = await client.post(
        "/jobs", json={"task": "echo"}, headers=rival | {"Idempotency-Key": "k2"}
    )
    mine = await client.post("/jobs", json=body, headers=acme | {"Idempotency-Key": "k2"})
    assert (other.status_code, mine.status_code) == (201, 201)
    assert other.json()["id"] != mine.json()["id"]
    # and a retry in one tenant replays that tenant's job
    before = snapshot(onbeat_app)
    again = await client.post("/jobs", json=body, headers=acme | same)
    assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
    assert again.json()["id"] == first.json()["id"]
    assert snapshot(onbeat_app) == before


# --- the spec says all this -----------------------------------------------------------------------
async def test_openapi__declares_bearer_security_and_its_errors(
    client: httpx.AsyncClient, onbeat_app: App
) -> None:
    keyless = (await client.get("http://onbeat.test/openapi.json")).json()
    _key, secret = onbeat_app.create_api_key("acme", Role.READER)
    keyed = (await client.get("http://onbeat.test/openapi.json", headers=bearer(secret))).json()
    variants: list[tuple[dict[str, Any], list[dict[str, list[str]]]]] = [
        (keyless, [{"bearer": []}, {}]),
        (keyed, [{"bearer": []}]),
    ]
    for spec, security in variants:
        assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path, operations in spec["paths"].items():
            for method, operation in operations.items():
                if path in PUBLIC:
                    assert "security" not in operation
                    assert "401" not in operation["responses"]
                    continue
                assert operation["security"] == security, (method, path)
                unauthorized = operation["responses"]["401"]
                assert list(unauthorized["content"]) == ["application/problem+json"]
                assert unauthorized["headers"]["WWW-Authenticate"]["required"] is True
                assert ("403" in operation["responses"]) == (method != "get"), (method, path)


@pytest.mark.parametrize("with_key", [False, True], ids=["no-key", "bearer-key"])
async def test_store_unreachable_while_resolving_the_caller__503_with_retry_after(
    client: httpx.AsyncClient,
    onbeat_app: App,
    monkeypatch: pytest.MonkeyPatch,
    with_key: bool,
) -> None:
    """The caller is resolved from the store before any route runs: a dropped connection there
    is a 503 the client may retry, as in a route, never a 500."""
    headers = bearer(onbeat_app.create_api_key("acme", Role.WRITER)[1]) if with_key else {}

    def unreachable(*args: Any) -> Any:
        raise StoreUnavailableError("PostgreSQL: terminating connection")

    monkeypatch.setattr(onbeat_app.store, "api_key_count_active", unreachable)
    monkeypatch.setattr(onbeat_app.store, "api_key_by_hash", unreachable)
    response = await client.post("/jobs", json={"task": "echo"}, headers=headers)
    doc = assert_problem(response, 503)
    assert doc["type"] == "urn:onbeat:problem:store-unavailable"
    assert response.headers["Retry-After"] == "5"
