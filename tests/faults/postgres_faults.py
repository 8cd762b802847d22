"""S6's PostgreSQL faults, one after another, on the scenario's own cluster
(``postgres_cluster.PrivatePostgres``; the shared server is never touched):

(a) ``pg_ctl restart -m fast``; (b) ``pg_ctl stop -m immediate`` and a start (crash recovery);
(c) ``pg_terminate_backend`` on every session of the fleet (``fleet.terminate_backends``: they
share one ``application_name``; the API's go too); (d) ``LOCK TABLE runs IN ACCESS EXCLUSIVE
MODE`` held for the run lease TTL + 1 s: ``runs`` is the hot table (``executions`` is a view over
it and ``execution_history``), so claims, heartbeats and outcomes all block on it. A worker merely
blocked must not lose its lease: leases are measured in the database's time, and a heartbeat that
waits on the lock renews on the clock it commits at.

What is measured besides the checker's metrics (pass lines: ``acked_missing``, ``runs_lost``,
``false_rescues`` there):

- **an API probe**: a create (``POST /jobs``, a once job of ``work``) ten times a second with an
  ``Idempotency-Key`` per create, sent again with the same key on a 503 or a cut connection.
  Pass: every answer is a 2xx or a 503 carrying ``Retry-After``, never another 5xx (cut
  connections are reported, ``probe_cut``, and retried); no create given up; one job per key (``probe_dup_creates`` = 0; each
  create's ``at`` is unique to its key, so jobs are told apart by it). Its acknowledged creates
  go to the load's ack log, so the checker proves each stored and its run done.
- **reconnection time** per fault: from its end (the server answering again, the lock released)
  to the first successful create, and to the first run started (a ledger start line).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from tests.faults.api_probe import ApiProbe
from tests.faults.checker import Report, read_ledgers
from tests.faults.fleet import terminate_backends
from tests.faults.loadgen import AckLog
from tests.faults.nemesis import FaultEvent, PlannedFault, ServiceFault

if TYPE_CHECKING:
    from tests.faults.postgres_cluster import PrivatePostgres
    from tests.faults.runner import FleetContext

RESTART_FAST = "pg restart -m fast"
CRASH = "pg stop -m immediate + start"
TERMINATE = "pg_terminate_backend (fleet)"
LOCK = "LOCK TABLE runs (ACCESS EXCLUSIVE)"
PROBE_DURATION = 0.0105
"""The probe's jobs' ``duration`` param: no load job has exactly this one."""
PROBE_DUE_AFTER = 1.0
"""A probe job is due this long after its slot (its index / rate)."""


def postgres_faults(lock_for: float) -> list[tuple[str, float]]:
    """(a)-(d) as (kind, lasts); the lock held ``lock_for`` seconds."""
    return [(RESTART_FAST, 0.0), (CRASH, 0.0), (TERMINATE, 0.0), (LOCK, lock_for)]


def postgres_plan(lock_for: float) -> Callable[[int, list[int], float], list[PlannedFault]]:
    """(a)-(d), 9 s apart from 6 s into the load; the lock held ``lock_for`` seconds."""

    def plan(_seed: int, _slots: list[int], duration: float) -> list[PlannedFault]:
        planned = [
            PlannedFault(6.0 + 9.0 * i, kind, lasts=lasts)
            for i, (kind, lasts) in enumerate(postgres_faults(lock_for))
        ]
        assert planned[-1].offset + planned[-1].lasts + 5 < duration, "the load must outlast them"
        return planned

    return plan


@dataclass
class PostgresFaults:
    """The S6 service faults on ``context.postgres``, the create probe, and S6's metrics."""

    context: FleetContext
    probe_prefix: str = "probe_"
    """Names the probe's metrics (apart from another scenario part's probe: N1)."""
    probe: ApiProbe = field(init=False)
    events: list[FaultEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.began = datetime.now(UTC)
        self.acks = AckLog(self.context.artifacts / "acks.jsonl")  # the load's, appended to
        self.probe = ApiProbe(
            self.context.api,
            self._create,
            key_prefix=f"probe-{int(time.time())}-",
            on_ack=lambda job: self.acks.record(job, "once", at=job["schedule"]["at"]),
        )

    @property
    def cluster(self) -> PrivatePostgres:
        assert self.context.postgres is not None, "S6 runs on a private cluster"
        return self.context.postgres

    def _create(self, index: int) -> tuple[str, str, dict[str, Any]]:
        at = self.began + timedelta(seconds=index / self.probe.rate + PROBE_DUE_AFTER)
        body = {
            "task": "work",
            "params": {"duration": PROBE_DURATION},
            "schedule": {"type": "once", "at": at.isoformat()},
        }
        return "POST", "/jobs", body

    def services(self) -> dict[str, ServiceFault]:
        self.probe.start()
        self.context.at_load_end.append(self._stop_probe)
        self.context.reporters.append(self.report)
        return {
            RESTART_FAST: self._restart_fast,
            CRASH: self._crash,
            TERMINATE: self._terminate,
            LOCK: self._lock,
        }

    def _stop_probe(self) -> None:
        """Before the drain: its creates are acknowledged jobs the checker follows."""
        self.probe.stop()
        self.probe.write(self.context.artifacts / "probe-postgres.jsonl")
        self.acks.close()

    def _begin(self, fault: PlannedFault) -> FaultEvent:
        event = FaultEvent(fault.kind, "postgres", -1, 0, time.time(), time.monotonic_ns())
        self.events.append(event)
        return event

    def _restart_fast(self, fault: PlannedFault) -> FaultEvent:
        event = self._begin(fault)
        self.cluster.pg_ctl("restart", "-m", "fast")
        event.ended = self._answering()
        return event

    def _crash(self, fault: PlannedFault) -> FaultEvent:
        event = self._begin(fault)
        self.cluster.pg_ctl("stop", "-m", "immediate")
        self.cluster.pg_ctl("start")
        event.ended = self._answering()
        return event

    def _terminate(self, fault: PlannedFault) -> FaultEvent:
        event = self._begin(fault)
        url = self.context.fleet.env["ONBEAT_DATABASE_URL"]
        app_name = parse_qs(urlsplit(url).query)["application_name"][0]
        terminated = terminate_backends(self.cluster.url, [app_name])
        event.held = [f"{terminated} sessions"]  # what it hit, for the timeline (no run ids)
        event.ended = time.time()
        return event

    def _lock(self, fault: PlannedFault) -> FaultEvent:
        event = self._begin(fault)  # queued behind it, the fleet's statements wait from here on
        with psycopg.connect(self.context.database_url) as conn:
            conn.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            time.sleep(fault.lasts)
            conn.rollback()
        event.ended = time.time()
        return event

    def _answering(self) -> float:
        """Wall time the server answered a query again (``pg_ctl -w`` returned before)."""
        while not self.cluster.answers():
            time.sleep(0.02)
        return time.time()

    # -- S6's metrics --------------------------------------------------------------------------

    def report(self, report: Report) -> None:
        windows = [(e.wall, (e.ended or e.wall) + 1.0) for e in self.events]
        prefix = self.probe_prefix
        metrics = self.probe.metrics(windows, prefix)
        db = self.context.database_url
        jobs = _rows(
            db,
            "SELECT id, schedule_at FROM jobs WHERE (params::jsonb ->> 'duration')::float = %s",
            (PROBE_DURATION,),
        )
        per_at: dict[int, int] = {}
        for _, at in jobs:
            per_at[at] = per_at.get(at, 0) + 1
        metrics |= {
            f"{prefix}creates_acked": len(self.probe.acked),
            f"{prefix}creates_failed": len(self.probe.failed),
            f"{prefix}dup_creates": sum(n - 1 for n in per_at.values()),
        }
        starts = sorted(
            entry["wall"]
            for entry in read_ledgers(self.context.artifacts / "ledger")
            if entry["event"] == "start"
        )
        for event in self.events:  # a kind struck again (N1): its slowest reconnection
            name = event.fault.split()[0] + "_" + event.fault.split()[-1].strip("()").lower()
            for key, took in self._reconnection(name.replace("-", ""), event, starts).items():
                if key not in metrics:
                    metrics[key] = took
                elif took is None or metrics[key] is None:
                    metrics[key] = None  # never reconnected after one of them
                else:
                    metrics[key] = max(took, metrics[key])
        report.metrics |= metrics
        for key in ("5xx_other", "503_no_retry_after", "creates_failed", "dup_creates"):
            report.checks[prefix + key] = metrics[prefix + key] == 0
        report.config[f"{prefix}cuts"] = self.probe.cuts()
        report.config["postgres_faults"] = [
            {"fault": e.fault, "wall": e.wall, "ended": e.ended, "held": e.held}
            for e in self.events
        ]

    def _reconnection(
        self, name: str, event: FaultEvent, starts: list[float]
    ) -> dict[str, float | None]:
        """Fault end -> first create, first run started (``starts``: the ledger's, sorted)."""
        end = event.ended or event.wall
        create = self.probe.first_ok_after(end)
        first = bisect.bisect_left(starts, end)
        return {
            f"reconnect_create_s_{name}": None if create is None else round(create - end, 3),
            f"reconnect_start_s_{name}": (
                round(starts[first] - end, 3) if first < len(starts) else None
            ),
        }


def _rows(database_url: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, params).fetchall()


def postgres_services(
    context: FleetContext, probe_prefix: str = "probe_"
) -> dict[str, ServiceFault]:
    return PostgresFaults(context, probe_prefix).services()
