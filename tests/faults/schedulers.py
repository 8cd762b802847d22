"""S4's faults and measurements: scheduler failover and a zombie scheduler.

The faults pick their victim when they strike, from ``shard_leases``: the living scheduler holding
the most shards, ``kill -9`` (the supervisor restarts it after 1 s) or ``kill -STOP`` and
``kill -CONT`` after ``lasts`` (a zombie: it wakes believing it holds its old leases). Either then polls the leases
every 50 ms until every shard is leased by a scheduler other than the victim: ``recovered`` on
the fault's event, and ``t_takeover`` = recovered - fault.

A zombie must not materialise with a stale epoch. onbeat does not write the epoch on the run:
its fence is ``_fenced_shards``, which re-reads the writer's own lease rows ``FOR KEY SHARE`` inside
the dispatch transaction (a takeover cannot commit until that transaction ends, and after it the
re-read finds the shard gone). So the suite checks the fence itself, in the database: a trigger
(``install_materialisation_audit``, installed in S4's schema only) records every write that
materialises a run outside the API's job creation (a scheduled run inserted, or marked queued)
and whether its transaction held the lock on the shard's lease row at that moment. A write
without it is a materialisation no current lease fenced: ``stale_epoch_accepted``. A zombie
frozen inside a transaction finds that transaction ended by the server when it wakes (the store's
``idle_in_transaction_session_timeout``): its scheduler logs the pass as failed, counted as
``scheduler_passes_failed``."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from tests.faults.checker import percentile, query
from tests.faults.fleet import shard_count, shard_holders
from tests.faults.nemesis import FaultEvent, PlannedFault, ServiceFault
from tests.faults.oracle import RunRecord

if TYPE_CHECKING:
    from tests.faults.runner import FleetContext

KILL = "scheduler kill -9"
PAUSE = "scheduler kill -STOP"
TAKEOVER_FAULTS = (KILL, PAUSE)
POLL = 0.05
"""Seconds between two reads of ``shard_leases`` while waiting for the takeover."""
PLAN = ((5.5, KILL), (15.5, KILL), (25.5, PAUSE))
"""S4's faults: (seconds after the load starts, on a 10 s mark, before the seed's jitter; kind)."""
GIVE_UP = 30.0
"""A takeover not seen this long after the fault is reported as never (``recovered`` None)."""

AUDIT_SQL = """
CREATE TABLE faults_materialisations (
    run_id  TEXT NOT NULL,
    shard   INTEGER NOT NULL,
    op      TEXT NOT NULL,
    fenced  BOOLEAN NOT NULL,
    owner   TEXT,
    epoch   BIGINT
);
CREATE FUNCTION faults_audit_materialisation() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    me xid := pg_current_xact_id()::xid;
    lease record;
    held boolean;
BEGIN
    IF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM jobs WHERE id = NEW.job_id AND xmin = me) THEN
        RETURN NULL;  -- a job's first run, inserted with the job by the API: no shard lease
    END IF;
    SELECT owner, epoch, xmax INTO lease FROM shard_leases WHERE shard = NEW.shard;
    held := lease.xmax = me;
    IF NOT held AND lease.xmax::text <> '0' THEN
        BEGIN  -- several lockers share the row: xmax is a multixact
            held := me IN (SELECT xid FROM pg_get_multixact_members(lease.xmax));
        EXCEPTION WHEN OTHERS THEN
            held := false;
        END;
    END IF;
    INSERT INTO faults_materialisations VALUES
        (NEW.id, NEW.shard, TG_OP, held, lease.owner, lease.epoch);
    RETURN NULL;
END $$;
CREATE TRIGGER faults_audit_insert AFTER INSERT ON runs FOR EACH ROW
    WHEN (NEW.trigger = 'schedule') EXECUTE FUNCTION faults_audit_materialisation();
CREATE TRIGGER faults_audit_queue AFTER UPDATE ON runs FOR EACH ROW
    WHEN (OLD.status = 'scheduled' AND NEW.status = 'queued')
    EXECUTE FUNCTION faults_audit_materialisation();
