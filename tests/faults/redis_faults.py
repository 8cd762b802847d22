"""S5's Redis faults, one after another, on the fleet's private ``redis-server``:

(a) ``kill -9`` and a start again with ``appendonly yes, appendfsync everysec`` (it reloads its
AOF, which may lack the last second); (b) ``SHUTDOWN NOSAVE`` and a start with persistence off
(empty); (c) ``FLUSHALL`` (up, empty); (d) ``kill -STOP`` for 10 s, then ``kill -CONT``.

What is measured besides the checker's metrics:

- **rebuild time** of the delay queue after each fault: from the fault's end (the server
  answering again; the flush done) to the first moment every run that the store said was
  ``queued`` when the fault began, and still says is ``queued``, is held by the delay queue again:
  in Redis (``P:{<shard>}:items``, the shard's truth, see ``onbeat.queue.redis_layout``) or in
  the failover queue's PostgreSQL table. Bound: ``sweep_interval`` + 1 s (issue 8, item 5).
  A run counts as missing when two looks ``LOOK_APART`` apart both find it so: a worker that
  took it from the queue and has not claimed it in the store yet (milliseconds; more on a busy
  box) holds it, it is not lost. The rebuild is done at the end of the first look that finds
  nothing missing, or of the second look of the first pair that finds nothing missing at both
  (late by up to ``LOOK_APART`` and a look's own time: against onbeat, never for it).
- **start delay while Redis is down** (a, b, d: from the fault to its end): p99 ≤ 2 s, the
  failover to the table queue (``onbeat.queue.failover``) keeps runs starting.
- **the API keeps serving**: ``GET /jobs?limit=1`` ten times a second throughout; 5xx answers
  other than 503 must be 0. Cut connections are reported (``probe_cut``, with why in the
  report): on a busy box a keep-alive connection the server closes as the client reuses it
  shows up there too.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
import redis

from tests.faults.api_probe import ApiProbe
from tests.faults.checker import Report, percentile, read_ledgers, read_runs
from tests.faults.fleet import attempts_of
from tests.faults.nemesis import FaultEvent, PlannedFault, ServiceFault
from tests.faults.process import wait_until

if TYPE_CHECKING:
    from tests.faults.runner import FleetContext

RESTART_AOF = "redis restart (AOF)"
SHUTDOWN_NOSAVE = "redis SHUTDOWN NOSAVE"
FLUSHALL = "redis FLUSHALL"
PAUSE = "redis kill -STOP"
DOWN = (RESTART_AOF, SHUTDOWN_NOSAVE, PAUSE)
"""The faults during which Redis does not answer."""
DOWN_FOR = 1.0
"""Seconds the server stays down in (a) and (b), as a supervisor restarting it would take."""
PAUSE_FOR = 10.0
REBUILD_LIMIT = 20.0
"""Seconds the rebuild is watched for before it counts as never done."""
REDIS_DOWN_START_DELAY_P99 = 2.0
LOOK_APART = 0.25
"""Seconds between two looks at the queues: a run missing at both is missing, not being claimed."""
QUEUE_PREFIX = "onbeat"
QUEUED_READ_TRIES = 3
"""Connections tried to read the queued runs before a fault (1 s apart)."""
"""The fleet's queue URL names no prefix: the default one."""
FALLBACK_TABLE = "onbeat_queue"
REDIS_FAULTS = [(RESTART_AOF, DOWN_FOR), (SHUTDOWN_NOSAVE, DOWN_FOR), (FLUSHALL, 0.0)]
REDIS_FAULTS.append((PAUSE, PAUSE_FOR))
"""(a)-(d) as (kind, lasts)."""


def redis_plan(_seed: int, _slots: list[int], duration: float) -> list[PlannedFault]:
    """(a)-(d), 10 s apart, the first 6 s into the load (the fleet is busy by then)."""
    plan = [
        PlannedFault(6.0 + 10.0 * i, kind, lasts=lasts)
        for i, (kind, lasts) in enumerate(REDIS_FAULTS)
    ]
    assert plan[-1].offset + plan[-1].lasts < duration, "the load must outlast the faults"
    return plan


