"""Fast checks of the suite's own parts: the nemesis's plan is the seed's, the checker's
percentile is the one its table claims, and the oracle's cron fire times are the expressions'."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from onbeat.testing.postgres import fresh_schema
from tests.faults import summary
from tests.faults.checker import Report, _loop_blocks, _started_elsewhere_after, percentile
from tests.faults.nemesis import (
    PROCESS_FAULTS,
    FaultEvent,
    Nemesis,
    PlannedFault,
    combined_plan,
    mixed_plan,
    random_plan,
)
from tests.faults.oracle import RunRecord, SubmittedJob
from tests.faults.scenarios import NIGHTLY_FAULTS, NIGHTLY_SERVICE_FAULTS, SCENARIOS
from tests.faults.schedulers import KILL, PAUSE, takeover_plan
from tests.faults.stall_watch import STALL_SECONDS, StallWatch


def kill_plan(
    seed: int, slots: list[int], interval: tuple[float, float], duration: float, limit: int = 1000
) -> list[PlannedFault]:
    return random_plan(seed, "kill -9", slots, interval, duration, limit)


def test_random_plan__same_seed_same_plan_within_bounds() -> None:
    plan = kill_plan(7, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    assert plan == kill_plan(7, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    assert plan != kill_plan(8, [3, 4, 5, 6], (3.0, 7.0), 60.0)
    offsets = [fault.offset for fault in plan]
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert all(3.0 <= gap <= 7.0 for gap in gaps) and offsets[-1] < 60.0
    assert {fault.slot for fault in plan} <= {3, 4, 5, 6}
    assert len(kill_plan(7, [0], (3.0, 5.0), 60.0, limit=5)) == 5


def test_percentile__nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([], 0.99) == 0.0


def test_mixed_plan__draws_every_kind_with_its_duration() -> None:
    kinds = [("kill -9", 0.0), ("kill -STOP", 8.0), ("kill -TERM", 0.0)]
    plan = mixed_plan(7, kinds, [1, 2, 3], (1.0, 2.0), 200.0)
    assert plan == mixed_plan(7, kinds, [1, 2, 3], (1.0, 2.0), 200.0)
    assert {(f.kind, f.lasts) for f in plan} == set(kinds)


def test_combined_plan__process_and_service_faults_never_within_one_another() -> None:
    slots = [3, 4, 5, 6, 7, 8, 9]
    plan = combined_plan(7, NIGHTLY_FAULTS, NIGHTLY_SERVICE_FAULTS, slots, (15.0, 30.0), 3600.0)
    assert plan == combined_plan(
        7, NIGHTLY_FAULTS, NIGHTLY_SERVICE_FAULTS, slots, (15.0, 30.0), 3600.0
    )
    assert {(f.kind, f.lasts) for f in plan} == set(NIGHTLY_FAULTS) | set(NIGHTLY_SERVICE_FAULTS)
    assert all(f.slot in slots for f in plan if f.kind in PROCESS_FAULTS)
    assert all(f.slot == -1 for f in plan if f.kind not in PROCESS_FAULTS)
    # Each starts 15-30 s after the previous one's outage (pause, lock, server down) ended.
    assert all(
        15.0 <= then.offset - (first.offset + first.lasts) <= 30.0
        for first, then in itertools.pairwise(plan)
    )
    assert plan[-1].offset < 3600.0


def test_scenario_scaled__same_pace_over_fewer_seconds_and_a_plan_to_match() -> None:
    n1 = SCENARIOS["N1"]
    short = n1.scaled(300)
    assert (short.load_seconds, short.workload.batches) == (300, 500)
    assert short.workload.pace == n1.workload.pace and short.workload.batch == n1.workload.batch
    assert short.plan(7, [3, 4], 300)[-1].offset < 300 < n1.plan(7, [3, 4], 3600)[-1].offset
    assert short.services is n1.services and short.private_postgres


def test_summary_table__a_column_per_scenario_failures_marked() -> None:
    passed = Report("S0", 7, {"runs_lost": 0, "start_delay_p99": 0.05}, {"runs_lost": True})
    failed = Report("S1", 7, {"runs_lost": 3}, {"runs_lost": False})
    lines = summary.table([passed, failed]).splitlines()
    assert lines[0] == "| metric | S0 | S1 |"
    assert "| `runs_lost` | 0 | **3** ✗ |" in lines
    assert "| `start_delay_p99` | 0.050 | — |" in lines
    assert lines[-1] == "| **result** | PASS | **FAIL** |"


def _cron(expression: str, created: str, cancelled: str) -> SubmittedJob:
    return SubmittedJob(
        "job",
        "cron",
        datetime.fromisoformat(created),
        cancelled_at=datetime.fromisoformat(cancelled),
        expression=expression,
    )


def test_planned_fires__cron_periods_strictly_after_creation_up_to_the_cancel() -> None:
    every_10s = _cron("*/10 * * * * *", "2026-11-30T20:00:09.9+00:00", "2026-11-30T20:00:40+00:00")
    assert [f.second for f in every_10s.planned_fires() or []] == [10, 20, 30, 40]
    on_the_10 = _cron("*/10 * * * * *", "2026-11-30T20:00:10+00:00", "2026-11-30T20:00:39.9+00:00")
    assert [f.second for f in on_the_10.planned_fires() or []] == [20, 30]
    minutely = _cron("0 * * * * *", "2026-11-30T20:00:00.5+00:00", "2026-11-30T20:03:00+00:00")
    assert [(f.minute, f.second) for f in minutely.planned_fires() or []] == [
        (1, 0),
        (2, 0),
        (3, 0),
    ]
    five_fields = _cron("* * * * *", "2026-11-30T19:59:45+00:00", "2026-11-30T20:00:05+00:00")
    assert five_fields.planned_fires() == [datetime(2026, 11, 30, 20, 0, tzinfo=UTC)]


def test_takeover_plan__kills_twice_then_a_pause_each_past_a_10s_mark() -> None:
    plan = takeover_plan(7, [], 44.0, pause=8.0)
    assert [f.kind for f in plan] == [KILL, KILL, PAUSE]
    assert all(5.5 <= f.offset % 10 < 6.0 for f in plan)
    assert plan[-1].lasts == 8.0 and plan[-1].offset + plan[-1].lasts < 44.0


def test_stall_watch__records_once_per_stall_what_the_processes_were_doing(
    tmp_path: Path,
) -> None:
    ledger, out = tmp_path / "ledger", tmp_path / "stalls.jsonl"
    ledger.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with fresh_schema() as database_url:
            watch = StallWatch(ledger, out, lambda: {"worker-0": child.pid}, database_url)
            (ledger / "ledger-1.jsonl").write_text('{"event": "start"}\n')
            watch.check(0.0)
            watch.check(STALL_SECONDS - 0.5)
            assert not out.exists(), "recorded before STALL_SECONDS without a start"
            watch.check(STALL_SECONDS)
            watch.check(STALL_SECONDS + 5)  # the same stall: not again
            (ledger / "ledger-1.jsonl").write_text('{"event": "start"}\n{"event": "end"}\n')
            watch.check(STALL_SECONDS + 6)
            watch.check(2 * STALL_SECONDS + 6)  # a second stall
    finally:
        child.kill()
        child.wait()
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    assert watch.stalls == 2
    assert first["seconds_without_a_start"] == STALL_SECONDS
    assert "sleep" in first["processes"]["worker-0"], first["processes"]
    assert isinstance(first["postgres"], list)
    assert second["seconds_without_a_start"] == STALL_SECONDS


def test_nemesis__a_fault_that_fails_to_inject_is_reported_and_the_plan_goes_on() -> None:
    def broken(fault: PlannedFault) -> FaultEvent:
        raise ConnectionError("connection timeout expired")

    def works(fault: PlannedFault) -> FaultEvent:
        return FaultEvent(fault.kind, "redis", -1, 1, 0.0, 0)

    plan = [PlannedFault(0.0, "broken"), PlannedFault(0.0, "works")]
    nemesis = Nemesis(None, plan, lambda _pid: set(), {"broken": broken, "works": works})  # type: ignore[arg-type]
    nemesis.start()
    nemesis._thread.join(timeout=10)
    assert [e.fault for e in nemesis.timeline] == ["works"]
    [error] = nemesis.errors
    assert "broken" in error and "connection timeout expired" in error


def test_loop_blocks__every_ended_attempt_of_a_blocker_on_its_worker() -> None:
    def line(pid: int, wall: float, token: int) -> dict[str, object]:
        return {"pid": pid, "wall": wall, "fencing_token": token}

    starts = {
        "blocker": [line(7, 10.0, 1), line(8, 20.0, 2)],  # killed under the first, run again
        "other": [line(7, 11.0, 1)],
    }
    ends = {("blocker", 2): 25.0, ("other", 1): 15.0}
    assert _loop_blocks(starts, ends, {"blocker"}) == [(8, 20.0, 25.0)]


def test_started_elsewhere_after__counts_from_the_fault_or_from_a_later_run_time() -> None:
    """A run held when its worker froze counts from the freeze; one held ahead of its time,
    from that time. Starts by the victim itself, or before the fault, are not rescues."""
    at = datetime(2026, 12, 6, 4, 21, 7, tzinfo=UTC).timestamp()
    event = FaultEvent("kill -STOP", "worker", 1, pid=7, wall=at, mono_ns=0)
    event.held = ["running", "ahead"]
    runs = {
        eid: RunRecord(eid, "job", 0, datetime.fromtimestamp(due, UTC), "schedule", "succeeded")
        for eid, due in (("running", at - 1.0), ("ahead", at + 3.4))
    }
    starts = {
        "running": [{"pid": 7, "wall": at - 1.0}, {"pid": 8, "wall": at + 5.0}],
        "ahead": [{"pid": 7, "wall": at + 9.0}, {"pid": 9, "wall": at + 6.2}],
    }
    assert _started_elsewhere_after(event, runs, starts) == pytest.approx([5.0, 2.8])
