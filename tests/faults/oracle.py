"""The independent oracle of ``test_fleet_faults``: which runs the submitted load planned, worked
out without onbeat's cron engine, and what the store's records and the ledger say became of them.

A cron job plans every fire time strictly after its creation and up to its cancel instant (both
as the API answered them), its expression known to the oracle as a period (``CRON_PERIODS``, UTC:
an every-N-seconds expression fires at the Unix instants divisible by N); a now or once job plans
its one run. A planned
run is *lost* unless the store holds a final record of it and the ledger a start line. A cron
run the cancel caught before it started is cancelled by design: it is not lost if it fell due
at most ``boundary`` before the cancel (else it should have started, and is counted lost).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg

JobKind = Literal["now", "once", "cron"]
FINAL = frozenset({"succeeded", "failed", "cancelled", "skipped"})


CRON_PERIODS = {
    "* * * * * *": 1,
    "*/10 * * * * *": 10,
    "0 * * * * *": 60,
    "* * * * *": 60,
}
"""The cron expressions the load submits, in UTC, written out by hand as the period in seconds of
their fire instants (all start at second 0 of the minute, and a UTC minute starts at a Unix time
divisible by 60): the oracle never parses an expression."""


@dataclass(frozen=True, slots=True)
class SubmittedJob:
    id: str
    kind: JobKind
    created_at: datetime
    """As the API answered the POST: the store's clock at the insert."""
    at: datetime | None = None
    """A once job's fire time, as submitted."""
    cancelled_at: datetime | None = None
    """A cron job's cancel instant, as the API answered the DELETE."""
    policy: str | None = None
    """``"poison"``: a job whose task always fails; its run ends ``failed`` (dead-lettered) by
    the attempts policy, a recorded final state, not a loss. ``"blocks_loop"``: a job whose task
    blocks its worker's event loop; the runs that worker holds unstarted meanwhile are late by
    it, and the checker reports them apart from the baseline start delays."""
    expression: str = "* * * * * *"
    """A cron job's expression: one of ``CRON_PERIODS``."""

    def planned_fires(self) -> list[datetime] | None:
        """The fire times this job must have run at; None for a now job (one run, whenever the
        store says it was created)."""
        if self.kind == "now":
            return None
        if self.kind == "once":
            assert self.at is not None
            return [self.at]
        assert self.cancelled_at is not None, f"cron job {self.id} was never cancelled"
        period = CRON_PERIODS[self.expression]
        # Strictly after the creation, at or before the cancel, on the period's instants.
        first = (math.floor(self.created_at.timestamp()) // period + 1) * period
        last = math.floor(self.cancelled_at.timestamp())
        return [datetime.fromtimestamp(s, UTC) for s in range(first, last + 1, period)]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One execution row of the store."""

    id: str
    job_id: str
    shard: int
    scheduled_for: datetime
    trigger: str
    status: str


def read_runs(database_url: str) -> list[RunRecord]:
    """Every execution in the store, read with plain SQL (not through onbeat)."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT id, job_id, shard, scheduled_for, trigger, status FROM executions"
        ).fetchall()
    return [
        RunRecord(id, job_id, shard, _from_micros(scheduled_for), trigger, status)
        for id, job_id, shard, scheduled_for, trigger, status in rows
    ]


