"""The checker: RELIABILITY.md's metrics from the ack log, the ledgers, the nemesis's timeline and
plain SQL on the store (PostgreSQL or SQLite), a table, a pass/fail line, and JSON + markdown
under the artifacts directory."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.faults.clocks import CLOCK_FAULT, on_harness_clock, read_clock_probes, skew_metrics
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


def _ended_at(database_url: str, pid: int, outcome: str) -> list[float]:
    """When (wall seconds, the store's clock) each attempt of the worker ``pid`` that ended with
    ``outcome`` ended: 'released' by the worker, 'lost' by the reaper."""
    rows = query(
        database_url,
        "SELECT finished_at FROM attempts"
        f" WHERE outcome = '{outcome}' AND worker LIKE '%-{pid}-%' AND finished_at IS NOT NULL",
    )
    return [int(row[0]) / 1e6 for row in rows]


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
    """A run due within this long after a fault (or after it ended) counts in the fault window."""
    heartbeat_interval: float = 1.0
    t_release: float | None = None
    """Bound on ``kill -TERM`` -> a run the victim held started elsewhere (None: reported only)."""
    t_takeover: float | None = None
    """Bound on a scheduler fault -> every shard leased by another scheduler (S4)."""
    burst_p99: float | None = None
    """Bound on the start-delay p99 of one-shots all due at one instant (S8; None: no burst)."""


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


@dataclass(frozen=True, slots=True)
class Observed:
    """What the checker reads besides the store: acknowledged creates, ledger lines, the
    nemesis's timeline, deaths the nemesis did not cause (a poison task taking its worker down,
    restarted by the supervisor), and the product's logs."""

    jobs: list[SubmittedJob]
    entries: list[dict[str, Any]]
    timeline: list[FaultEvent]
    deaths: list[FaultEvent] = field(default_factory=list)
    logs: Path | None = None


FENCED_LOG_LINES = ("discarded, the lease was lost", "stopping local run, its lease was taken away")
"""What a worker logs when fencing refuses its outcome or its heartbeat finds the lease gone."""


