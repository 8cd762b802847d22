"""Runs a scenario of ``scenarios.py``: starts the fleet on a fresh PostgreSQL schema and a
private Redis (or the embedded node on a SQLite file) under the supervisor, drives the load and
the nemesis, cancels, drains and hands everything to the checker. Logs, ledgers, the ack log and
the timeline stay in ``artifacts``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psycopg
from bench.box import python_loop_us

from onbeat.testing.postgres import fresh_schema
from tests.faults import s9_api, s10_dst
from tests.faults.checker import Observed, Report, Thresholds, check, query, read_ledgers
from tests.faults.fleet import Fleet, PrivateRedis, private_redis, running_of
from tests.faults.loadgen import AckLog, LoadGenerator, read_acks
from tests.faults.nemesis import FaultEvent, Nemesis, ServiceFault
from tests.faults.overdue_watch import OverdueWatch
from tests.faults.postgres_cluster import PrivatePostgres, private_postgres
from tests.faults.process import APP, FLEET_PYTHONPATH, read_ledger, wait_for_output, wait_until
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
from tests.faults.stall_watch import StallWatch
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
    postgres: PrivatePostgres | None = None
    """The scenario's own PostgreSQL cluster (``Scenario.private_postgres``), None: the shared one."""
    at_load_end: list[Callable[[], None]] = field(default_factory=list)
    """Called when the load and the faults end, before the drain (a probe stops there)."""
    reporters: list[Callable[[Report], None]] = field(default_factory=list)
    """Called with the checker's report before it is written: a scenario's own metrics and
    checks (and the end of what it measured meanwhile, such as an API probe)."""


