"""Property-based conformance: schemathesis fuzzes every operation of the live OpenAPI document.

For each operation it sends schema-valid and schema-violating requests (its coverage phase, then
``EXAMPLES_PER_OPERATION`` random ones) and checks that nothing answers 5xx, that every status
code, content type, header and body is one the spec declares, and that schema-violating input is
rejected. ``positive_data_acceptance`` is left out on purpose: the schema cannot express every
rule (cron syntax, registered task names), so some schema-valid requests are rightly a 422.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from onbeat import App, TaskContext
from onbeat.api import create_app
from onbeat.testing import FakeClock
from tests.api.conftest import make_dead_letter

EXAMPLES_PER_OPERATION = 20


def _seeded_app() -> tuple[App, dict[str, list[str]]]:
    """An App on an in-memory database (the schema is loaded at import, before fixtures exist)
    with a few jobs, executions and dead letters, and their ids by path parameter name."""
    clock = FakeClock()
    app = App("sqlite:///:memory:", clock=clock)

    @app.task(name="echo")
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    @app.task(name="fail", max_attempts=1)
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError("boom")

    jobs = [
        app.schedule("echo", {"n": 1}),
        app.schedule("echo", cron="*/5 * * * *", timezone="Europe/Berlin"),
        app.schedule("echo", at="2026-03-29T02:30:00+01:00"),
    ]
    dead = [asyncio.run(make_dead_letter(app, clock)) for _ in range(2)]
    executions = [e.id for job in jobs for e in app.list_executions(job.id)] + dead
    return app, {"job_id": [j.id for j in jobs], "execution_id": executions, "dead_letter_id": dead}


_app, _ids = _seeded_app()
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_app))


@schema.hook
def map_case(
    context: schemathesis.HookContext, case: schemathesis.Case[Any]
) -> schemathesis.Case[Any]:
    """Point about half of the schema-valid cases at real rows and usable values, so requests get
    past "no such job" and "unknown task" into the code behind them. Values are replaced only by
    other schema-valid values, so a positive case stays positive."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return case
    fingerprint = hashlib.sha256(repr((case.path_parameters, case.body)).encode()).hexdigest()
    if case.headers and "Idempotency-Key" in case.headers:
        # Generated keys repeat across different bodies, which is rightly a 422; one key per body.
        case.headers["Idempotency-Key"] = fingerprint[:32]
    coin = int(fingerprint, 16)
    if coin % 2:
        return case
    for name, value in case.path_parameters.items():
        if name in _ids and isinstance(value, str):
            case.path_parameters[name] = _ids[name][coin % len(_ids[name])]
    if isinstance(case.body, dict):
        body: dict[str, Any] = copy.deepcopy(case.body)
        if isinstance(body.get("task"), str):
            body["task"] = "echo"
        if isinstance(body.get("schedule"), dict):
            body["schedule"] = _USABLE_SCHEDULES.get(body["schedule"].get("type"), {"type": "now"})
        case.body = body
    if case.query and isinstance(case.query.get("expression"), str):
        case.query = {**case.query, "expression": "30 2 * * *", "timezone": "Europe/Berlin"}
    return case


_USABLE_SCHEDULES: dict[object, dict[str, str]] = {
    "cron": {"type": "cron", "expression": "*/15 * * * *", "timezone": "Europe/Berlin"},
    "once": {"type": "once", "at": "2026-06-01T00:00:00Z"},
    None: {"timezone": "Asia/Tokyo"},
}


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api__every_operation_conforms_to_the_spec(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_headers_conformance,
            response_schema_conformance,
            negative_data_rejection,
        ]
    )
