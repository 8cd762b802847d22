"""Runs a scenario of ``scenarios.py``: starts the fleet on a fresh PostgreSQL schema and a
private Redis (or the embedded node on a SQLite file) under the supervisor, drives the load and
the nemesis, cancels, drains and hands everything to the checker. Logs, ledgers, the ack log and
the timeline stay in ``artifacts``."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psycopg

from onbeat.testing.postgres import fresh_schema
from tests.faults.checker import Observed, Report, Thresholds, check, query, read_ledgers
from tests.faults.fleet import Fleet, PrivateRedis, private_redis, running_of
from tests.faults.loadgen import AckLog, LoadGenerator, read_acks
from tests.faults.nemesis import FaultEvent, Nemesis, ServiceFault
from tests.faults.process import APP, REPO, wait_for_output, wait_until
from tests.faults.scenarios import (
    CANCEL_PHASE,
    DRAIN_TIMEOUT,
    EMBEDDED_TIMINGS,
    FLEET_TIMINGS,
    REDIS_PORTS,
    SCENARIOS,
    START_DELAY_P99,
    Scenario,
)
from tests.faults.supervisor import Supervisor


@dataclass(frozen=True, slots=True)
class FleetContext:
    """What a scenario's service faults may act on."""

    fleet: Fleet
    supervisor: Supervisor
    redis: PrivateRedis
    database_url: str
    api: str
    artifacts: Path


def free_redis_port() -> int:
    for port in REDIS_PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError(f"no free port in {REDIS_PORTS}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run(name: str, seed: int, artifacts: Path) -> Report:
    scenario = SCENARIOS[name]
    artifacts.mkdir(parents=True, exist_ok=True)
    for sub in ("logs", "ledger"):
        (artifacts / sub).mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
        "ONBEAT_TEST_LEDGER_DIR": str(artifacts / "ledger"),
        "ONBEAT_LOG_LEVEL": "WARNING",
    }
    if scenario.embedded:
        return _run_embedded(scenario, seed, artifacts, env)
    timings = FLEET_TIMINGS | dict(scenario.timings)
    with ExitStack() as stack:
        schema_url = stack.enter_context(fresh_schema())
        redis = stack.enter_context(private_redis(artifacts / "redis", free_redis_port()))
        app_name = f"onbeat-faults-{uuid.uuid4().hex[:10]}"
        env |= {k: str(v) for k, v in timings.items()}
        env |= {
            "ONBEAT_DATABASE_URL": f"{schema_url}&application_name={app_name}",
            "ONBEAT_QUEUE_URL": redis.url,
        }
        fleet = Fleet(env, artifacts / "logs")
        stack.callback(fleet.stop_all)
        fleet.migrate()
        port = free_port()
        supervisor = Supervisor(fleet)
        stack.callback(supervisor.stop)
        procs = [fleet.start("api", "--port", str(port))]
        procs += [fleet.start("scheduler") for _ in range(scenario.schedulers)]
        procs += [fleet.worker() for _ in range(scenario.workers)]
        for proc in procs:
            fleet.wait_up(proc) if proc.role != "api" else wait_for_output(
                proc.process, proc.log, "onbeat API:"
            )
            supervisor.watch(proc)
        api = f"http://127.0.0.1:{port}/api/v1"
        _wait_tasks(api)
        context = FleetContext(fleet, supervisor, redis, schema_url, api, artifacts)
        services = scenario.services(context) if scenario.services else {}
        return _drive(
            scenario, seed, artifacts, api, schema_url, supervisor,
            lambda pid: running_of(schema_url, pid),
            Thresholds(
                lease_ttl=timings["ONBEAT_LEASE_TTL"],
                heartbeat_interval=timings["ONBEAT_HEARTBEAT_INTERVAL"],
                start_delay_p99=START_DELAY_P99,
                t_detect=timings["ONBEAT_LEASE_TTL"] + 2,
                t_release=scenario.t_release,
                fault_window=timings["ONBEAT_LEASE_TTL"] + 4,
                t_takeover=(
                    timings["ONBEAT_SHARD_LEASE_TTL"] + 2 if scenario.measure_takeover else None
                ),
                burst_p99=scenario.burst_p99,
            ),
            {"timings": timings, "queue": "redis",
             "processes": f"1 api, {scenario.schedulers} schedulers, {scenario.workers} workers"},
            services,
        )  # fmt: skip
    raise AssertionError("unreachable")


