"""S9, malformed input against a live ``onbeat api`` (auth on, a fresh PostgreSQL schema): the
auth matrix over every route, a table of invalid cron expressions and time zones, oversized
bodies, and Schemathesis fuzzing the served OpenAPI document (``--checks all``, stateful phase,
bounded examples) with a writer key.

Rows are seeded in this process through an ``App`` on the same schema (two tenants' jobs,
executions and dead letters, API keys of every role); the API process knows the tasks from the
store's catalog, as in a real fleet. Every refused request must leave every table as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import httpx

from onbeat import App, ValidationError
from onbeat.auth import Role
from onbeat.clock import SystemClock
from onbeat.schedule import Schedule
from onbeat.testing.postgres import fresh_schema
from onbeat.worker.catalog import task_defaults
from tests.api.authz import (
    NUL_IDS,
    PUBLIC,
    ROUTES,
    UNKNOWN,
    WITH_ID,
    Route,
    Tenant,
    bad_authorizations,
    tenant_rows,
)
from tests.api.conftest import PROBLEM, TABLES, add_test_tasks, assert_problem, bearer
from tests.api.conftest import make_dead_letter as dead_letter
from tests.client.conftest import free_port
from tests.faults.checker import Report, query
from tests.faults.fleet import Fleet
from tests.faults.process import REPO, wait_for_output
from tests.faults.s9_corpus import CRON_CORPUS, TIMEZONE_CORPUS

VALIDATION_BOUND = 0.050
"""Seconds one cron/time-zone validation may take (RELIABILITY.md)."""
NO_HANG_BOUND = 2.0
"""Seconds a refused request may take end to end over HTTP on a busy 2-core box: not a latency
target, a bound that a hang (a runaway cron search, a huge string) would break."""
BIG_BODY = 1024 * 1024 + 1
"""One byte over the API's default body cap."""
FUZZ_EXAMPLES = 8
"""Schemathesis ``--max-examples`` per operation (each phase), bounded to fit the budget."""
FUZZ_SECONDS = 40
"""Schemathesis ``--max-time``: the fuzzing and stateful phases stop when it is spent."""
PHASES = "examples,coverage,fuzzing,stateful"
EXCLUDED_CHECKS = "positive_data_acceptance,use_after_free"
"""``positive_data_acceptance``: the schema cannot express every rule (cron syntax, registered
task names), so a schema-valid request is sometimes rightly a 422 (as
tests/api/test_schemathesis.py explains). ``use_after_free``: ``DELETE /jobs/{job_id}`` cancels
a job, which stays readable with its history (the operation's documented contract), where the
check expects a 404 after a DELETE."""


@dataclass
class Outcome:
    """Requests sent and what went wrong, for one part of the scenario."""

    sent: int = 0
    cells: int = 0
    failures: list[str] = field(default_factory=list)

    def expect(self, label: str, response: httpx.Response, status: int, name: str | None) -> None:
        """One cell: ``response`` is ``status`` (a problem document naming ``name`` if 4xx)."""
        self.sent += 1
        self.cells += 1
        try:
            if status >= 400:
                assert_problem(response, status, name)
            else:
                assert response.status_code == status, response.text[:300]
        except (AssertionError, KeyError, ValueError) as exc:
            self.failures.append(f"{label}: want {status}, got {response.status_code}: {exc}")


