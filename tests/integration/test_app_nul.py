"""NUL through the Python API, on both backends (PostgreSQL text cannot hold NUL): a value that
carries one is refused naming its field, an id that carries one names nothing, and nothing
already stored changes. REST refuses the same values (tests/api/test_nul_in_url.py); the Python
API used to pass them to the store, where PostgreSQL raised a driver error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from onbeat import App
from onbeat.errors import NotFoundError, ValidationError
from onbeat.testing.postgres import store_schema

NUL = "a\x00b"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.external_service)])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    def made(url: str) -> App:
        app = App(url)

        @app.task(name="noop")
        async def noop(**params: Any) -> None: ...

        return app

    if request.param == "sqlite":
        app = made(f"sqlite:///{tmp_path / 'onbeat.db'}")
        yield app
        app.close()
    else:
        with store_schema() as url:
            app = made(url)
            yield app
            app.close()


REFUSED: list[tuple[str, Callable[[App], object]]] = [
    ("task", lambda app: app.schedule(NUL)),
    ("cron", lambda app: app.schedule("noop", cron="* * * * *\x00")),
    ("at", lambda app: app.schedule("noop", at="2030-01-01T00:00:00Z\x00")),
    ("timezone", lambda app: app.schedule("noop", cron="* * * * *", timezone="UTC\x00")),
    ("Idempotency-Key", lambda app: app.schedule("noop", idempotency_key=NUL)),
    ("tenant", lambda app: app.schedule("noop", tenant=NUL)),
    ("tenant", lambda app: app.list_jobs(tenant=NUL)),
    ("task", lambda app: app.list_jobs(task=NUL)),
    ("after_id", lambda app: app.list_dead_letters(after_id=NUL)),
    ("tenant", lambda app: app.create_api_key(NUL, "admin")),
]
NAMES_NOTHING: list[Callable[[App], object]] = [
    lambda app: app.get_job(NUL),
    lambda app: app.list_executions(NUL),
    lambda app: app.get_execution(NUL),
    lambda app: app.cancel(NUL),
    lambda app: app.run_now(NUL),
    lambda app: app.replay_dead_letter(NUL),
    lambda app: app.revoke_api_key(NUL),
]


@pytest.mark.parametrize(("field", "call"), REFUSED, ids=[f for f, _ in REFUSED])
def test_nul_in_a_value__refused_naming_the_field(
    app: App, field: str, call: Callable[[App], object]
) -> None:
    before = app.schedule("noop", cron="*/5 * * * *")
    with pytest.raises(ValidationError) as refused:
        call(app)
    assert refused.value.field == field
    assert "NUL" in str(refused.value)
    assert [job.id for job in app.list_jobs()] == [before.id]
    assert app.get_job(before.id) == before


@pytest.mark.parametrize("call", NAMES_NOTHING)
def test_nul_in_an_id__names_nothing(app: App, call: Callable[[App], object]) -> None:
    with pytest.raises(NotFoundError):
        call(app)