def _from_micros(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass
class Verdict:
    """What became of the planned runs."""

    planned: int = 0
    ran: list[RunRecord] = field(default_factory=list)
    """Planned runs with a succeeded record and a start line."""
    lost: list[str] = field(default_factory=list)
    """One line per planned run without a final record and a start line."""
    cancelled_at_boundary: int = 0
    unplanned: list[str] = field(default_factory=list)
    """Records of fire times the oracle did not plan and that were not cancelled unrun, or runs
    that started after their job's cancel."""


def judge(
    jobs: Sequence[SubmittedJob],
    runs: Iterable[RunRecord],
    starts: dict[str, list[float]],
    boundary: float,
) -> Verdict:
    """Hold every planned run of ``jobs`` against the store's ``runs`` and the ledger's
    ``starts`` (execution id -> wall times of its start lines)."""
    by_job: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    verdict = Verdict()
    for job in jobs:
        records = by_job.pop(job.id, [])
        fires = job.planned_fires()
        if fires is None:  # a now job: exactly one run, at its creation
            verdict.planned += 1
            if len(records) != 1:
                verdict.lost.append(f"now job {job.id}: {len(records)} records")
                continue
            _check_ran(job, records[0], starts, boundary, verdict)
            continue
        by_fire = {r.scheduled_for: r for r in records if r.trigger == "schedule"}
        if len(by_fire) != len(records):
            verdict.unplanned.append(f"job {job.id}: records of other triggers or twins")
        for fire in fires:
            verdict.planned += 1
            record = by_fire.pop(fire, None)
            if record is None:
                verdict.lost.append(f"{job.kind} job {job.id} at {fire}: no record")
            else:
                _check_ran(job, record, starts, boundary, verdict)
        for fire, record in sorted(by_fire.items()):
            after_cancel = job.cancelled_at is not None and fire > job.cancelled_at
            if not after_cancel or record.status != "cancelled" or record.id in starts:
                verdict.unplanned.append(f"{job.kind} job {job.id} at {fire}: {record.status}")
    verdict.unplanned += [f"job {job_id}: not submitted" for job_id in by_job]
    return verdict


def _check_ran(
    job: SubmittedJob,
    record: RunRecord,
    starts: dict[str, list[float]],
    boundary: float,
    verdict: Verdict,
) -> None:
    where = f"{job.kind} job {job.id} at {record.scheduled_for}"
    if record.status not in FINAL:
        verdict.lost.append(f"{where}: still {record.status}")
    elif record.status == "succeeded" and record.id in starts:
        verdict.ran.append(record)
    elif (
        record.status == "cancelled"
        and job.cancelled_at is not None
        and record.id not in starts
        and (job.cancelled_at - record.scheduled_for).total_seconds() <= boundary
    ):
        verdict.cancelled_at_boundary += 1
    else:
        started = "a start line" if record.id in starts else "no start line"
        verdict.lost.append(f"{where}: {record.status} with {started}")


def ledger_starts(entries: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    """Execution id -> the wall times of its start lines, in order."""
    starts: dict[str, list[float]] = defaultdict(list)
    for entry in entries:
        if entry["event"] == "start":
            starts[entry["execution_id"]].append(entry["wall"])
    return {eid: sorted(walls) for eid, walls in starts.items()}


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """A fault injected at ``start``: runs falling due in [start - LEAD, end] may be late
    because of it (``end``: ``start`` + the recovery bound). The runs it *hit* are those named
    in ``runs`` and those due in [start - LEAD, start + ``hit_for``] (in ``shards``, if given);
    the fault is recovered once all of them have started again."""

    name: str
    start: float
    end: float
    hit_for: float
    runs: frozenset[str] = frozenset()
    """Runs known to have been hit, whenever they fell due (held by a killed worker, held by a
    lost queue)."""
    shards: frozenset[int] | None = None

    def covers(self, run: RunRecord) -> bool:
        due = run.scheduled_for.timestamp()
        return run.id in self.runs or self.start - LEAD <= due <= self.end

    def hit(self, run: RunRecord) -> bool:
        if run.id in self.runs:
            return True
        due = run.scheduled_for.timestamp()
        in_shard = self.shards is None or run.shard in self.shards
        return in_shard and self.start - LEAD <= due <= self.start + self.hit_for


LEAD = 2.0
"""Runs due this long before a fault may still have been queued or running when it hit."""


@dataclass(frozen=True, slots=True)
class Delays:
    overall: float
    outside_faults: float
    worst_outside: str
    recovery: dict[str, float]
    """Per fault: seconds from the fault until the last run it hit started (again)."""
    last_hit: dict[str, str]
    """Per fault: the id of that last run."""


def start_delays(
    ran: Sequence[RunRecord], starts: dict[str, list[float]], windows: Sequence[FaultWindow]
) -> Delays:
    """Start delay of each run that ran: its first start line minus its fire time; and how long
    each fault took to recover from."""
    overall = outside = 0.0
    worst = ""
    recovery = {w.name: 0.0 for w in windows}
    last_hit: dict[str, str] = {}
    for run in ran:
        first = starts[run.id][0]
        delay = first - run.scheduled_for.timestamp()
        overall = max(overall, delay)
        if delay > outside and not any(w.covers(run) for w in windows):
            outside, worst = delay, f"{run.id} of job {run.job_id} due {run.scheduled_for}"
        for window in windows:
            after = [w for w in starts[run.id] if w >= window.start]
            if after and window.hit(run) and after[0] - window.start > recovery[window.name]:
                recovery[window.name] = after[0] - window.start
                last_hit[window.name] = run.id
    return Delays(overall, outside, worst, recovery, last_hit)