def snapshot(database_url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every onbeat table, by plain SQL."""
    return {
        table: sorted(query(database_url, f"SELECT * FROM {table}"), key=repr) for table in TABLES
    }


def changed_tables(before: dict[str, list[tuple[Any, ...]]], database_url: str) -> list[str]:
    after = snapshot(database_url)
    return [table for table in TABLES if before[table] != after[table]]


@dataclass
class World:
    """The seeded rows: acme (the caller) with keys of every role and spare dead letters for the
    writes that consume one, rival (the other tenant) with a writer key."""

    acme: Tenant
    rival: Tenant
    spare_dead_letters: list[str]
    bad_authorizations: list[str]


async def _seed(app: App) -> World:
    clock = SystemClock()
    acme, rival = await tenant_rows(app, clock, "acme"), await tenant_rows(app, clock, "rival")
    spare = [await dead_letter(app, clock, "acme") for _ in range(2)]
    for role in Role:
        acme.keys[role] = app.create_api_key("acme", role)[1]
    rival.keys[Role.WRITER] = app.create_api_key("rival", Role.WRITER)[1]
    # A header value with surrounding whitespace cannot be sent over the wire (h11 refuses it).
    bad = [value for value in bad_authorizations(app) if value == value.strip()]
    return World(acme, rival, spare, bad)


def _call(
    client: httpx.Client, route: Route, ids: dict[str, str], headers: dict[str, str]
) -> httpx.Response:
    return client.request(
        route.method, route.url(ids), json=route.body, params=route.query, headers=headers
    )


def refused_matrix(client: httpx.Client, world: World) -> Outcome:
    """Every cell that must be refused: no key and every bad key (401), a reader's writes and a
    writer's admin route (403), another tenant's ids, unknown ones and ones with NUL (404), NUL in
    a query (400)."""
    out = Outcome()
    acme = world.acme
    for route in ROUTES:
        response = _call(client, route, acme.ids, {})
        out.expect(f"no key {route}", response, 401, "Authorization")
        if response.headers.get("www-authenticate") != 'Bearer realm="onbeat"':
            out.failures.append(f"no key {route}: WWW-Authenticate {response.headers}")
        for authorization in world.bad_authorizations:
            response = _call(client, route, acme.ids, {"Authorization": authorization})
            out.expect(f"bad key {authorization[:20]!r} {route}", response, 401, "Authorization")
        if route.writes:
            response = _call(client, route, acme.ids, bearer(acme.keys[Role.READER]))
            out.expect(f"reader {route}", response, 403, "Authorization")
        if route.admin:
            response = _call(client, route, acme.ids, bearer(acme.keys[Role.WRITER]))
            out.expect(f"writer {route}", response, 403, "Authorization")
    for route in WITH_ID:
        admin = bearer(acme.keys[Role.ADMIN])
        out.expect(f"cross-tenant {route}", _call(client, route, world.rival.ids, admin), 404, None)
        unknown = dict.fromkeys(world.rival.ids, UNKNOWN)
        out.expect(f"unknown id {route}", _call(client, route, unknown, admin), 404, None)
        out.expect(f"NUL in id {route}", _call(client, route, NUL_IDS, admin), 404, None)
    for route in ROUTES:
        if not route.writes:
            query = {**route.query, "task": "a\x00b"}
            reader = bearer(acme.keys[Role.READER])
            response = client.get(route.url(acme.ids), params=query, headers=reader)
            out.expect(f"NUL in the query {route}", response, 400, "task")
    out.expect("no key, unknown path", client.get("/nothing-here"), 401, None)
    return out


def accepted_matrix(client: httpx.Client, world: World) -> Outcome:
    """The cells that must work: public paths without a key, a reader's reads, and a writer's
    (an admin's for admin routes) every route, each write on rows of its own."""
    out = Outcome()
    base = str(client.base_url).removesuffix("/api/v1/").removesuffix("/api/v1")
    for path in PUBLIC:
        out.expect(f"public {path}", client.get(base + path), 200, None)
    acme = world.acme
    spare = iter(world.spare_dead_letters)
    for route in ROUTES:
        if not route.writes:
            response = _call(client, route, acme.ids, bearer(acme.keys[Role.READER]))
            out.expect(f"reader {route}", response, 200, None)
        role = Role.ADMIN if route.admin else Role.WRITER
        key = bearer(acme.keys[role])
        ids = dict(acme.ids)
        if route.writes and "{job_id}" in route.path:
            body = {"task": "echo", "schedule": {"type": "cron", "expression": "0 * * * *"}}
            ids["job_id"] = client.post("/jobs", json=body, headers=key).json()["id"]
            out.sent += 1
        if route.writes and "{dead_letter_id}" in route.path:
            ids["dead_letter_id"] = next(spare)
        response = _call(client, route, ids, key)
        out.sent += 1
        out.cells += 1
        if not 200 <= response.status_code < 300:
            out.failures.append(f"{role} {route}: {response.status_code} {response.text[:200]}")
    return out


@dataclass
class CorpusOutcome(Outcome):
    validation_ms_max: float = 0.0
    http_ms_max: float = 0.0


def cron_corpus(client: httpx.Client, writer: dict[str, str]) -> CorpusOutcome:
    """Each invalid expression or zone: refused by the validator within ``VALIDATION_BOUND``
    (timed in this process) and by the live API with a 422 naming the field, without a hang."""
    out = CorpusOutcome()
    cases: list[tuple[str, object, object]] = [
        ("schedule.expression", e, "UTC") for e in CRON_CORPUS
    ]
    cases += [("schedule.timezone", "* * * * *", z) for z in TIMEZONE_CORPUS]
    for name, expression, zone in cases:
        label = f"{name} {expression!r:.60} {zone!r:.60}"
        began = time.perf_counter()
        try:
            Schedule.parse(cron=expression, timezone=zone)  # type: ignore[arg-type]
            out.failures.append(f"{label}: accepted by the validator")
        except ValidationError:
            pass
        took = time.perf_counter() - began
        out.validation_ms_max = max(out.validation_ms_max, took * 1000)
        if took > VALIDATION_BOUND:
            out.failures.append(f"{label}: validation took {took * 1000:.1f} ms")
        schedule = {"type": "cron", "expression": expression, "timezone": zone}
        body = {"task": "echo", "schedule": schedule}
        began = time.perf_counter()
        response = client.post("/jobs", content=json.dumps(body), headers=writer | _JSON)
        took = time.perf_counter() - began
        out.http_ms_max = max(out.http_ms_max, took * 1000)
        if took > NO_HANG_BOUND:
            out.failures.append(f"{label}: the API took {took:.2f} s")
        out.expect(label, response, 422, name)
    return out


_JSON = {"content-type": "application/json"}


def big_bodies(client: httpx.Client, writer: dict[str, str]) -> Outcome:
    """A body one byte over 1 MiB, with a Content-Length and chunked: 413 with a key, 401 (before
    it is read) without one."""
    out = Outcome()
    big = b'{"task": "echo", "params": {"x": "' + b"x" * BIG_BODY + b'"}}'

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(big), 65536):
            yield big[at : at + 65536]

    out.expect(
        "1 MiB+ body", client.post("/jobs", content=big, headers=writer | _JSON), 413, "body"
    )
    chunked = client.post("/jobs", content=chunks(), headers=writer | _JSON)
    out.expect("1 MiB+ chunked body", chunked, 413, "body")
    out.expect("1 MiB+ body, no key", client.post("/jobs", content=big, headers=_JSON), 401, None)
    return out


@dataclass
class FuzzOutcome:
    requests: int = 0
    server_errors: int = 0
    non_problem_4xx: int = 0
    failures_by_check: dict[str, int] = field(default_factory=dict)
    exit_status: int = 0
    examples: list[str] = field(default_factory=list)


def fuzz(api_root: str, key: str, seed: int, reports: Path) -> FuzzOutcome:
    """The Schemathesis CLI against the live API's own spec; counts from its HAR (every request it
    sent) and its JUnit report (every failed check)."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{api_root}/openapi.json",
        "--checks", "all", "--exclude-checks", EXCLUDED_CHECKS, "--phases", PHASES,
        "--header", f"Authorization: Bearer {key}", "--max-examples", str(FUZZ_EXAMPLES),
        "--max-time", str(FUZZ_SECONDS), "--seed", str(seed), "--workers", "2", "--no-shrink",
        "--report", "har,junit", "--report-dir", str(reports), "--continue-on-failure",
        "--request-timeout", "10", "--suppress-health-check", "all",
    ]  # fmt: skip
    shutil.rmtree(reports, ignore_errors=True)  # the reports of this run only
    reports.mkdir(parents=True)
    done = subprocess.run(
        command,
        cwd=reports,
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 120,
        check=False,
    )
    (reports / "schemathesis.log").write_text(done.stdout + done.stderr)
    out = FuzzOutcome(exit_status=done.returncode)
    for har in reports.glob("har-*.json"):
        for entry in json.loads(har.read_text())["log"]["entries"]:
            out.requests += 1
            status = entry["response"]["status"]
            out.server_errors += status >= 500
            kind = {h["name"].lower(): h["value"] for h in entry["response"]["headers"]}
            if 400 <= status < 500 and kind.get("content-type") != PROBLEM:
                out.non_problem_4xx += 1
                out.examples.append(f"{entry['request']['method']} {entry['request']['url']}")
    out.failures_by_check = _junit_failures(reports)
    return out


def _junit_failures(reports: Path) -> dict[str, int]:
    """Failed checks by their code and title (``ST101 Server error``) in the JUnit report: each
    failure element lists its failed checks on lines of their own."""
    counts: Counter[str] = Counter()
    for path in reports.glob("junit-*.xml"):
        for failure in ElementTree.parse(path).iter("failure"):
            titles = [
                line.strip()[2:]
                for line in (failure.text or "").splitlines()
                if line.strip().startswith("- ST")
            ]
            counts.update(titles or [f"(unparsed) {failure.get('message')}"])
    return dict(counts)


def run(seed: int, artifacts: Path) -> Report:
    shutil.rmtree(artifacts / "logs", ignore_errors=True)  # a log of an earlier run says "up"
    (artifacts / "logs").mkdir(parents=True)
    began = time.monotonic()
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_schema())
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
            "ONBEAT_DATABASE_URL": database_url,
            "ONBEAT_LOG_LEVEL": "WARNING",
        }
        fleet = Fleet(env, artifacts / "logs")
        stack.callback(fleet.stop_all)
        fleet.migrate()
        app = add_test_tasks(App(database_url))
        stack.callback(app.close)
        app.store.task_publish("s9-seeder", task_defaults(app.registry))
        world = asyncio.run(_seed(app))
        port = free_port()
        proc = fleet.start("api", "--port", str(port))
        wait_for_output(proc.process, proc.log, "onbeat API:")
        root = f"http://127.0.0.1:{port}"
        writer = bearer(world.acme.keys[Role.WRITER])
        with httpx.Client(base_url=f"{root}/api/v1", timeout=30) as client:
            before = snapshot(database_url)
            refused = refused_matrix(client, world)
            corpus = cron_corpus(client, writer)
            bodies = big_bodies(client, writer)
            changed = changed_tables(before, database_url)
            accepted = accepted_matrix(client, world)
        fuzzed = fuzz(root, world.acme.keys[Role.WRITER], seed, artifacts / "schemathesis")
        api_exit = fleet.stop_all().get(proc.log.name)
    return _report(seed, artifacts, refused, accepted, corpus, bodies, changed, fuzzed, api_exit,
                   time.monotonic() - began)  # fmt: skip


def _report(
    seed: int,
    artifacts: Path,
    refused: Outcome,
    accepted: Outcome,
    corpus: CorpusOutcome,
    bodies: Outcome,
    changed: list[str],
    fuzzed: FuzzOutcome,
    api_exit: int | None,
    seconds: float,
) -> Report:
    schema_violations = sum(
        n for title, n in fuzzed.failures_by_check.items() if "schema" in title.lower()
    )
    parts: list[Outcome] = [refused, accepted, corpus, bodies]
    metrics: dict[str, Any] = {
        "requests_sent": sum(p.sent for p in parts) + fuzzed.requests,
        "fuzz_requests": fuzzed.requests,
        "fuzz_5xx": fuzzed.server_errors,
        "fuzz_schema_violations": schema_violations,
        "fuzz_non_problem_4xx": fuzzed.non_problem_4xx,
        "fuzz_failed_checks": sum(fuzzed.failures_by_check.values()),
        "authz_cells": refused.cells + accepted.cells,
        "authz_failures": len(refused.failures) + len(accepted.failures),
        "cron_corpus_size": corpus.cells,
        "cron_corpus_failures": len(corpus.failures),
        "cron_validation_ms_max": corpus.validation_ms_max,
        "cron_http_ms_max": corpus.http_ms_max,
        "body_413_checks": bodies.cells,
        "body_413_failures": len(bodies.failures),
        "rows_changed_by_rejected": len(changed),
        "burst_429": "not checked: onbeat's API has no request quota",
        "api_clean_exit": api_exit == 0,
        "seconds": seconds,
    }
    checks = {
        "fuzz_5xx": fuzzed.server_errors == 0,
        "fuzz_schema_violations": schema_violations == 0,
        "fuzz_non_problem_4xx": fuzzed.non_problem_4xx == 0,
        "fuzz_failed_checks": not fuzzed.failures_by_check and fuzzed.requests > 0,
        "authz_failures": not refused.failures and not accepted.failures,
        "cron_corpus_failures": not corpus.failures,
        "cron_validation_ms_max": corpus.validation_ms_max <= VALIDATION_BOUND * 1000,
        "body_413_failures": not bodies.failures,
        "rows_changed_by_rejected": not changed,
        "api_clean_exit": api_exit == 0,
    }
    report = Report("S9", seed, metrics, checks)
    report.config = {
        "what": "API fuzz (Schemathesis), invalid cron/TZ corpus, auth matrix, 1 MiB+ bodies",
        "schemathesis": {
            "phases": PHASES,
            "checks": f"all but {EXCLUDED_CHECKS}",
            "max_examples": FUZZ_EXAMPLES,
            "max_time": FUZZ_SECONDS,
            "exit_status": fuzzed.exit_status,
            "failures_by_check": fuzzed.failures_by_check,
        },
        "details": {
            "authz": (refused.failures + accepted.failures)[:20],
            "corpus": corpus.failures[:20],
            "bodies": bodies.failures,
            "changed_tables": changed,
            "non_problem_4xx": fuzzed.examples[:20],
        },
    }
    report.write(artifacts)
    return report