def check(
    scenario: str,
    seed: int,
    database_url: str,
    seen: Observed,
    thresholds: Thresholds,
    cancel_boundary: float,
    seconds: float,
) -> Report:
    """Every metric of RELIABILITY.md the scenario measures, and the pass lines."""
    runs = read_runs(database_url)
    skewed = any(e.fault.startswith(CLOCK_FAULT) for e in seen.timeline)
    if skewed:  # a skewed worker's own wall clock is wrong: judge its lines on the harness's
        on_harness_clock(seen.entries, seen.timeline)
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[tuple[str, int], float] = {}
    harness = os.getpid()  # the runner started every product process, and checks in-process
    for entry in seen.entries:
        # A line from a worker's pool child is the worker's: faults hit the worker.
        lineage = entry.get("lineage", [])
        if harness in lineage[1:]:
            entry["pid"] = lineage[lineage.index(harness) - 1]
        if entry["event"] == "start":
            starts[entry["execution_id"]].append(entry)
        else:
            ends[entry["execution_id"], entry["fencing_token"]] = entry["wall"]
    for lines in starts.values():
        # In token order: a rescue is the start with the next token, even where the frozen
        # holder of the earlier one wakes and starts it (fenced) after the rescue started.
        lines.sort(key=lambda e: (e["fencing_token"], e["wall_ns"]))
    start_walls = {eid: [e["wall"] for e in lines] for eid, lines in starts.items()}
    verdict = judge(seen.jobs, runs, start_walls, boundary=cancel_boundary)

    stored_jobs = {row[0] for row in query(database_url, "SELECT id FROM jobs")}
    acked_missing = sum(job.id not in stored_jobs for job in seen.jobs)
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

    events = seen.timeline + seen.deaths
    by_pid: dict[int, list[FaultEvent]] = defaultdict(list)
    for event in events:
        by_pid[event.pid].append(event)
    poison_jobs = {job.id for job in seen.jobs if job.policy == "poison"}
    poison_runs = {run.id for run in runs if run.job_id in poison_jobs}
    dead_by_policy = _dead_by_policy(database_url, {e.pid for e in events if e.kills}, poison_jobs)
    lost = [line for line in verdict.lost if not any(key in line for key in dead_by_policy)]
    # A poison run starts once per attempt by design; every other second start is a duplicate.
    duplicated = {
        eid: lines for eid, lines in starts.items() if len(lines) > 1 and eid not in poison_runs
    }
    unexplained = [
        eid for eid, lines in duplicated.items() if any(e["pid"] not in by_pid for e in lines[:-1])
    ]
    false_rescues = [
        eid
        for eid, lines in duplicated.items()
        if any(
            not _justifies(by_pid[first["pid"]], then["wall"], thresholds)
            for first, then in itertools.pairwise(lines)
        )
    ]
    overlapping = sum(
        1
        for eid, lines in duplicated.items()
        for first, then in itertools.pairwise(lines)
        if then["wall"] < ends.get((eid, first["fencing_token"]), then["wall"])
    )
    extra_by_pid: Counter[int] = Counter()
    for lines in duplicated.values():
        for entry in lines[:-1]:
            extra_by_pid[entry["pid"]] += 1
    # What a hurt process held: the nemesis's looks at it (at the signal and 1 s after), and the
    # runs whose attempt by it the reaper ended as lost, the store's own record. The looks can
    # miss a run whose task had just ended and whose outcome was on its way (N1 of 2026-12-01
    # 18:37: ended in the ledger 12 ms before the kill -9, reaped 4 s later, listed by neither).
    seen_held: dict[int, set[str]] = defaultdict(set)
    held_by_pid: Counter[int] = Counter()
    for event in events:
        held_by_pid[event.pid] += len(event.held)
        seen_held[event.pid].update(event.held)
    reaped_unseen = 0
    for pid, reaped in _lost_attempts(database_url, by_pid).items():
        unseen = len(reaped - seen_held[pid])
        held_by_pid[pid] += unseen
        reaped_unseen += unseen
    dup_bound_ok = all(extra_by_pid[pid] <= held_by_pid[pid] for pid in by_pid)

    by_id = {run.id: run for run in runs}
    blocker_jobs = {job.id for job in seen.jobs if job.policy == "blocks_loop"}
    blocks = _loop_blocks(starts, ends, {run.id for run in runs if run.job_id in blocker_jobs})
    early = 0
    baseline: list[float] = []
    latest: list[tuple[float, str, int, int]] = []  # baseline (delay, run, worker pid, shard)
    faulted: list[float] = []
    behind_blocks: list[float] = []
    held = {eid for e in events for eid in e.held}
    for eid, lines in starts.items():
        run = by_id.get(eid)
        if run is None or eid in poison_runs:
            continue
        due = run.scheduled_for.timestamp()
        first = lines[0]
        delay = first["wall_ns"] / 1e9 - due
        early += delay < -EARLY
        in_fault = eid in held or any(
            e.wall - LEAD <= due <= (e.ended or e.wall) + thresholds.fault_window for e in events
        )
        if in_fault:
            faulted.append(delay)
        elif any(
            pid == first["pid"] and began < first["wall"] and ended > due
            for pid, began, ended in blocks
        ):
            behind_blocks.append(delay)
        else:
            baseline.append(delay)
            latest.append((round(delay, 3), eid, first["pid"], run.shard))

    detect: list[float] = []
    detections: list[dict[str, Any]] = []
    release: list[float] = []
    restart: list[float] = []
    for event in seen.timeline:
        again = _started_elsewhere_after(event, by_id, starts)
        # A worker a poison run took down within its grace released nothing: a crash's.
        graceful = event.fault == "kill -TERM" and event.exit_code in (0, None)
        if graceful:
            # The promise is the release (the store's record of it), not how soon another worker
            # is alive to take the run: S3's poison runs may have taken every other one down.
            release += [at - event.wall for at in _ended_at(database_url, event.pid, "released")]
            restart += [min(again)] if again else []
        elif again:
            detect.append(min(again))
            # What a late one spent where: the reaper's first take of the victim's leases, then
            # the queue and a worker's claim.
            lost_after = [
                at - event.wall
                for at in _ended_at(database_url, event.pid, "lost")
                if at > event.wall
            ]
            detections.append(
                {
                    "fault": event.fault,
                    "pid": event.pid,
                    "held": len(event.held),
                    "first_reaped_after": round(min(lost_after), 3) if lost_after else None,
                    "first_started_elsewhere_after": round(min(again), 3),
                }
            )

    fenced = _count_log_lines(seen.logs, FENCED_LOG_LINES)
    metrics: dict[str, Any] = {
        "runs_expected": verdict.planned,
        "runs_ran": len(verdict.ran),
        "runs_per_s": len(verdict.ran) / seconds if seconds else 0.0,
        "runs_lost": len(lost),
        "dead_by_policy": len(dead_by_policy),
        "unplanned": len(verdict.unplanned),
        "acked_creates": len(seen.jobs),
        "acked_missing": acked_missing,
        "dup_materialized": int(dup_materialized),
        "dup_starts": len(duplicated),
        "dup_executions": sum(
            sum((eid, e["fencing_token"]) in ends for e in lines) >= 2
            for eid, lines in duplicated.items()
        ),
        "dup_per_10k": 1e4 * len(duplicated) / max(1, len(verdict.ran)),
        "unexplained_dups": len(unexplained),
        "false_rescues": len(false_rescues),
        "dup_bound_ok": dup_bound_ok,
        "overlapping_execs": overlapping,
        "fenced_writes": fenced,
        "stale_writes_accepted": int(stale),
        "early_starts": early,
        "faults": len(seen.timeline),
        "deaths_not_by_nemesis": len(seen.deaths),
        "held_at_faults": sum(len(e.held) for e in events),
        "held_reaped_unseen": reaped_unseen,
        "baseline_runs": len(baseline),
        "start_delay_p50": percentile(baseline, 0.5),
        "start_delay_p99": percentile(baseline, 0.99),
        "start_delay_max": max(baseline, default=0.0),
        "behind_blocked_loop_runs": len(behind_blocks),
        "behind_blocked_loop_delay_max": max(behind_blocks, default=0.0),
        "fault_window_runs": len(faulted),
        "fault_start_delay_p50": percentile(faulted, 0.5),
        "fault_start_delay_p99": percentile(faulted, 0.99),
        "fault_start_delay_max": max(faulted, default=0.0),
        "t_detect_p50": percentile(detect, 0.5),
        "t_detect_p99": percentile(detect, 0.99),
        "t_detect_max": max(detect, default=0.0),
    }
    if release:
        metrics |= {"t_release_p99": percentile(release, 0.99), "t_release_max": max(release)}
    if restart:
        metrics["t_restart_after_term_max"] = max(restart)
    if poison_jobs:
        metrics |= _poison_metrics(database_url, poison_jobs, len(seen.deaths))
    checks = {
        "runs_lost": metrics["runs_lost"] == 0,
        "unplanned": metrics["unplanned"] == 0,
        "acked_missing": acked_missing == 0,
        "dup_materialized": metrics["dup_materialized"] == 0,
        "unexplained_dups": not unexplained,
        "false_rescues": not false_rescues,
        "dup_bound_ok": dup_bound_ok,
        "stale_writes_accepted": metrics["stale_writes_accepted"] == 0,
        "early_starts": early == 0,
        "start_delay_p99": metrics["start_delay_p99"] <= thresholds.start_delay_p99,
    }
    if blocks:
        longest = max(ended - began for _, began, ended in blocks)
        checks["behind_blocked_loop_delay_max"] = (
            metrics["behind_blocked_loop_delay_max"] <= longest + thresholds.start_delay_p99
        )
    if skewed:
        probes = read_clock_probes(seen.logs) if seen.logs else {}
        skew_found, skew_checks = skew_metrics(seen.entries, probes, seen.timeline)
        metrics |= skew_found
        checks |= skew_checks
    if thresholds.t_detect is not None and detect:
        checks["t_detect_p99"] = metrics["t_detect_p99"] <= thresholds.t_detect
    if thresholds.t_release is not None and release:
        checks["t_release_max"] = metrics["t_release_max"] <= thresholds.t_release
    if poison_jobs:
        checks["poison_dead"] = metrics["poison_dead"] == len(poison_jobs)
        checks["poison_attempts_max"] = metrics["poison_attempts_max"] <= metrics["max_attempts"]
        checks["deaths_not_by_nemesis"] = (
            metrics["deaths_not_by_nemesis"] <= metrics["poison_crash_bound"]
        )
    first_starts = {eid: lines[0]["wall_ns"] / 1e9 for eid, lines in starts.items()}
    extra: dict[str, Any] = {}
    if thresholds.t_takeover is not None:
        from tests.faults.schedulers import takeover_report  # it builds on this module

        more, more_checks, extra = takeover_report(
            database_url, seen.timeline, runs, first_starts, thresholds.t_takeover, seen.logs
        )
        metrics |= more
        checks |= more_checks
    if thresholds.burst_p99 is not None:
        from tests.faults.herd import herd_report  # it builds on this module

        more, more_checks = herd_report(
            database_url, seen.jobs, runs, first_starts, thresholds.burst_p99
        )
        metrics |= more
        checks |= more_checks
    details = {
        **extra,
        "lost": lost[:20],
        "dead_by_policy": sorted(dead_by_policy)[:20],
        "unplanned": verdict.unplanned[:20],
        "unexplained_dups": unexplained[:20],
        "false_rescues": false_rescues[:20],
        "latest_baseline_starts": sorted(latest, reverse=True)[:5],
        "detections": detections,
    }
    return Report(scenario, seed, metrics, checks, {"details": details})


