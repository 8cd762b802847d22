"""The checker: RELIABILITY.md's metrics from the ack log, the ledgers, the nemesis's timeline and
plain SQL on the store (PostgreSQL or SQLite), a table, a pass/fail line, and JSON + markdown
under the artifacts directory."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.faults.nemesis import FaultEvent
from tests.faults.oracle import RunRecord, SubmittedJob, _from_micros, judge

EARLY = 0.05
"""A start this much before the fire time is early (RELIABILITY.md)."""
LEAD = 2.0
"""Runs due this long before a fault may already have been held when it hit."""


def query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Plain SQL on the store (the same statement runs on both backends)."""
    if database_url.startswith("sqlite:///"):
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql).fetchall()


def read_runs(database_url: str) -> list[RunRecord]:
    rows = query(
        database_url, "SELECT id, job_id, shard, scheduled_for, trigger, status FROM executions"
    )
    return [RunRecord(r[0], r[1], r[2], _from_micros(r[3]), r[4], r[5]) for r in rows]


def read_ledgers(directory: Path) -> list[dict[str, Any]]:
    """Complete lines of every worker's ledger (a line being written has no newline yet)."""
    entries: list[dict[str, Any]] = []
    for path in sorted(directory.glob("ledger-*.jsonl")):
        *complete, _partial = path.read_text().split("\n")
        entries += [json.loads(line) for line in complete if line.strip()]
    return entries


@dataclass(frozen=True, slots=True)
class Thresholds:
    lease_ttl: float
    start_delay_p99: float
    """Bound on the baseline (outside fault windows) start-delay p99."""
    t_detect: float | None
    """Bound on the p99 of fault -> first re-claim of an orphaned run (None: reported only)."""
    fault_window: float
    """A run due within this long after a fault counts in the fault window."""


@dataclass
class Report:
    scenario: str
    seed: int
    metrics: dict[str, Any]
    checks: dict[str, bool]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def table(self) -> str:
        width = max(len(k) for k in self.metrics)
        lines = [f"{self.scenario} (seed {self.seed})"]
        for key, value in self.metrics.items():
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            ok = self.checks.get(key)
            mark = "" if ok is None else ("  ok" if ok else "  FAIL")
            lines.append(f"  {key:<{width}}  {shown}{mark}")
        failed = [k for k, ok in self.checks.items() if not ok]
        lines.append(
            f"{self.scenario}: " + ("PASS" if not failed else f"FAIL ({', '.join(failed)})")
        )
        return "\n".join(lines)

    def write(self, directory: Path) -> None:
        data = {
            "scenario": self.scenario,
            "seed": self.seed,
            "passed": self.passed,
            "metrics": self.metrics,
            "checks": self.checks,
            "config": self.config,
        }
        (directory / "result.json").write_text(json.dumps(data, indent=1) + "\n")
        rows = "\n".join(
            f"| `{k}` | {v:.3f} | {_verdict(self.checks.get(k))} |"
            if isinstance(v, float)
            else f"| `{k}` | {v} | {_verdict(self.checks.get(k))} |"
            for k, v in self.metrics.items()
        )
        (directory / "summary.md").write_text(
            f"# {self.scenario}, seed {self.seed}: {'PASS' if self.passed else 'FAIL'}\n\n"
            f"| metric | value | check |\n|---|---|---|\n{rows}\n"
        )


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("pass" if ok else "**FAIL**")


def percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def check(
    scenario: str,
    seed: int,
    database_url: str,
    jobs: list[SubmittedJob],
    entries: list[dict[str, Any]],
    timeline: list[FaultEvent],
    thresholds: Thresholds,
    cancel_boundary: float,
    seconds: float,
) -> Report:
    """Every metric of RELIABILITY.md this slice measures, and the pass lines."""
    runs = read_runs(database_url)
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: Counter[str] = Counter()
    for entry in entries:
        if entry["event"] == "start":
            starts[entry["execution_id"]].append(entry)
        else:
            ends[entry["execution_id"]] += 1
    for lines in starts.values():
        lines.sort(key=lambda e: e["wall_ns"])
    start_walls = {eid: [e["wall"] for e in lines] for eid, lines in starts.items()}
    verdict = judge(jobs, runs, start_walls, boundary=cancel_boundary)

    stored_jobs = {row[0] for row in query(database_url, "SELECT id FROM jobs")}
    acked_missing = sum(job.id not in stored_jobs for job in jobs)
    dup_materialized = query(
        database_url,
        "SELECT count(*) FROM (SELECT 1 FROM executions"
        " GROUP BY job_id, scheduled_for, trigger HAVING count(*) > 1) d",
    )[0][0]
    # A final record written by a token lower than the highest issued for that run.
    stale = query(
        database_url,
        "SELECT count(*) FROM executions e WHERE e.status = 'succeeded' AND e.fencing_token <"
        " (SELECT max(a.fencing_token) FROM attempts a WHERE a.execution_id = e.id)",
    )[0][0]

    killed = {e.pid: e for e in timeline}
    dead_by_policy = _dead_by_policy(database_url, killed.keys())
    lost = [line for line in verdict.lost if not any(key in line for key in dead_by_policy)]
    duplicated = {eid: lines for eid, lines in starts.items() if len(lines) > 1}
    unexplained = [
        eid for eid, lines in duplicated.items() if any(e["pid"] not in killed for e in lines[:-1])
    ]
    extra_by_fault: Counter[int] = Counter()
    for lines in duplicated.values():
        for entry in lines[:-1]:
            extra_by_fault[entry["pid"]] += 1
    dup_bound_ok = all(extra_by_fault[e.pid] <= len(e.held) for e in timeline)

    by_id = {run.id: run for run in runs}
    early = 0
    baseline: list[float] = []
    faulted: list[float] = []
    held = {eid for e in timeline for eid in e.held}
    for eid, lines in starts.items():
        run = by_id.get(eid)
        if run is None:
            continue
        due = run.scheduled_for.timestamp()
        delay = lines[0]["wall_ns"] / 1e9 - due
        early += delay < -EARLY
        in_fault = eid in held or any(
            e.wall - LEAD <= due <= e.wall + thresholds.fault_window for e in timeline
        )
        (faulted if in_fault else baseline).append(delay)

    detect: list[float] = []
    for event in timeline:
        again = [
            entry["wall"] - event.wall
            for eid in event.held
            for entry in starts.get(eid, [])
            if entry["pid"] != event.pid and entry["wall"] > event.wall
        ]
        if again:
            detect.append(min(again))

    metrics: dict[str, Any] = {
        "runs_expected": verdict.planned,
        "runs_ran": len(verdict.ran),
        "runs_per_s": len(verdict.ran) / seconds if seconds else 0.0,
        "runs_lost": len(lost),
        "dead_by_policy": len(dead_by_policy),
        "unplanned": len(verdict.unplanned),
        "acked_creates": len(jobs),
        "acked_missing": acked_missing,
        "dup_materialized": int(dup_materialized),
        "dup_starts": len(duplicated),
        "dup_executions": sum(n >= 2 for n in ends.values()),
        "dup_per_10k": 1e4 * len(duplicated) / max(1, len(verdict.ran)),
        "unexplained_dups": len(unexplained),
        "dup_bound_ok": dup_bound_ok,
        "stale_writes_accepted": int(stale),
        "early_starts": early,
        "faults": len(timeline),
        "held_at_faults": sum(len(e.held) for e in timeline),
        "baseline_runs": len(baseline),
        "start_delay_p50": percentile(baseline, 0.5),
        "start_delay_p99": percentile(baseline, 0.99),
        "start_delay_max": max(baseline, default=0.0),
        "fault_window_runs": len(faulted),
        "fault_start_delay_p50": percentile(faulted, 0.5),
        "fault_start_delay_p99": percentile(faulted, 0.99),
        "fault_start_delay_max": max(faulted, default=0.0),
        "t_detect_p50": percentile(detect, 0.5),
        "t_detect_p99": percentile(detect, 0.99),
        "t_detect_max": max(detect, default=0.0),
    }
    checks = {
        "runs_lost": metrics["runs_lost"] == 0,
        "unplanned": metrics["unplanned"] == 0,
        "acked_missing": acked_missing == 0,
        "dup_materialized": metrics["dup_materialized"] == 0,
        "unexplained_dups": not unexplained,
        "dup_bound_ok": dup_bound_ok,
        "stale_writes_accepted": metrics["stale_writes_accepted"] == 0,
        "early_starts": early == 0,
        "start_delay_p99": metrics["start_delay_p99"] <= thresholds.start_delay_p99,
    }
    if thresholds.t_detect is not None and timeline:
        checks["t_detect_p99"] = metrics["t_detect_p99"] <= thresholds.t_detect
    details = {
        "lost": lost[:20],
        "dead_by_policy": sorted(dead_by_policy)[:20],
        "unplanned": verdict.unplanned[:20],
        "unexplained_dups": unexplained[:20],
    }
    return Report(scenario, seed, metrics, checks, {"details": details})


def _dead_by_policy(database_url: str, killed_pids: Iterable[int]) -> set[str]:
    """Runs that failed because every attempt's worker was ``kill -9``-ed by the nemesis: the
    crash-attempt limit (``max_attempts``) ended them, a recorded terminal state
    (RELIABILITY.md: "dead by poison policy"), not a silent loss. As ``"job <id> at <fire>"``,
    the oracle's wording of a run."""
    rows = query(
        database_url,
        "SELECT e.job_id, e.scheduled_for, a.worker, a.outcome FROM executions e"
        " JOIN attempts a ON a.execution_id = e.id WHERE e.status = 'failed'",
    )
    killed = {str(pid) for pid in killed_pids}
    explained: dict[str, bool] = {}
    for job_id, fire, worker, outcome in rows:
        key = f"job {job_id} at {_from_micros(fire)}"
        by_kill = outcome == "lost" and worker.split("-")[-2] in killed
        explained[key] = explained.get(key, True) and by_kill
    return {key for key, ok in explained.items() if ok}