@dataclass
class RedisFaults:
    """The S5 service faults on ``context.redis``, the probe, and S5's metrics."""

    context: FleetContext
    sweep_interval: float
    probe_prefix: str = "probe_"
    """Names the probe's metrics (apart from another scenario part's probe: N1)."""
    probe: ApiProbe = field(init=False)
    events: list[FaultEvent] = field(default_factory=list)
    rebuild_trace: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    """Per fault (its index in ``events``): (seconds after its end, runs still missing) at each
    look, for the report."""
    missing_sample: dict[int, list[str]] = field(default_factory=dict)
    """Per fault (index): a few runs still missing at the third look, to follow up in the logs."""
    load_at_end: dict[int, float] = field(default_factory=dict)
    """Per fault (index): the box's 1-minute load average when the rebuild began: a slow
    rebuild on a loaded box (CI) reads differently from one on a quiet box."""

    def __post_init__(self) -> None:
        self.probe = ApiProbe(self.context.api, lambda _i: ("GET", "/jobs?limit=1", None))

    def services(self) -> dict[str, ServiceFault]:
        """Turns the AOF on (for (a)), starts the probe, and hands the runner the faults."""
        server = self.context.redis
        server.cli("CONFIG", "SET", "appendfsync", "everysec")
        server.cli("CONFIG", "SET", "appendonly", "yes")

        def aof_written() -> bool:
            info = server.cli("INFO", "persistence")
            return "aof_enabled:1" in info and "aof_rewrite_in_progress:0" in info

        wait_until(aof_written, 30, "Redis's first AOF rewrite")
        self.probe.start()
        self.context.at_load_end.append(self._stop_probe)
        self.context.reporters.append(self.report)
        return {
            RESTART_AOF: self._restart_aof,
            SHUTDOWN_NOSAVE: self._shutdown_nosave,
            FLUSHALL: self._flushall,
            PAUSE: self._pause,
        }

    def _stop_probe(self) -> None:
        self.probe.stop()
        self.probe.write(self.context.artifacts / "probe-redis.jsonl")

    def _begin(self, fault: PlannedFault) -> tuple[FaultEvent, set[str]]:
        process = self.context.redis.process
        assert process is not None
        queued = self._queued()
        event = FaultEvent(fault.kind, "redis", -1, process.pid, time.time(), time.monotonic_ns())
        self.events.append(event)
        return event, queued

    def _restart_aof(self, fault: PlannedFault) -> FaultEvent:
        event, queued = self._begin(fault)
        self.context.redis.kill()
        time.sleep(fault.lasts)  # down: the outage itself
        event.ended = self.context.redis.start(appendonly=True)
        event.recovered = self._rebuilt(event, queued)
        return event

    def _shutdown_nosave(self, fault: PlannedFault) -> FaultEvent:
        event, queued = self._begin(fault)
        server = self.context.redis
        assert server.process is not None
        server.cli("SHUTDOWN", "NOSAVE")
        server.process.wait()
        time.sleep(fault.lasts)
        event.ended = server.start(appendonly=False)
        event.recovered = self._rebuilt(event, queued)
        return event

    def _flushall(self, fault: PlannedFault) -> FaultEvent:
        event, queued = self._begin(fault)
        self.context.redis.cli("FLUSHALL")
        event.ended = time.time()
        event.recovered = self._rebuilt(event, queued)
        return event

    def _pause(self, fault: PlannedFault) -> FaultEvent:
        event, _ = self._begin(fault)
        process = self.context.redis.process
        assert process is not None
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(fault.lasts)
        finally:
            process.send_signal(signal.SIGCONT)
        event.ended = time.time()
        return event

    # -- the rebuild ---------------------------------------------------------------------------

    def _queued(self) -> set[str]:
        """The runs queued now. Tried for up to ``QUEUED_READ_TRIES`` connections: N1's nemesis
        once found the server taking more than its 5 s connect timeout 20 s after a crash."""
        for attempt in range(1, QUEUED_READ_TRIES + 1):
            try:
                with psycopg.connect(self.context.database_url) as conn:
                    rows = conn.execute("SELECT id FROM executions WHERE status = 'queued'")
                    return {row[0] for row in rows}
            except psycopg.OperationalError:
                if attempt == QUEUED_READ_TRIES:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def _missing(
        self, conn: psycopg.Connection[Any], client: redis.Redis, runs: set[str]
    ) -> set[str]:
        """Of ``runs``, those the store says are queued and neither queue holds."""
        rows = conn.execute(  # runs: the hot table (a queued run is never in the history)
            "SELECT id, shard FROM runs WHERE status = 'queued' AND id = ANY(%s)", (list(runs),)
        ).fetchall()
        if not rows:
            return set()
        in_table: set[str] = set()
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (FALLBACK_TABLE,)).fetchone()
        if exists is not None and exists[0]:
            table = conn.execute(
                f"SELECT execution_id FROM {FALLBACK_TABLE} WHERE execution_id = ANY(%s)",
                ([r[0] for r in rows],),
            )
            in_table = {r[0] for r in table.fetchall()}
        pipe = client.pipeline(transaction=False)
        for eid, shard in rows:
            pipe.hexists(f"{QUEUE_PREFIX}:{{{shard}}}:items", eid)
        in_redis = {eid for (eid, _), held in zip(rows, pipe.execute(), strict=True) if held}
        return {eid for eid, _ in rows} - in_redis - in_table

    def _rebuilt(self, event: FaultEvent, queued: set[str]) -> float | None:
        """When every run of ``queued`` the store still calls queued was held again."""
        assert event.ended is not None
        index = next(i for i, e in enumerate(self.events) if e is event)
        trace = self.rebuild_trace.setdefault(index, [])
        self.load_at_end[index] = round(os.getloadavg()[0], 2)
        deadline = time.monotonic() + REBUILD_LIMIT
        client = redis.Redis(port=self.context.redis.port, socket_timeout=5)
        try:
            with psycopg.connect(self.context.database_url, autocommit=True) as conn:
                previous: set[str] | None = None
                while True:
                    missing = self._missing(conn, client, queued)
                    # Missing at two looks in a row (not a claim under way), or at the first.
                    lacking = missing if previous is None else previous & missing
                    trace.append((round(time.time() - event.ended, 3), len(lacking)))
                    if not lacking:
                        return time.time()
                    if len(trace) == 3:
                        self.missing_sample[index] = sorted(lacking)[:5]
                    if time.monotonic() >= deadline:
                        return None
                    time.sleep(LOOK_APART)
                    previous = missing
        finally:
            client.close()

    # -- S5's metrics ----------------------------------------------------------------------------

    def report(self, report: Report) -> None:
        windows = [(e.wall, e.recovered or e.ended or e.wall) for e in self.events]
        prefix = self.probe_prefix
        report.metrics |= self.probe.metrics(windows, prefix)
        report.config[f"{prefix}cuts"] = self.probe.cuts()
        report.checks[f"{prefix}5xx_other"] = report.metrics[f"{prefix}5xx_other"] == 0
        bound = self.sweep_interval + 1
        rebuilds: dict[str, Any] = {}
        for event in self.events:  # a kind struck again (N1): its slowest rebuild, every one bound
            if event.fault == PAUSE:
                continue
            name = "rebuild_s_" + event.fault.split()[-1].strip("()").lower()
            took = (
                None
                if event.recovered is None or event.ended is None
                else (event.recovered - event.ended)
            )
            if took is None or rebuilds.get(name) == "never":
                rebuilds[name] = "never"
            else:
                rebuilds[name] = max(took, rebuilds.get(name, took))
            report.checks[name] = rebuilds[name] != "never" and rebuilds[name] <= bound
        report.metrics |= rebuilds | {"rebuild_bound_s": bound}
        by_fault = self._down_delays()
        delays = [delay for runs in by_fault.values() for delay, _ in runs]
        report.metrics |= {
            "redis_down_runs": len(delays),
            "redis_down_start_delay_p50": percentile(delays, 0.5),
            "redis_down_start_delay_p99": percentile(delays, 0.99),
            "redis_down_start_delay_max": max(delays, default=0.0),
        }
        report.checks["redis_down_start_delay_p99"] = (
            report.metrics["redis_down_start_delay_p99"] <= REDIS_DOWN_START_DELAY_P99
        )
        report.config["redis_faults"] = [
            {"fault": e.fault, "wall": e.wall, "ended": e.ended, "recovered": e.recovered,
             "rebuild_trace": self.rebuild_trace.get(i, []),
             "load_at_end": self.load_at_end.get(i),
             "schedulers_heard_s": self._heard_after(e),
             "down_start_delays": _delay_summary(by_fault[i]) if i in by_fault else None,
             "missing_sample": [attempts_of(self.context.database_url, eid)
                                for eid in self.missing_sample.get(i, [])]}
            for i, e in enumerate(self.events)
        ]  # fmt: skip

    def _heard_after(self, event: FaultEvent) -> dict[str, float | None]:
        """Per scheduler: seconds from the fault's end to its first log line saying the queue is
        back or lost its data, the start of its refill (None: no such line). With the rebuild
        trace it tells a late detection from a slow sweep."""
        heard: dict[str, float | None] = {}
        if event.ended is None:
            return heard
        for path in sorted(self.context.fleet.logs.glob("scheduler-*.log")):
            heard[path.stem] = None
            for line in path.read_text(errors="replace").splitlines():
                if "lost its data" not in line and "is back" not in line:
                    continue
                try:
                    at = datetime.fromisoformat(json.loads(line)["time"]).timestamp()
                except (ValueError, KeyError, TypeError):
                    continue
                if at >= event.ended - 0.05:
                    heard[path.stem] = round(at - event.ended, 3)
                    break
        return heard

    def _down_delays(self) -> dict[int, list[tuple[float, str]]]:
        """Per fault (its index) during which Redis was down (a, b, d): (first-start delay, run
        id) of each run due meanwhile."""
        down = {
            i: (e.wall, e.ended or e.wall) for i, e in enumerate(self.events) if e.fault in DOWN
        }
        firsts: dict[str, float] = {}
        for entry in read_ledgers(self.context.artifacts / "ledger"):
            if entry["event"] == "start":
                eid, wall = entry["execution_id"], entry["wall_ns"] / 1e9
                firsts[eid] = min(wall, firsts.get(eid, wall))
        delays: dict[int, list[tuple[float, str]]] = {}
        for run in read_runs(self.context.database_url):
            due = run.scheduled_for.timestamp()
            if run.id not in firsts:
                continue
            for i, (lo, hi) in down.items():
                if lo <= due <= hi:
                    delays.setdefault(i, []).append((firsts[run.id] - due, run.id))
        return delays


def _delay_summary(runs: list[tuple[float, str]]) -> dict[str, Any]:
    """One fault's start delays, for the report: how many, p99, and the latest runs by id (to
    follow up in the logs)."""
    delays = [delay for delay, _ in runs]
    latest = sorted(runs, reverse=True)[:3]
    return {
        "runs": len(runs),
        "p99": percentile(delays, 0.99),
        "latest": [{"execution_id": eid, "delay": round(delay, 3)} for delay, eid in latest],
    }


def redis_services(context: FleetContext, probe_prefix: str = "probe_") -> dict[str, ServiceFault]:
    sweep_interval = float(context.fleet.env["ONBEAT_SWEEP_INTERVAL"])
    return RedisFaults(context, sweep_interval, probe_prefix).services()
