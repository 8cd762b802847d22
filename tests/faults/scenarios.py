"""The scenarios of this slice, quick profile: S0 baseline, S1 worker crash soak (fleet on
PostgreSQL + a private Redis) and S11 the embedded SQLite node killed x5. Each returns the
checker's ``Report`` and leaves its logs, ledgers, ack log and timeline in ``artifacts``."""

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

from onbeat.testing.postgres import fresh_schema
from tests.faults.checker import Report, Thresholds, check, query, read_ledgers
from tests.faults.fleet import Fleet, private_redis, running_of
from tests.faults.loadgen import AckLog, LoadGenerator, Workload, read_acks
from tests.faults.nemesis import Nemesis, PlannedFault, kill_plan
from tests.faults.process import APP, REPO, wait_for_output, wait_until
from tests.faults.supervisor import Supervisor

FLEET_TIMINGS = {
    "ONBEAT_LEASE_TTL": 4.0,
    "ONBEAT_HEARTBEAT_INTERVAL": 1.0,
    "ONBEAT_REAP_INTERVAL": 1.0,
    "ONBEAT_SHARD_LEASE_TTL": 4.0,
    "ONBEAT_SHARD_RENEW_INTERVAL": 1.0,
    "ONBEAT_SWEEP_INTERVAL": 1.0,
    "ONBEAT_SWEEP_OVERDUE": 3.0,
    "ONBEAT_WINDOW": 4.0,
    "ONBEAT_POLL_INTERVAL": 0.2,
}
"""Test-mode timings, scaled down from RELIABILITY.md's (10 s run lease) to fit the quick profile."""
EMBEDDED_TIMINGS = {
    "ONBEAT_LEASE_TTL": 2.0,
    "ONBEAT_HEARTBEAT_INTERVAL": 0.5,
    "ONBEAT_SHARD_LEASE_TTL": 2.0,
    "ONBEAT_SHARD_RENEW_INTERVAL": 0.5,
    "ONBEAT_SWEEP_INTERVAL": 1.0,
    "ONBEAT_SWEEP_OVERDUE": 3.0,
}
REDIS_PORTS = range(18800, 18850)
"""This suite's private redis-server listens on a free port of this range."""
CANCEL_PHASE = 0.6
DRAIN_TIMEOUT = 90.0
START_DELAY_P99 = 2.0
"""Baseline start-delay p99 bound of the quick profile: RELIABILITY.md targets 250 ms on a quiet
box; 7 processes and PostgreSQL share 2 cores here with other suites beside them."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    what: str
    workload: Workload
    load_seconds: float
    kill_interval: tuple[float, float] | None = None
    """``kill -9`` a random worker (or the node) every U(interval) seconds."""
    kill_limit: int = 1000
    embedded: bool = False


SCENARIOS = {
    "S0": Scenario(
        "S0",
        "baseline: no faults",
        Workload(batches=50, batch=60, pace=0.5, due_within=(1.0, 5.0), crons=20),
        load_seconds=25,
    ),
    "S1": Scenario(
        "S1",
        "worker crash soak: kill -9 a random worker every U(3,7) s, restarted after 1 s",
        Workload(batches=110, batch=50, pace=0.5, due_within=(1.0, 5.0), crons=20),
        load_seconds=55,
        kill_interval=(3.0, 7.0),
    ),
    "S11": Scenario(
        "S11",
        "embedded SQLite node (onbeat up) kill -9 x5, restarted after 1 s",
        Workload(batches=30, batch=100, pace=0.0, due_within=(2.0, 30.0), crons=10),
        load_seconds=28,
        kill_interval=(3.0, 5.0),
        kill_limit=5,
        embedded=True,
    ),
}


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
    with ExitStack() as stack:
        schema_url = stack.enter_context(fresh_schema())
        redis = stack.enter_context(private_redis(artifacts / "redis", free_redis_port()))
        app_name = f"onbeat-faults-{uuid.uuid4().hex[:10]}"
        env |= {k: str(v) for k, v in FLEET_TIMINGS.items()}
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
        procs += [fleet.start("scheduler") for _ in range(2)]
        procs += [fleet.worker() for _ in range(4)]
        for proc in procs:
            fleet.wait_up(proc) if proc.role != "api" else wait_for_output(
                proc.process, proc.log, "onbeat API:"
            )
            supervisor.watch(proc)
        api = f"http://127.0.0.1:{port}/api/v1"
        _wait_tasks(api)
        return _drive(
            scenario, seed, artifacts, api, schema_url, supervisor, "worker",
            lambda pid: running_of(schema_url, pid),
            Thresholds(
                lease_ttl=FLEET_TIMINGS["ONBEAT_LEASE_TTL"],
                start_delay_p99=START_DELAY_P99,
                t_detect=FLEET_TIMINGS["ONBEAT_LEASE_TTL"] + 2,
                fault_window=FLEET_TIMINGS["ONBEAT_LEASE_TTL"] + 4,
            ),
            {"timings": FLEET_TIMINGS, "queue": "redis", "processes": "1 api, 2 schedulers, 4 workers"},
        )  # fmt: skip
    raise AssertionError("unreachable")


def _run_embedded(scenario: Scenario, seed: int, artifacts: Path, env: dict[str, str]) -> Report:
    db_path = artifacts / "onbeat.db"
    db = f"sqlite:///{db_path}"
    env |= {k: str(v) for k, v in EMBEDDED_TIMINGS.items()}
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
            scenario, seed, artifacts, api, db, supervisor, "up", held,
            Thresholds(
                lease_ttl=EMBEDDED_TIMINGS["ONBEAT_LEASE_TTL"],
                start_delay_p99=START_DELAY_P99,
                t_detect=None,
                fault_window=EMBEDDED_TIMINGS["ONBEAT_LEASE_TTL"] + 6,
            ),
            {"timings": EMBEDDED_TIMINGS, "sqlite": pragmas, "processes": "1 onbeat up"},
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
    victim_role: str,
    held: Callable[[int], set[str]],
    thresholds: Thresholds,
    config: dict[str, object],
    submit_first: bool = False,
) -> Report:
    """Load, faults, cancel, drain, check. ``submit_first``: all one-shots are submitted before
    the first fault (the embedded node's API dies with it)."""
    acks = AckLog(artifacts / "acks.jsonl")
    load = LoadGenerator(api, scenario.workload, seed, acks)
    plan: list[PlannedFault] = []
    if scenario.kill_interval is not None:
        plan = kill_plan(
            seed, supervisor.slots_of(victim_role), scenario.kill_interval,
            scenario.load_seconds, scenario.kill_limit,
        )  # fmt: skip
    ledger = artifacts / "ledger"

    def held_by(pid: int) -> set[str]:
        """The store's account, and the ledger's starts without an end by ``pid``."""
        lines = [e for e in read_ledgers(ledger) if e["pid"] == pid]
        ended = {e["execution_id"] for e in lines if e["event"] == "end"}
        return held(pid) | {e["execution_id"] for e in lines if e["event"] == "start"} - ended

    nemesis = Nemesis(supervisor, plan, held_by)
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
    wait_until(lambda: query(db, pending)[0][0] == 0, DRAIN_TIMEOUT, "every run to be final")
    seconds = time.monotonic() - began
    supervisor.stop()
    report = check(
        scenario.name, seed, db, read_acks(artifacts / "acks.jsonl"), read_ledgers(ledger),
        nemesis.timeline, thresholds, CANCEL_PHASE + 1, seconds,
    )  # fmt: skip
    report.config |= {
        "what": scenario.what,
        "workload": asdict(scenario.workload),
        "load_seconds": scenario.load_seconds,
        "restarts": len(supervisor.restarts),
        **config,
    }
    report.write(artifacts)
    return report


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}/tasks", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