def _started_elsewhere_after(
    event: FaultEvent, runs: Mapping[str, RunRecord], starts: Mapping[str, list[dict[str, Any]]]
) -> list[float]:
    """How long after the fault each start by another process of a run the victim held came;
    from the run's time instead if that is later: a run claimed ahead of its time could not
    start anywhere before it (if its holder dies it starts elsewhere about AHEAD_LEASE_GRACE
    after it), so its wait until then is no detection time (S2: a worker frozen 3.4 s before
    the time of the runs it held ahead had them started elsewhere 2.8 s after that time, 6.1 s
    after the fault)."""
    return [
        entry["wall"] - max(event.wall, runs[eid].scheduled_for.timestamp())
        for eid in event.held
        if eid in runs
        for entry in starts.get(eid, [])
        if entry["pid"] != event.pid and entry["wall"] > event.wall
    ]


def _justifies(events: list[FaultEvent], restarted: float, thresholds: Thresholds) -> bool:
    """Whether a fault on the process that first started a run explains its start again at
    ``restarted``: the process was gone by then, or frozen long enough for its lease to run out
    (its last heartbeat may be one interval before the freeze)."""
    for event in events:
        if event.fault == "kill -STOP":
            expired_at = event.wall - thresholds.heartbeat_interval + thresholds.lease_ttl
            if restarted >= expired_at - LEASE_SLACK:
                return True
        elif event.wall <= restarted:
            return True
    return False