def _run_embedded(scenario: Scenario, seed: int, artifacts: Path, env: dict[str, str]) -> Report:
    db_path = artifacts / "onbeat.db"
    db = f"sqlite:///{db_path}"
    timings = EMBEDDED_TIMINGS | dict(scenario.timings)
    env |= {k: str(v) for k, v in timings.items()}
    env["ONBEAT_DATABASE_URL"] = db
    fleet = Fleet(env, artifacts / "logs")
    supervisor = Supervisor(fleet)
    try:
        fleet.migrate()
        port = free_port()
        node = fleet.start("up", "--app", APP, "--port", str(port))
        wait_for_output(node.process, node.log, "onbeat API:")
        supervisor.watch(node)
        api = f"http://127.0.0.1:{port}/api/v1"
        _wait_tasks(api)
        pragmas = {p: query(db, f"PRAGMA {p}")[0][0] for p in ("journal_mode", "synchronous")}

        def held(_pid: int) -> set[str]:
            rows = query(db, "SELECT id FROM executions WHERE status = 'running'")
            return {row[0] for row in rows}

        return _drive(
            scenario, seed, artifacts, api, db, supervisor, held,
            Thresholds(
                lease_ttl=timings["ONBEAT_LEASE_TTL"],
                heartbeat_interval=timings["ONBEAT_HEARTBEAT_INTERVAL"],
                start_delay_p99=START_DELAY_P99,
                t_detect=None,
                fault_window=timings["ONBEAT_LEASE_TTL"] + 6,
            ),
            {"timings": timings, "sqlite": pragmas, "processes": "1 onbeat up"},
            submit_first=True,
        )  # fmt: skip
    finally:
        supervisor.stop()
        fleet.stop_all()


def _wait_tasks(api: str) -> None:
    def published() -> bool:
        tasks = {t["name"] for t in httpx.get(f"{api}/tasks").json()["items"]}
        return {"work", "work_sync"} <= tasks

    wait_until(published, 30, "the ledger app's tasks to be published")


def _drive(
    scenario: Scenario,
    seed: int,
    artifacts: Path,
    api: str,
    db: str,
    supervisor: Supervisor,
    held: Callable[[int], set[str]],
    thresholds: Thresholds,
    config: dict[str, object],
    services: dict[str, ServiceFault] | None = None,
    submit_first: bool = False,
) -> Report:
    """Load, faults, cancel, drain, check. ``submit_first``: all one-shots are submitted before
    the first fault (the embedded node's API dies with it)."""
    if scenario.starts_at is not None:
        period, phase = scenario.starts_at
        time.sleep((phase - time.time()) % period)
    acks = AckLog(artifacts / "acks.jsonl")
    load = LoadGenerator(api, scenario.workload, seed, acks)
    plan = scenario.plan(seed, supervisor.slots_of(scenario.victims), scenario.load_seconds)
    ledger = artifacts / "ledger"

    def held_by(pid: int) -> set[str]:
        """The store's account, and the ledger's starts without an end by ``pid``."""
        lines = [e for e in read_ledgers(ledger) if e["pid"] == pid]
        ended = {e["execution_id"] for e in lines if e["event"] == "end"}
        return held(pid) | {e["execution_id"] for e in lines if e["event"] == "start"} - ended

    nemesis = Nemesis(supervisor, plan, held_by, services)
    began = time.monotonic()
    supervisor.start()
    load.start()
    if submit_first:
        wait_until(lambda: not load._thread.is_alive(), 120, "the load to be submitted")
    nemesis.start()
    time.sleep(max(0.0, began + scenario.load_seconds - time.monotonic()))
    nemesis.stop()
    nemesis.write(artifacts / "timeline.json")
    # Every restart of the last kill is done before the cancels go to the API.
    wait_until(lambda: all(p.process.poll() is None for p in supervisor.slots), 30, "restarts")
    wait_until(lambda: _answers(api), 30, "the API after the last restart")
    load.stop(CANCEL_PHASE)
    acks.close()
    pending = "SELECT count(*) FROM executions WHERE status IN ('scheduled', 'queued', 'running')"
    wait_until(lambda: _none_left(db, pending), DRAIN_TIMEOUT, "every run to be final")
    seconds = time.monotonic() - began
    supervisor.stop()
    caused = {e.pid for e in nemesis.timeline}
    deaths = [
        FaultEvent("died", r.role, r.slot, r.died_pid, r.died_at, 0, sorted(held_by(r.died_pid)))
        for r in supervisor.restarts
        if r.died_pid not in caused
    ]
    seen = Observed(
        read_acks(artifacts / "acks.jsonl"), read_ledgers(ledger), nemesis.timeline, deaths,
        artifacts / "logs",
    )  # fmt: skip
    report = check(scenario.name, seed, db, seen, thresholds, CANCEL_PHASE + 1, seconds)
    report.config |= {
        "what": scenario.what,
        "workload": asdict(scenario.workload),
        "load_seconds": scenario.load_seconds,
        "restarts": len(supervisor.restarts),
        **config,
    }
    report.write(artifacts)
    return report


def _none_left(db: str, count_sql: str) -> bool:
    """``count_sql`` counts 0; a connection the shared server refuses (too many clients, while
    other suites run beside this one) is "not yet", asked again at the next poll."""
    try:
        return bool(query(db, count_sql)[0][0] == 0)
    except psycopg.OperationalError:
        return False


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}/tasks", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