"""
"""The scheduler's materialising writes are the inserts of scheduled runs (dispatch's next runs,
the reconciler's repairs) and ``scheduled -> queued``; nothing else makes either."""


def install_materialisation_audit(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(AUDIT_SQL)


def pid_of(owner: str) -> int:
    """The process of a scheduler's owner name ``scheduler-<host>-<pid>-<hex>``."""
    return int(owner.split("-")[-2])


class SchedulerFaults:
    """S4's service faults on the fleet of ``context``."""

    def __init__(self, context: FleetContext) -> None:
        self.context = context
        self.shards = shard_count(context.database_url)

    def services(self) -> dict[str, ServiceFault]:
        return {KILL: self.kill, PAUSE: self.pause}

    def kill(self, fault: PlannedFault) -> FaultEvent:
        event = self._strike(fault.kind, signal.SIGKILL)
        self.context.supervisor.proc(event.slot).process.wait()
        event.recovered = self._await_takeover(event.pid, event.wall + GIVE_UP)
        return event

    def pause(self, fault: PlannedFault) -> FaultEvent:
        event = self._strike(fault.kind, signal.SIGSTOP)
        resume_at = event.wall + fault.lasts
        event.recovered = self._await_takeover(event.pid, resume_at)
        if event.recovered is None:
            self._write_sessions(event)
        time.sleep(max(0.0, resume_at - time.time()))
        self.context.supervisor.proc(event.slot).process.send_signal(signal.SIGCONT)
        event.ended = time.time()
        return event

    def _strike(self, kind: str, sig: signal.Signals) -> FaultEvent:
        """Signal the living scheduler that holds the most shards now."""
        holders = self._holders(time.time() + GIVE_UP)
        assert holders is not None, "shard_leases could not be read"
        held = Counter(pid_of(owner) for owner in holders.values())
        supervisor = self.context.supervisor
        candidates = [
            slot
            for slot in supervisor.slots_of("scheduler")
            if supervisor.proc(slot).process.poll() is None
        ]
        assert candidates, f"no living scheduler to {kind}"
        slot = max(candidates, key=lambda s: held[supervisor.proc(s).pid])
        proc = supervisor.proc(slot)
        shards = sorted(shard for shard, owner in holders.items() if pid_of(owner) == proc.pid)
        event = FaultEvent(kind, "scheduler", slot, proc.pid, time.time(), time.monotonic_ns())
        event.shards = shards
        proc.process.send_signal(sig)
        return event

    def _write_sessions(self, event: FaultEvent) -> None:
        """What the fleet's database sessions were doing when a takeover did not come."""
        rows = query(
            self.context.fleet.env["ONBEAT_DATABASE_URL"],  # under the fleet's application_name
            "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid),"
            " round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 2), left(query, 300)"
            " FROM pg_stat_activity WHERE application_name = current_setting('application_name')"
            " AND pid <> pg_backend_pid() AND state <> 'idle' ORDER BY xact_start",
        )
        path = self.context.artifacts / f"no-takeover-{event.fault.split()[-1]}-{event.pid}.txt"
        path.write_text("\n".join(" | ".join(map(str, row)) for row in rows) + "\n")

    def _await_takeover(self, victim: int, deadline: float) -> float | None:
        """The wall time every shard is first seen leased by a scheduler other than ``victim``
        (None: not by ``deadline``)."""
        while (holders := self._holders(deadline)) is not None:
            if len(holders) == self.shards and all(pid_of(o) != victim for o in holders.values()):
                return time.time()
            time.sleep(POLL)
        return None

    def _holders(self, deadline: float) -> dict[int, str] | None:
        """``shard_holders``, asked again while the shared server refuses connections (too many
        clients while other suites run); None once ``deadline`` has passed."""
        while time.time() < deadline:
            try:
                return shard_holders(self.context.database_url)
            except psycopg.OperationalError:
                time.sleep(POLL)
        return None


def scheduler_services(context: FleetContext) -> dict[str, ServiceFault]:
    """S4's service faults, once the materialisation audit is in the fleet's schema."""
    install_materialisation_audit(context.database_url)
    return SchedulerFaults(context).services()


def takeover_plan(
    seed: int, _slots: list[int], _duration: float, pause: float
) -> list[PlannedFault]:
    """kill -9 the busiest scheduler twice, then kill -STOP another for ``pause`` seconds: each
    fault at 5.5-5.9 s past a 10 s mark of the load (it starts on one, ``Scenario.starts_at``),
    so the next every-10-s fire is past the window the victim dispatched before it was hit
    (``ONBEAT_WINDOW``, 4 s) and must be dispatched by the scheduler that takes its shard over."""
    jitter = (seed % 5) / 10
    return [
        PlannedFault(at + jitter, kind, lasts=pause if kind == PAUSE else 0.0) for at, kind in PLAN
    ]


def takeover_report(
    database_url: str,
    events: Sequence[FaultEvent],
    runs: Sequence[RunRecord],
    first_starts: dict[str, float],
    bound: float,
    logs: Path | None,
) -> tuple[dict[str, Any], dict[str, bool], dict[str, Any]]:
    """Metrics, checks and details of the scheduler faults in ``events``: ``t_takeover`` per fault
    (bound: shard TTL + 2 s), the start delay of the fires due in the victim's shards between the
    fault and the takeover (p99 bound the same), and the materialisation audit."""
    faults = [e for e in events if e.fault in TAKEOVER_FAULTS]
    takeovers = [None if e.recovered is None else e.recovered - e.wall for e in faults]
    per_fault: list[list[float]] = []
    for event in faults:
        shards = set(event.shards)
        until = event.recovered if event.recovered is not None else event.wall + bound
        per_fault.append(
            [
                first_starts[run.id] - run.scheduled_for.timestamp()
                for run in runs
                if run.shard in shards
                and event.wall <= run.scheduled_for.timestamp() <= until
                and run.id in first_starts
            ]
        )
    delays = [delay for fault_delays in per_fault for delay in fault_delays]
    audit = query(
        database_url,
        "SELECT count(*), count(*) FILTER (WHERE NOT fenced) FROM faults_materialisations",
    )[0]
    unfenced = query(
        database_url,
        "SELECT run_id, shard, op, owner, epoch FROM faults_materialisations WHERE NOT fenced"
        " LIMIT 20",
    )
    measured = [t for t in takeovers if t is not None]
    metrics: dict[str, Any] = {
        "scheduler_faults": len(faults),
        "t_takeover_max": max(measured, default=0.0),
        "failover_window_runs": len(delays),
        "failover_start_delay_p50": percentile(delays, 0.5),
        "failover_start_delay_p99": percentile(delays, 0.99),
        "failover_start_delay_max": max(delays, default=0.0),
        "materialisations_audited": int(audit[0]),
        "stale_epoch_accepted": int(audit[1]),
        "scheduler_passes_failed": sum(
            "pass failed" in line
            for path in (logs.glob("scheduler-*.log") if logs else [])
            for line in path.read_text(errors="replace").splitlines()
        ),
    }
    checks = {
        "scheduler_faults": len(faults) == len(PLAN),
        "t_takeover_max": len(measured) == len(faults) and metrics["t_takeover_max"] <= bound,
        "failover_start_delay_p99": metrics["failover_start_delay_p99"] <= bound,
        "materialisations_audited": metrics["materialisations_audited"] > 0,
        "stale_epoch_accepted": metrics["stale_epoch_accepted"] == 0,
    }
    details = {
        "t_takeover": [
            {
                "fault": e.fault,
                "slot": e.slot,
                "shards": len(e.shards),
                "seconds": t,
                "window_runs": len(d),
                "window_delay_p99": percentile(d, 0.99),
            }
            for e, t, d in zip(faults, takeovers, per_fault, strict=True)
        ],
        "unfenced_materialisations": [list(row) for row in unfenced],
    }
    return metrics, checks, details
