"""Property-based conformance: schemathesis fuzzes every operation of the live OpenAPI document.

For each operation it sends schema-valid and schema-violating requests (its coverage phase, then
``EXAMPLES_PER_OPERATION`` random ones) and checks that nothing answers 5xx, that every status
code, content type, header and body is one the spec declares, and that schema-violating input is
rejected. ``positive_data_acceptance`` is left out on purpose: the schema cannot express every
rule (cron syntax, registered task names), so some schema-valid requests are rightly a 422.

It runs twice: against a node with no API key (the spec then makes the key optional, and no
request sends one), and against a node with keys, as a writer of tenant "acme" whose rows sit
beside another tenant's. That second run also checks ``ignored_auth``: every operation that
answered the key answers a request without one, or with a made-up one, with 401.
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
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from onbeat import App, TaskContext
from onbeat.api import create_app
from onbeat.testing import FakeClock
from tests.api.conftest import run_due

EXAMPLES_PER_OPERATION = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
Ids = dict[str, list[str]]


def _seeded_app(*, keyed: bool) -> tuple[App, Ids, str | None]:
    """An App on an in-memory database (the schema is loaded at import, before fixtures exist)
    with a few jobs, executions and dead letters, their ids by path parameter name, and (if
    ``keyed``) a writer key of tenant "acme". Keyed, half the rows belong to another tenant, so
    the ids the fuzzer is pointed at include some it must not see."""
    clock = FakeClock()
    app = App("sqlite:///:memory:", clock=clock)

    @app.task(name="echo")
    def echo(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        return params

    @app.task(name="fail", max_attempts=1)
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError("boom")

    tenants = ["acme", "rival"] if keyed else ["default"]
    jobs = []
    for tenant in tenants:
        jobs += [
            app.schedule("echo", {"n": 1}, tenant=tenant),
            app.schedule("echo", cron="*/5 * * * *", timezone="Europe/Berlin", tenant=tenant),
            app.schedule("echo", at="2026-03-29T02:30:00+01:00", tenant=tenant),
            app.schedule("fail", tenant=tenant),
        ]
    asyncio.run(run_due(app, clock))
    clock.advance(3600)  # some cron fires to audit
    asyncio.run(run_due(app, clock))
    executions = [e.id for job in jobs for e in app.list_executions(job.id)]
    dead = [d.execution_id for d in app.list_dead_letters()]
    ids = {"job_id": [j.id for j in jobs], "execution_id": executions, "dead_letter_id": dead}
    key = app.create_api_key("acme", "writer")[1] if keyed else None
    return app, ids, key


def _map_case(ids: Ids) -> Any:
    def map_case(
        context: schemathesis.HookContext, case: schemathesis.Case[Any]
    ) -> schemathesis.Case[Any]:
        """Point about half of the schema-valid cases at real rows and usable values, so requests
        get past "no such job" and "unknown task" into the code behind them. Values are replaced
        only by other schema-valid values, so a positive case stays positive."""
        if case.meta is None or not case.meta.generation.mode.is_positive:
            return case
        fingerprint = hashlib.sha256(repr((case.path_parameters, case.body)).encode()).hexdigest()
        if case.headers and "Idempotency-Key" in case.headers:
            # Generated keys repeat across different bodies, which is rightly a 422; one per body.
            case.headers["Idempotency-Key"] = fingerprint[:32]
        coin = int(fingerprint, 16)
        if coin % 2:
            return case
        for name, value in case.path_parameters.items():
            if name in ids and isinstance(value, str):
                case.path_parameters[name] = ids[name][coin % len(ids[name])]
        if isinstance(case.body, dict):
            body: dict[str, Any] = copy.deepcopy(case.body)
            if isinstance(body.get("task"), str):
                body["task"] = "echo"
            if isinstance(body.get("schedule"), dict):
                body["schedule"] = _USABLE_SCHEDULES.get(
                    body["schedule"].get("type"), {"type": "now"}
                )
            case.body = body
        if case.query and isinstance(case.query.get("expression"), str):
            case.query = {**case.query, "expression": "30 2 * * *", "timezone": "Europe/Berlin"}
        for name, usable in _USABLE_INSTANTS.items():
            if case.query and isinstance(case.query.get(name), str):
                case.query = {**case.query, name: usable}
        return case

    return map_case


_USABLE_INSTANTS = {"since": "2026-01-05T12:00:00Z", "until": "2026-01-05T14:30:00+01:00"}
_USABLE_SCHEDULES: dict[object, dict[str, str]] = {
    "cron": {"type": "cron", "expression": "*/15 * * * *", "timezone": "Europe/Berlin"},
    "once": {"type": "once", "at": "2026-06-01T00:00:00Z"},
    None: {"timezone": "Asia/Tokyo"},
}

_open_app, _open_ids, _ = _seeded_app(keyed=False)
open_schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_open_app))
open_schema.hook(_map_case(_open_ids))

_keyed_app, _keyed_ids, _key = _seeded_app(keyed=True)
keyed_schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_keyed_app))
keyed_schema.hook(_map_case(_keyed_ids))


@keyed_schema.auth(refresh_interval=None, retry_on=[])
class _WriterKey:
    """Every generated request carries the writer key of "acme" (schemathesis leaves it off the
    cases that test a missing or malformed ``Authorization`` on purpose)."""

    def get(self, case: schemathesis.Case[Any], ctx: Any) -> str:
        assert _key is not None
        return _key

    def set(self, case: schemathesis.Case[Any], data: str, ctx: Any) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


_SETTINGS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@open_schema.parametrize()
@_SETTINGS
def test_api__every_operation_conforms_to_the_spec__without_keys(
    case: schemathesis.Case[Any],
) -> None:
    case.call_and_validate(checks=CHECKS)


@keyed_schema.parametrize()
@_SETTINGS
def test_api__every_operation_conforms_to_the_spec__with_a_tenant_key(
    case: schemathesis.Case[Any],
) -> None:
    case.call_and_validate(checks=[*CHECKS, ignored_auth])