class Phases:
    """Wall seconds per phase of a run (fleet start, load, drain, checker, teardown...), written
    to ``phases.json``: where a scenario's time goes, to keep the quick profile quick."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """The time since the previous mark went to ``phase``."""
        now = time.monotonic()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._last, 2)
        self._last = now

    def write(self, artifacts: Path) -> None:
        total = round(sum(self.seconds.values()), 2)
        (artifacts / "phases.json").write_text(json.dumps(self.seconds | {"total": total}) + "\n")


def free_redis_port() -> int:
    # From the top: other runs take the lowest free port, and a scenario that restarts its
    # Redis (S5) leaves its port free meanwhile.
    for port in reversed(REDIS_PORTS):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError(f"no free port in {REDIS_PORTS}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


OWN_RUNNERS: dict[str, Callable[[int, Path], Report]] = {"S9": s9_api.run, "S10": s10_dst.run}
"""Scenarios that need no fleet, nemesis or load: API fuzzing on one api process, the DST oracle."""


def run(
    name: str, seed: int, artifacts: Path, load_seconds: float | None = None, rate: float = 1.0
) -> Report:
    """``load_seconds``, ``rate``: the scenario's load (and faults) that long, at ``rate`` times
    its once jobs per batch (``Scenario.scaled``)."""
    if name in OWN_RUNNERS:
        return OWN_RUNNERS[name](seed, artifacts)
    scenario = SCENARIOS[name]
    if load_seconds is not None or rate != 1.0:
        scenario = scenario.scaled(load_seconds or scenario.load_seconds, rate)
    phases = Phases()
    try:
        return _run_scenario(scenario, seed, artifacts, phases)
    finally:
        phases.mark("teardown")
        phases.write(artifacts)


def _run_scenario(scenario: Scenario, seed: int, artifacts: Path, phases: Phases) -> Report:
    artifacts.mkdir(parents=True, exist_ok=True)
    # A run again into the same directory starts clean: logs, ledgers and the ack log append.
    (artifacts / "acks.jsonl").unlink(missing_ok=True)
    shutil.rmtree(artifacts / "redis", ignore_errors=True)
    for sub in ("logs", "ledger"):
        shutil.rmtree(artifacts / sub, ignore_errors=True)
        (artifacts / sub).mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": FLEET_PYTHONPATH,
        "ONBEAT_TEST_LEDGER_DIR": str(artifacts / "ledger"),
        "ONBEAT_LOG_LEVEL": "WARNING",
    }
    if scenario.embedded:
        return _run_embedded(scenario, seed, artifacts, env, phases)
    timings = FLEET_TIMINGS | dict(scenario.timings)
    with ExitStack() as stack:
        postgres = None
        if scenario.private_postgres:  # a cluster of its own, synchronous_commit on (a crash)
            postgres = stack.enter_context(private_postgres(artifacts / "logs"))
            schema_url = postgres.url
        else:
            schema_url = stack.enter_context(fresh_schema())
        phases.mark("postgres")
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
        phases.mark("redis + migrate")
        port = free_port()
        supervisor = Supervisor(fleet)
        stack.callback(supervisor.stop)
        own_env = scenario.process_env or (lambda _role, _index, _artifacts: {})
        procs = [fleet.start("api", "--port", str(port))]
        procs += [
            fleet.start("scheduler", env=own_env("scheduler", n, artifacts))
            for n in range(scenario.schedulers)
        ]
        procs += [fleet.worker(own_env("worker", n, artifacts)) for n in range(scenario.workers)]
        for proc in procs:
            fleet.wait_up(proc) if proc.role != "api" else wait_for_output(
                proc.process, proc.log, "onbeat API:"
            )
            supervisor.watch(proc)
        api = f"http://127.0.0.1:{port}/api/v1"
        _wait_tasks(api)
        phases.mark("fleet start")
        context = FleetContext(fleet, supervisor, redis, schema_url, api, artifacts, postgres)
        services = scenario.services(context) if scenario.services else {}
        overdue = OverdueWatch(schema_url, redis.url, artifacts / "overdue.jsonl")
        overdue.start()
        context.at_load_end.append(overdue.stop)
        context.reporters.append(overdue.report)
        phases.mark("services")
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
            at_load_end=context.at_load_end,
            reporters=context.reporters,
            phases=phases,
        )  # fmt: skip
    raise AssertionError("unreachable")


def _run_embedded(
    scenario: Scenario, seed: int, artifacts: Path, env: dict[str, str], phases: Phases
) -> Report:
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
        phases.mark("fleet start")
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
            phases=phases,
        )  # fmt: skip
    finally:
        supervisor.stop()
        fleet.stop_all()


def _wait_tasks(api: str) -> None:
    def published() -> bool:
        try:
            tasks = {t["name"] for t in httpx.get(f"{api}/tasks").json()["items"]}
        except httpx.TransportError:  # not listening yet
            return False
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
    at_load_end: list[Callable[[], None]] | None = None,
    reporters: list[Callable[[Report], None]] | None = None,
    phases: Phases | None = None,
) -> Report:
    """Load, faults, cancel, drain, check. ``submit_first``: all one-shots are submitted before
    the first fault (the embedded node's API dies with it)."""
    phases = phases or Phases()
    if scenario.starts_at is not None:
        period, phase = scenario.starts_at
        time.sleep((phase - time.time()) % period)
        phases.mark("wait for the start phase")
    acks = AckLog(artifacts / "acks.jsonl")
    load = LoadGenerator(api, scenario.workload, seed, acks)
    victims = [slot for role in scenario.victims for slot in supervisor.slots_of(role)]
    plan = scenario.plan(seed, victims, scenario.load_seconds)
    ledger = artifacts / "ledger"

    def held_by(pid: int) -> set[str]:
        """The store's account, and the ledger's starts without an end by ``pid`` (its own file:
        N1's ledgers grow to hundreds of MB, and a frozen victim waits for this)."""
        lines = read_ledger(ledger / f"ledger-{pid}.jsonl")
        ended = {e["execution_id"] for e in lines if e["event"] == "end"}
        return held(pid) | {e["execution_id"] for e in lines if e["event"] == "start"} - ended

    nemesis = Nemesis(supervisor, plan, held_by, services)
    (artifacts / "stalls.jsonl").unlink(missing_ok=True)
    stall_watch = StallWatch(
        ledger,
        artifacts / "stalls.jsonl",
        lambda: {f"{p.role}-{slot}": p.process.pid for slot, p in enumerate(supervisor.slots)},
        None if db.startswith("sqlite:") else db,
    )
    began = time.monotonic()
    supervisor.start()
    load.start()
    stall_watch.start()
    if submit_first:
        wait_until(lambda: not load._thread.is_alive(), 120, "the load to be submitted")
    nemesis.start()
    try:
        while (left := began + scenario.load_seconds - time.monotonic()) > 0:
            load.check()
            time.sleep(min(1.0, left))
    finally:
        nemesis.stop()
        stall_watch.stop()
    phases.mark("load")
    nemesis.write(artifacts / "timeline.json")
    for end in at_load_end or ():
        end()
    # Every restart of the last kill is done before the cancels go to the API.
    wait_until(lambda: all(p.process.poll() is None for p in supervisor.slots), 30, "restarts")
    wait_until(lambda: _answers(api), 30, "the API after the last restart")
    phases.mark("last fault, restarts")
    load.stop_submitting()
    # A cron run the cancel catches unstarted is judged cancelled by design only if it fell due
    # within the cancel boundary: so the fleet first works off the backlog the faults left.
    unfinished = "status IN ('scheduled', 'queued', 'running')"
    backlog = f"{unfinished} AND scheduled_for < {{now}} - {int(CANCEL_PHASE * 1e6)}"
    _drain(
        db, lambda: backlog.format(now=int(time.time() * 1e6)),
        "the backlog to be worked off before the cancel",
    )  # fmt: skip
    phases.mark("backlog")
    load.cancel_crons(CANCEL_PHASE)
    acks.close()
    _drain(db, lambda: unfinished, "every run to be final")
    seconds = time.monotonic() - began
    phases.mark("cancel, drain")
    supervisor.stop()
    caused = {e.pid for e in nemesis.timeline}
    exits = {r.died_pid: r.returncode for r in supervisor.restarts}
    for event in nemesis.timeline:
        event.exit_code = exits.get(event.pid)
    nemesis.write(artifacts / "timeline.json")  # again, with the victims' exit statuses
    deaths = [
        FaultEvent(
            "died",
            r.role,
            r.slot,
            r.died_pid,
            r.died_at,
            0,
            sorted(_held_at_death(db, r.died_pid, held_by)),
        )
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
        "stalls_recorded": stall_watch.stalls,
        "nemesis_errors": nemesis.errors,
        "python_loop_us": python_loop_us(),  # how fast the box was (bench/box.py)
        **config,
    }
    for add in reporters or ():
        add(report)
    report.metrics["faults_not_injected"] = len(nemesis.errors)
    report.checks["faults_not_injected"] = not nemesis.errors
    phases.mark("checker")
    report.config["phases"] = dict(phases.seconds)
    report.write(artifacts)
    return report


def _held_at_death(db: str, pid: int, held_by: Callable[[int], set[str]]) -> set[str]:
    """What a process that died by itself (a poison task took it down) held, found afterwards:
    the runs whose attempt by it the reaper ended as lost, and its ledger starts without an end."""
    lost = query(
        db, f"SELECT execution_id FROM attempts WHERE outcome = 'lost' AND worker LIKE '%-{pid}-%'"
    )
    return held_by(pid) | {row[0] for row in lost}


def _drain(db: str, where: Callable[[], str], what: str) -> None:
    """Wait until no execution matches ``where``, for as long as their count keeps reaching new
    lows: a fleet that fell behind (an hour of N1 on a busy box) is given the time to catch up,
    and a verdict; one that stops making progress for ``DRAIN_TIMEOUT`` fails here, naming the
    first runs still waiting."""
    lowest, progress_at = None, time.monotonic()
    while True:
        try:
            left = int(query(db, f"SELECT count(*) FROM executions WHERE {where()}")[0][0])
        except psycopg.OperationalError:  # refused (too many clients on the shared server)
            left = None
        if left == 0:
            return
        if left is not None and (lowest is None or left < lowest):
            lowest, progress_at = left, time.monotonic()
        if time.monotonic() - progress_at > DRAIN_TIMEOUT:
            waiting = query(
                db,
                "SELECT id, job_id, status, scheduled_for, due_at, lease_owner, reason"
                f" FROM executions WHERE {where()} ORDER BY scheduled_for LIMIT 10",
            )
            raise AssertionError(
                f"no progress for {DRAIN_TIMEOUT}s waiting for {what} ({left} left): {waiting}"
            )
        time.sleep(0.2)


def _answers(api: str) -> bool:
    try:
        return httpx.get(f"{api}/tasks", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
