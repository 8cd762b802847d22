"""The worker's transactions: claim, heartbeat, finish and release runs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from onbeat.batch_json import batch_json
from onbeat.limits import NO_LIMITS, RATE_SLOT, LimitDefaults
from onbeat.model import (
    AttemptOutcome,
    ExecutionStatus,
    JobStatus,
    RetryPolicy,
)
from onbeat.plan import (
    BACKLOG_LATENESS,
    WAITING,
    RunningRun,
    plan_claim,
    plan_finish,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import ScheduleKind
from onbeat.store.base import (
    AHEAD_LEASE_GRACE,
    ClaimedRun,
    ClaimResult,
    Completion,
)
from onbeat.store.rows import (
    MAX_US,
    claim_candidate,
    execution_of,
    from_us,
    to_us,
)
from onbeat.store.sql_store.base import Connection, Row, retried
from onbeat.store.sql_store.limits import LimitTransactions


class RunTransactions(LimitTransactions):
    """The worker's transactions: claim, heartbeat, finish and release runs."""

    @retried
    def execution_claim(
        self,
        execution_ids: Sequence[str],
        owner: str,
        lease_ttl: float,
        misfire_grace: float,
        limits: LimitDefaults = NO_LIMITS,
        max_starts: int | None = None,
        ahead: float = 0.0,
        max_ahead: int = 0,
    ) -> ClaimResult:
        """Decide each run with ``plan_claim`` (pause, due, misfire, overlap, ahead), then the
        fleet limits of those it would start (``plan_limits``; a run under a limit is never
        claimed ahead), then write the decisions in batches. Settled (``_tx``): a claim whose
        COMMIT lost its answer but committed started its runs under this worker's lease, and
        told "unavailable" the worker would not run them: they would wait out the lease and be
        reaped as a lost attempt, dead-lettered if it was their last, without having run."""
        now = self.now()
        now_us = to_us(now)
        ahead_until = now + timedelta(seconds=ahead) if ahead > 0 and max_ahead > 0 else None
        with self._tx(settle=True) as c:
            self._lock_jobs_of_runs(c, execution_ids)
            rows = {
                r["id"]: r
                for r in c.execute(
                    self._q["execution_claim_candidates"], {"ids": batch_json(list(execution_ids))}
                )
                if r["status"] == ExecutionStatus.QUEUED.value
            }
            job_ids = batch_json(sorted({r["job_id"] for r in rows.values()}))
            running: dict[str, list[RunningRun]] = {}
            tokens: dict[str, int] = {}
            for r in c.execute(self._q["execution_running_of_jobs"], {"job_ids": job_ids}):
                running.setdefault(r["job_id"], []).append(
                    RunningRun(r["id"], from_us(r["started_at"]))
                )
                tokens[r["id"]] = r["fencing_token"]
            grace_line = to_us(now - timedelta(seconds=misfire_grace))
            late_jobs = sorted(
                {r["job_id"] for r in rows.values() if (r["queued_at"] or 0) < grace_line}
            )
            newest_missed = {
                r["job_id"]: from_us(r["newest"])
                for r in (
                    c.execute(
                        self._q["execution_newest_missed_of_jobs"],
                        {"job_ids": batch_json(late_jobs), "grace_line": grace_line},
                    )
                    if late_jobs
                    else ()
                )
            }
            behind = to_us(now - timedelta(seconds=BACKLOG_LATENESS))
            late = sorted(  # only a cron job can have a backlog of fire times
                {
                    r["job_id"]
                    for r in rows.values()
                    if r["due_at"] < behind and r["schedule_kind"] == ScheduleKind.CRON.value
                }
            )
            earlier_pending = {
                r["job_id"]: (from_us(r["scheduled_for"]), r["id"])
                for r in (
                    c.execute(
                        self._q["execution_earliest_due_of_jobs"],
                        {"job_ids": batch_json(late), "now": now_us},
                    )
                    if late
                    else ()
                )
            }
            plan = plan_claim(
                [claim_candidate(r) for r in rows.values()],
                running,
                newest_missed,
                now,
                misfire_grace,
                earlier_pending,
                ahead_until,
                self._first_pending(c, rows.values(), now_us, ahead_until),
            )
            for status in (ExecutionStatus.CANCELLED, ExecutionStatus.SKIPPED):
                group = [(rows[run.id], why) for run, st, why in plan.end if st is status]
                if group:
                    self._end_pending(c, [r for r, _ in group], status, [w for _, w in group])
            if plan.defer:
                c.executemany(
                    self._q["execution_defer"],
                    [
                        {"id": run.id, "due_at": to_us(due), "reason": why}
                        for run, due, why in plan.defer
                    ],
                )
            frees = {new: len(victims) for new, victims in plan.replaced.items()}
            # as late as it can: a claim under a limit holds the counters' locks until commit
            limited = self._claim_limits(
                c, [rows[run.id] for run in plan.start], frees, limits, now, max_starts
            )
            replaced = {k: v for k, v in plan.replaced.items() if k in limited.start}
            cancelled = self._replace(c, replaced, tokens, now_us)
            if plan.catchup:
                c.execute(self._q["execution_mark_catchup"], {"ids": batch_json(plan.catchup)})
            to_start = [rows[run.id] for run in plan.start if run.id in limited.start]
            not_due = [
                QueueItem(run.id, run.due_at, run.priority, run.shard) for run in plan.not_due
            ]
            not_due.extend(
                QueueItem(i, due, rows[i]["priority"], rows[i]["shard"]) for i, due in limited.held
            )
            lease_expires_at = now_us + int(lease_ttl * 1_000_000)
            started = self._start_runs(
                c, [r["id"] for r in to_start], owner, lease_expires_at, now_us
            )
            unlimited = self._unlimited(c, [rows[r.id]["tenant"] for r in plan.start_ahead], limits)
            held = [r.id for r in plan.start_ahead if rows[r.id]["tenant"] in unlimited]
            early = set(held[:max_ahead])
            not_due.extend(
                QueueItem(r.id, r.due_at, r.priority, r.shard)
                for r in plan.start_ahead
                if r.id not in early
            )
            if early:
                started += c.execute(
                    self._q["execution_claim_ahead_many"],
                    {
                        "ids": batch_json(sorted(early)),
                        "owner": owner,
                        "grace": int(min(AHEAD_LEASE_GRACE, lease_ttl) * 1_000_000),
                    },
                ).fetchall()
            job_of = {r["id"]: r for r in to_start} | {i: rows[i] for i in early}
            in_flight = Counter(job_of[row["id"]]["tenant"] for row in started)
            in_flight.subtract(rows[newer]["tenant"] for newer in cancelled)
            self._usage_add(c, in_flight, limited.tat)
        runs = []
        for row in started:
            r = job_of[row["id"]]
            runs.append(
                ClaimedRun(
                    execution=execution_of(row, ()),
                    task=r["task"],
                    params=json.loads(r["params"]),
                    timeout=r["timeout"],
                    retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
                    replaced=tuple(replaced.get(row["id"], ())),
                )
            )
        waiting = frozenset(run.job_id for run, _, why in plan.defer if why.startswith(WAITING))
        return ClaimResult(runs, not_due, waiting, limited.held_back)

    def _first_pending(
        self, c: Connection, rows: Iterable[Row], now_us: int, ahead_until: datetime | None
    ) -> dict[str, str]:
        """job id -> its earliest pending run, for the jobs of the runs a claim could take
        ahead: only that one may be (a later one waits for it in fire-time order)."""
        if ahead_until is None:
            return {}
        until = to_us(ahead_until)
        jobs = sorted(
            {
                r["job_id"]
                for r in rows
                if now_us < r["due_at"] <= until and r["reason"] != RATE_SLOT
            }
        )
        if not jobs:
            return {}
        found = c.execute(
            self._q["execution_earliest_due_of_jobs"],
            {"job_ids": batch_json(jobs), "now": MAX_US},
        )
        return {r["job_id"]: r["id"] for r in found}

    @retried
    def execution_confirm(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        now_us = self._now_us()
        with self._tx(settle=True) as c:
            return self._confirm_runs(c, owner, held, now_us, now_us + int(lease_ttl * 1e6))

    def _replace(
        self,
        c: Connection,
        replaced: Mapping[str, list[str]],
        tokens: Mapping[str, int],
        now_us: int,
    ) -> list[str]:
        """overlap=replace: cancel the running predecessors (``tokens``: id -> fencing token as
        the claim read them, under their job's lock), fencing their tokens; returns, for each run
        cancelled, the newer run that replaced it."""
        cancelled = []
        for newer, victims in replaced.items():
            why = f"replaced by execution {newer}"
            for victim in victims:
                # its attempt first, from its row as it runs: attempts, then runs and history
                c.execute(
                    self._q["attempt_end"],
                    {
                        "id": victim,
                        "fencing_token": tokens[victim],
                        "worker": None,
                        "outcome": AttemptOutcome.CANCELLED.value,
                        "error": why,
                        "now": now_us,
                    },
                )
                gone = c.execute(
                    self._q["execution_replace"], {"id": victim, "reason": why, "now": now_us}
                ).fetchone()
                if gone:
                    cancelled.append(newer)
                    self._archive(c, [victim])
        return cancelled

    @retried
    def execution_heartbeat(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        now_us = self._now_us()
        with self._tx() as c:
            rows = c.execute(
                self._q["execution_heartbeat"],
                {
                    "owner": owner,
                    "held": batch_json(dict(held)),
                    "lease_expires_at": now_us + int(lease_ttl * 1_000_000),
                    "now": now_us,
                    "waited": self._waits_extend_leases,
                },
            )
            return {r["id"]: r["fencing_token"] for r in rows}

    @retried
    def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
        now_us = self._now_us()
        with self._tx() as c:
            self._lock_jobs_of_runs(c, [x.execution_id for x in completions])
            current = {
                r["id"]: r
                for r in c.execute(
                    self._q["execution_current_tokens"],
                    {"ids": batch_json([x.execution_id for x in completions])},
                )
            }
            outcomes = []
            for done in completions:
                # pop: a second completion of the same run in one batch finds nothing to finish
                r = current.pop(done.execution_id, None)
                if (
                    r is None
                    or r["status"] != "running"
                    or r["fencing_token"] != done.fencing_token
                    or r["started_at"] is None  # claimed ahead, never started
                ):
                    continue
                if done.succeeded:
                    outcome = AttemptOutcome.SUCCEEDED
                elif done.timed_out:
                    outcome = AttemptOutcome.TIMED_OUT
                else:
                    outcome = AttemptOutcome.FAILED
                outcomes.append((r, done, outcome))
            self._finish(c, outcomes, now_us)
        return [done.execution_id for _, done, _ in outcomes]

    def _finish(
        self,
        c: Connection,
        outcomes: Sequence[tuple[Row, Completion, AttemptOutcome]],
        now_us: int,
    ) -> None:
        """Move running executions (tokens already checked) to their next state and end each
        attempt: runs that go on (a retry, a release) are updated in place, the final ones leave
        for the history in one batch (``_finish_final``)."""
        finishes, attempts, dead = [], [], []
        for r, done, outcome in outcomes:
            end = plan_finish(
                succeeded=done.succeeded,
                released=outcome is AttemptOutcome.RELEASED,
                job_cancelled=r["job_status"] == JobStatus.CANCELLED.value,
                attempt=r["attempt"],
                retry_in=done.retry_in,
            )
            status = end.status
            result = None
            if done.succeeded:  # most tasks return None: its JSON needs no encoder
                result = "null" if done.result is None else json.dumps(done.result)
            finishes.append(
                {
                    "id": r["id"],
                    "fencing_token": done.fencing_token,
                    "status": status.value,
                    "due_at": None if end.due_in is None else now_us + int(end.due_in * 1_000_000),
                    "result": result,
                    "error": done.error,
                    "reason": end.reason,
                    "uncount_attempt": int(end.uncount),
                    "now": now_us,
                    "scheduled_for": r["scheduled_for"],
                    "outcome": outcome.value,
                    "job_id": r["job_id"],
                    "trigger": r["trigger"],
                }
            )
            attempts.append(
                {
                    "id": r["id"],
                    "fencing_token": done.fencing_token,
                    "worker": None,
                    "outcome": outcome.value,
                    "error": done.error,
                    "now": now_us,
                }
            )
            if status is ExecutionStatus.FAILED:
                dead.append(
                    {
                        "id": r["id"],
                        "job_id": r["job_id"],
                        "tenant": r["tenant"],
                        "attempts": r["attempt"],
                        "error": done.error,
                        "now": now_us,
                        "scheduled_for": r["scheduled_for"],
                    }
                )
        final = [ExecutionStatus(f["status"]).is_final for f in finishes]
        # attempts before runs and history, in every transaction (a lock order), and before the
        # run moves on (attempt_end reads its row)
        c.executemany(
            self._q["attempt_end"],
            [a for a, ends in zip(attempts, final, strict=True) if not ends],
        )
        c.executemany(
            self._q["execution_finish"],
            [f for f, ends in zip(finishes, final, strict=True) if not ends],
        )
        self._finish_final(c, [f for f, ends in zip(finishes, final, strict=True) if ends])
        self._dead_letter(c, dead)
        # (_finish_final woke the final runs' jobs)
        self._wake_waiting(
            c, [f["job_id"] for f, ends in zip(finishes, final, strict=True) if not ends], now_us
        )
        self._usage_end(c, [r["tenant"] for r, _, _ in outcomes])  # last: the lock order

    @retried
    def execution_release(self, owner: str, held: Mapping[str, int]) -> int:
        now_us = self._now_us()
        with self._tx() as c:
            self._lock_jobs_of_runs(c, list(held))
            rows = [
                r
                for r in c.execute(
                    self._q["execution_current_tokens"], {"ids": batch_json(list(held))}
                )
                if r["status"] == "running"
                and r["lease_owner"] == owner
                and r["fencing_token"] == held[r["id"]]
            ]
            outcomes = [
                (
                    r,
                    Completion(r["id"], r["fencing_token"], False, error="released"),
                    AttemptOutcome.RELEASED,
                )
                for r in rows
                if r["started_at"] is not None
            ]
            unstarted = [r for r in rows if r["started_at"] is None]
            if unstarted:  # claimed ahead: no attempt began, so none ends
                c.execute(
                    self._q["executions_unclaim"], {"ids": batch_json([r["id"] for r in unstarted])}
                )
            self._finish(c, outcomes, now_us)
            self._usage_end(c, [r["tenant"] for r in unstarted])
        return len(rows)

    @retried
    def execution_requeue(self, execution_ids: Sequence[str]) -> int:
        if not execution_ids:
            return 0
        with self._tx() as c:
            requeued = c.execute(
                self._q["executions_requeue"], {"ids": batch_json(list(execution_ids))}
            ).fetchall()
        return len(requeued)
