"""The dashboard over ASGI: an App on a fresh SQLite file and a FakeClock, its web app (API and
dashboard, as ``onbeat up`` serves them), and a browser-like client that keeps cookies."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat import App, TaskContext
from onbeat.api import create_app
from onbeat.auth import Role
from onbeat.testing import FakeClock

BASE_URL = "http://127.0.0.1:8000"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def onbeat_app(tmp_path: Path, clock: FakeClock) -> Iterator[App]:
    app = App(f"sqlite:///{tmp_path / 'db'}", clock=clock)

    @app.task(name="echo", max_attempts=3)
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    @app.task(name="fail", max_attempts=1)
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    yield app
    app.close()


@pytest.fixture
async def browser(onbeat_app: App) -> AsyncIterator[httpx.AsyncClient]:
    """A client with a cookie jar, that does not follow redirects (tests look at them)."""
    async with new_browser(onbeat_app) as client:
        yield client


def new_browser(onbeat_app: App) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(onbeat_app))
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL)


def csrf_of(page: httpx.Response) -> str:
    found = _CSRF.search(page.text)
    assert found, f"no CSRF field in {page.request.url}"
    return found.group(1)


async def log_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    form = await client.get("/login")
    assert form.status_code == 200, form.text
    return await client.post("/login", data={"key": key, "csrf": csrf_of(form), "next": "/"})


async def post_form(
    client: httpx.AsyncClient, page: str, action: str, data: dict[str, str] | None = None
) -> httpx.Response:
    """Submit a form of ``page`` (fetched first, for its CSRF token) to ``action``."""
    shown = await client.get(page)
    assert shown.status_code == 200, shown.text
    return await client.post(action, data={"csrf": csrf_of(shown), **(data or {})})


def key_for(app: App, tenant: str, role: Role) -> str:
    return app.create_api_key(tenant, role)[1]
