"""Who may see and do what on the dashboard: open exactly when the API is, a login by API key
into a signed HttpOnly SameSite=Strict session, CSRF tokens on every change, readers who only
look, tenants who see only their own, and keys that never show up anywhere."""

from __future__ import annotations

import logging

import httpx
import pytest

from onbeat import App
from onbeat.auth import Role
from onbeat.model import JobStatus
from onbeat.testing import FakeClock
from tests.api.conftest import make_dead_letter
from tests.dashboard.conftest import csrf_of, key_for, log_in, new_browser, post_form

PAGES = ["/", "/jobs", "/dead-letters"]


# --- open while no key exists -----------------------------------------------------------------
async def test_no_key__every_page_is_open_with_an_anonymous_session(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="* * * * *")
    for path in [*PAGES, f"/jobs/{job.id}"]:
        page = await browser.get(path)
        assert page.status_code == 200, path
        assert "no API keys" in page.text
    assert "set-cookie" not in page.headers, "the session cookie is set once, not on every page"
    assert (await browser.get("/login")).headers["location"] == "/"


async def test_session_cookie__httponly_samesite_strict_and_signed(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    first = await browser.get("/")
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("onbeat_session=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Path=/" in cookie
    job = onbeat_app.schedule("echo", cron="* * * * *")
    token = csrf_of(await browser.get(f"/jobs/{job.id}"))
    value = browser.cookies["onbeat_session"]
    browser.cookies.set("onbeat_session", value[:-2] + ("AA" if value[-2:] != "AA" else "BB"))
    refused = await browser.post(f"/jobs/{job.id}/pause", data={"csrf": token})
    assert refused.status_code == 403, "a tampered session is no session"
    assert onbeat_app.get_job(job.id).status is JobStatus.ACTIVE


async def test_no_key__a_change_still_needs_the_session_and_its_csrf_token(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    """Open on loopback does not mean open to another site's form in the same browser."""
    job = onbeat_app.schedule("echo", cron="* * * * *")
    async with new_browser(onbeat_app) as stranger:  # no session cookie: a cross-site form
        assert (await stranger.post(f"/jobs/{job.id}/pause", data={})).status_code == 403
    page = await browser.get(f"/jobs/{job.id}")
    assert (await browser.post(f"/jobs/{job.id}/pause", data={})).status_code == 403
    wrong = await browser.post(f"/jobs/{job.id}/pause", data={"csrf": "0" * 64})
    assert wrong.status_code == 403
    cross_site = await browser.post(
        f"/jobs/{job.id}/pause",
        data={"csrf": csrf_of(page)},
        headers={"Origin": "http://evil.example"},
    )
    assert cross_site.status_code == 403
    assert onbeat_app.get_job(job.id).status is JobStatus.ACTIVE
    done = await browser.post(f"/jobs/{job.id}/pause", data={"csrf": csrf_of(page)})
    assert done.status_code == 303
    assert onbeat_app.get_job(job.id).status is JobStatus.PAUSED


async def test_csrf_token__belongs_to_its_session(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="* * * * *")
    theirs = csrf_of(await browser.get(f"/jobs/{job.id}"))
    async with new_browser(onbeat_app) as other:
        await other.get("/")
        refused = await other.post(f"/jobs/{job.id}/pause", data={"csrf": theirs})
    assert refused.status_code == 403
    assert onbeat_app.get_job(job.id).status is JobStatus.ACTIVE


# --- login ------------------------------------------------------------------------------------
async def test_with_keys__pages_redirect_to_the_login_form_and_back(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    key = key_for(onbeat_app, "acme", Role.WRITER)
    for path in PAGES:
        response = await browser.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/login")
    to_jobs = await browser.get("/jobs?status=paused")
    assert to_jobs.headers["location"] == "/login?next=/jobs%3Fstatus%3Dpaused"
    form = await browser.get(to_jobs.headers["location"])
    logged_in = await browser.post(
        "/login", data={"key": key, "csrf": csrf_of(form), "next": "/jobs?status=paused"}
    )
    assert logged_in.status_code == 303
    assert logged_in.headers["location"] == "/jobs?status=paused"
    page = await browser.get("/jobs?status=paused")
    assert page.status_code == 200
    assert "tenant <b>acme</b> · writer" in page.text


async def test_login__a_wrong_key_is_refused_without_echoing_it(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    key = key_for(onbeat_app, "acme", Role.WRITER)
    wrong = key[:-4] + "XXXX"
    refused = await log_in(browser, wrong)
    assert refused.status_code == 401
    assert "unknown or revoked" in refused.text
    assert wrong not in refused.text
    assert (await browser.get("/")).status_code == 303
    assert (await log_in(browser, key)).status_code == 303
    assert (await browser.get("/")).status_code == 200


async def test_login__next_never_leaves_the_dashboard(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    key = key_for(onbeat_app, "acme", Role.READER)
    form = await browser.get("/login")
    response = await browser.post(
        "/login", data={"key": key, "csrf": csrf_of(form), "next": "//evil.example/x"}
    )
    assert response.headers["location"] == "/"


async def test_login__needs_the_forms_csrf_token(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    key = key_for(onbeat_app, "acme", Role.WRITER)
    await browser.get("/login")
    assert (await browser.post("/login", data={"key": key})).status_code == 403
    assert (await browser.get("/")).status_code == 303


async def test_key__never_in_a_url_a_page_a_cookie_or_a_log(
    browser: httpx.AsyncClient, onbeat_app: App, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = key_for(onbeat_app, "acme", Role.WRITER)
    job = onbeat_app.schedule("echo", cron="* * * * *", tenant="acme")
    seen: list[str] = []
    response = await log_in(browser, key)
    seen += [str(response.request.url), response.text, str(response.headers)]
    for path in [*PAGES, f"/jobs/{job.id}", "/preview?kind=cron&expression=@daily"]:
        page = await browser.get(path)
        assert page.status_code == 200, path
        seen += [str(page.request.url), page.text, str(page.headers)]
    seen += [str(browser.cookies), *(r.getMessage() for r in caplog.records)]
    secret = key.rsplit("_", 1)[1]
    assert not [text for text in seen if secret in text]


async def test_revoking_the_key_ends_its_sessions(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    api_key, key = onbeat_app.create_api_key("acme", Role.WRITER)
    key_for(onbeat_app, "acme", Role.READER)  # keys still exist after the revocation
    await log_in(browser, key)
    assert (await browser.get("/")).status_code == 200
    onbeat_app.revoke_api_key(api_key.id)
    assert (await browser.get("/")).status_code == 303


async def test_logout__ends_the_session(browser: httpx.AsyncClient, onbeat_app: App) -> None:
    await log_in(browser, key_for(onbeat_app, "acme", Role.READER))
    out = await post_form(browser, "/", "/logout")
    assert out.status_code == 303
    assert out.headers["location"] == "/login"
    assert (await browser.get("/")).status_code == 303


# --- roles and tenants ------------------------------------------------------------------------
async def test_reader__sees_no_action_and_is_refused_when_forcing_one(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    job = onbeat_app.schedule("echo", cron="* * * * *", tenant="acme")
    dead = await make_dead_letter(onbeat_app, clock, tenant="acme")
    await log_in(browser, key_for(onbeat_app, "acme", Role.READER))
    job_page = await browser.get(f"/jobs/{job.id}")
    jobs_page = await browser.get("/jobs")
    letters = await browser.get("/dead-letters")
    assert job.id in jobs_page.text and dead in letters.text
    for page in (job_page, jobs_page, letters):
        assert 'method="post" action="/jobs' not in page.text
        assert 'method="post" action="/dead-letters' not in page.text
    token = csrf_of(job_page)  # the logout form's: a valid token of this session
    for action, data in [
        (f"/jobs/{job.id}/pause", {}),
        (f"/jobs/{job.id}/run", {}),
        (f"/jobs/{job.id}/cancel", {}),
        (f"/jobs/{job.id}/edit", {"kind": "cron", "expression": "@daily"}),
        ("/jobs", {"task": "echo", "kind": "now"}),
        (f"/dead-letters/{dead}/replay", {}),
        (f"/dead-letters/{dead}/drop", {}),
    ]:
        refused = await browser.post(action, data={"csrf": token, **data})
        assert refused.status_code == 403, action
        assert "reader key" in refused.text
    assert onbeat_app.get_job(job.id).status is JobStatus.ACTIVE
    assert onbeat_app.get_job(job.id).schedule.expression == "* * * * *"
    assert [d.execution_id for d in onbeat_app.list_dead_letters()] == [dead]
    assert len(onbeat_app.list_jobs()) == 2


async def test_tenant__sees_and_touches_only_its_own(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    mine = onbeat_app.schedule("echo", cron="* * * * *", tenant="acme")
    theirs = onbeat_app.schedule("echo", cron="* * * * *", tenant="rival")
    their_dead = await make_dead_letter(onbeat_app, clock, tenant="rival")
    await log_in(browser, key_for(onbeat_app, "acme", Role.WRITER))
    jobs = await browser.get("/jobs")
    assert mine.id in jobs.text and theirs.id not in jobs.text
    searched = await browser.get(f"/jobs?q={theirs.id}")
    assert "No job matches." in searched.text
    assert (await browser.get(f"/jobs/{theirs.id}")).status_code == 404
    letters = await browser.get("/dead-letters")
    assert their_dead not in letters.text
    overview = await browser.get("/")
    assert 'Dead letters</div>\n    <div class="value">0<' in overview.text
    token = csrf_of(jobs)
    assert (await browser.post(f"/jobs/{theirs.id}/pause", data={"csrf": token})).status_code == 404
    replay = await browser.post(f"/dead-letters/{their_dead}/replay", data={"csrf": token})
    assert replay.status_code == 404
    assert onbeat_app.get_job(theirs.id).status is JobStatus.ACTIVE
    assert [d.execution_id for d in onbeat_app.list_dead_letters()] == [their_dead]
    created = await browser.post("/jobs", data={"csrf": token, "task": "echo", "kind": "now"})
    assert created.status_code == 303
    new_id = created.headers["location"].removeprefix("/jobs/")
    assert onbeat_app.get_job(new_id).tenant == "acme"


async def test_csrf_token__any_text_is_refused_cleanly(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="* * * * *")
    await browser.get("/")
    refused = await browser.post(f"/jobs/{job.id}/pause", data={"csrf": "é" * 64})
    assert refused.status_code == 403