LEASE_SLACK = 0.5
"""Clock and poll slack when judging whether a frozen worker's lease had run out."""


def _count_log_lines(logs: Path | None, needles: Sequence[str]) -> int:
    if logs is None:
        return 0
    return sum(
        any(needle in line for needle in needles)
        for path in logs.glob("worker-*.log")
        for line in path.read_text(errors="replace").splitlines()
    )


def _poison_metrics(database_url: str, poison_jobs: set[str], deaths: int) -> dict[str, Any]:
    """How the poison runs ended: each must be dead-lettered (``failed``) after at most its
    task's ``max_attempts`` attempts, and the worker deaths they caused bounded by that."""
    rows = query(
        database_url,
        "SELECT e.job_id, e.status, e.attempt, j.max_attempts FROM executions e"
        " JOIN jobs j ON j.id = e.job_id",
    )
    mine = [r for r in rows if r[0] in poison_jobs]
    max_attempts = max((r[3] for r in mine), default=0)
    return {
        "poison_runs": len(mine),
        "poison_dead": sum(r[1] == "failed" for r in mine),
        "poison_attempts_max": max((r[2] for r in mine), default=0),
        "max_attempts": max_attempts,
        "poison_crash_bound": len(mine) * max_attempts,
    }


def _loop_blocks(
    starts: dict[str, list[dict[str, Any]]],
    ends: dict[tuple[str, int], float],
    blockers: set[str],
) -> list[tuple[int, float, float]]:
    """(pid, start, end) of every attempt of a run of ``blockers`` (a task that blocks its
    worker's event loop) that ended. A run that worker had claimed and not yet started cannot
    start until the loop answers again: its delay is the blocking task's, reported apart from the
    baseline (bound: the block's length + the baseline's p99 bound)."""
    return [
        (line["pid"], line["wall"], ends[eid, line["fencing_token"]])
        for eid in blockers
        for line in starts.get(eid, [])
        if (eid, line["fencing_token"]) in ends
    ]


def _lost_attempts(database_url: str, pids: Iterable[int]) -> dict[int, set[str]]:
    """pid -> the runs whose attempt by that process the reaper ended as lost (its lease ran
    out: the process was dead or frozen), for the processes in ``pids``."""
    wanted = {str(pid): pid for pid in pids}
    lost: dict[int, set[str]] = defaultdict(set)
    for execution_id, worker in query(
        database_url, "SELECT execution_id, worker FROM attempts WHERE outcome = 'lost'"
    ):
        pid = wanted.get(worker.split("-")[-2])
        if pid is not None:
            lost[pid].add(execution_id)
    return lost


def _dead_by_policy(
    database_url: str, killed_pids: Iterable[int], poison_jobs: set[str]
) -> set[str]:
    """Runs failed by policy: a poison job's, or one whose every attempt's worker was killed
    (``kill -9``, ``kill -TERM`` past the grace, a poison task's crash): the crash-attempt limit
    (``max_attempts``) ended them, a recorded terminal state (RELIABILITY.md: "dead by poison
    policy"), not a silent loss. As ``"job <id> at <fire>"``, the oracle's wording of a run."""
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
        explained[key] = explained.get(key, True) and (by_kill or job_id in poison_jobs)
    return {key for key, ok in explained.items() if ok}
