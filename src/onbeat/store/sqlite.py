"""SQLiteStore: the embedded store, one file in WAL mode.

One connection guarded by a lock serves the process (SQLite has a single writer anyway); other
processes on the same file (a script calling ``app.schedule``) wait on ``busy_timeout``. Every
write is a ``BEGIN IMMEDIATE`` transaction, so the read-decide-write steps of claim, dispatch and
finish are atomic across processes. The store's clock is the injected ``Clock``: every process on
one file shares the machine's clock.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from onbeat.clock import Clock, SystemClock
from onbeat.errors import ConflictError, NotFoundError
from onbeat.model import (
    Attempt,
    AttemptOutcome,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.plan import (
    PlannedExecution,
    first_execution,
    new_id,
    plan_dispatch,
    planned,
    shard_of,
)
from onbeat.queue.base import QueueItem
from onbeat.retry import backoff_delay
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.base import (
    ClaimedRun,
    ClaimResult,
    Completion,
    DispatchParams,
    JobChanges,
    NewJob,
    ShardLeases,
)
from onbeat.store.queries import load_queries, migrations

Q = load_queries("sqlite")
OVERLAP_QUEUE_RECHECK = 0.5
"""Seconds between checks of a run waiting for its predecessor under overlap=queue."""


def to_us(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def _opt_dt(us: int | None) -> datetime | None:
    return None if us is None else from_us(us)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SQLiteStore:
    dialect = "sqlite"

    def __init__(self, path: str | Path, clock: Clock | None = None, shard_count: int = 16) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL survives a process crash (kill -9); only a power loss can roll back the newest commits.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()
        with self._tx() as c:
            if c.execute(Q["shard_count"]).fetchone()[0] == 0:
                c.executemany(Q["shard_init"], [{"shard": s} for s in range(shard_count)])
            self.shard_count: int = c.execute(Q["shard_count"]).fetchone()[0]

    # --- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._conn

    def _migrate(self) -> None:
        with self._tx() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS onbeat_migrations"
                " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
            )
            done = {row[0] for row in c.execute("SELECT version FROM onbeat_migrations")}
            for version, script in migrations("sqlite"):
                if version in done:
                    continue
                for statement in script.split(";\n"):
                    if statement.strip():
                        c.execute(statement)
                c.execute("INSERT INTO onbeat_migrations VALUES (?, ?)", (version, self._now_us()))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def now(self) -> datetime:
        return self._clock.now()

    def _now_us(self) -> int:
        return to_us(self._clock.now())

    # --- API role ---------------------------------------------------------------------------
    def job_create(self, new: NewJob) -> Job:
        now = self.now()
        job_id = new_id()
        first = first_execution(new.schedule, new.jitter, now)
        row = {
            "id": job_id,
            "tenant": new.tenant,
            "task": new.task,
            "params": json.dumps(new.params),
            **_schedule_columns(new.schedule),
            **_policy_columns(new.retry, new.timeout, new.overlap, new.misfire, new.priority),
            "catchup_window": new.catchup_window,
            "jitter": new.jitter,
            "status": JobStatus.ACTIVE.value if first else JobStatus.COMPLETED.value,
            "next_fire_at": to_us(first.scheduled_for) if first else None,
            "shard": shard_of(job_id, self.shard_count),
            "now": to_us(now),
        }
        with self._tx() as c:
            c.execute(Q["job_insert"], row)
            if first:
                self._insert_executions(c, row["id"], row["shard"], new.priority, [first])
            job = _job(c.execute(Q["job_get"], {"id": job_id}).fetchone())
        return job

    def job_get(self, job_id: str) -> Job | None:
        with self._read() as c:
            row = c.execute(Q["job_get"], {"id": job_id}).fetchone()
        return _job(row) if row else None

    def job_list(
        self,
        *,
        tenant: str | None = None,
        status: JobStatus | None = None,
        task: str | None = None,
        after_id: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        args = {
            "tenant": tenant,
            "status": status.value if status else None,
            "task": task,
            "after_id": after_id or "",
            "limit": limit,
        }
        with self._read() as c:
            return [_job(r) for r in c.execute(Q["job_list"], args)]

    def _job_for_update(self, c: sqlite3.Connection, job_id: str) -> sqlite3.Row:
        row: sqlite3.Row | None = c.execute(Q["job_get"], {"id": job_id}).fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return row

    def job_update(self, job_id: str, changes: JobChanges) -> Job:
        now = self.now()
        with self._tx() as c:
            job = _job(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be edited")
            retry = changes.retry or job.retry
            columns: dict[str, Any] = {
                "id": job_id,
                "params": json.dumps(changes.params if changes.params is not None else job.params),
                **_schedule_columns(changes.schedule or job.schedule),
                **_policy_columns(
                    retry,
                    changes.timeout if changes.timeout is not None else job.timeout,
                    changes.overlap or job.overlap,
                    changes.misfire or job.misfire,
                    changes.priority if changes.priority is not None else job.priority,
                ),
                "jitter": changes.jitter if changes.jitter is not None else job.jitter,
                "status": job.status.value,
                "next_fire_at": to_us(job.next_fire_at) if job.next_fire_at else None,
                "now": to_us(now),
            }
            if changes.schedule is not None:
                c.execute(
                    Q["executions_cancel_pending"],
                    {
                        "job_id": job_id,
                        "trigger": Trigger.SCHEDULE.value,
                        "reason": "superseded by a schedule change",
                        "now": to_us(now),
                    },
                )
                first = first_execution(changes.schedule, columns["jitter"], now)
                columns["next_fire_at"] = to_us(first.scheduled_for) if first else None
                if job.status is JobStatus.COMPLETED and first:
                    columns["status"] = JobStatus.ACTIVE.value
                if first:
                    self._insert_executions(c, job_id, job.shard, columns["priority"], [first])
            c.execute(Q["job_update"], columns)
            return _job(c.execute(Q["job_get"], {"id": job_id}).fetchone())

    def _set_status(self, c: sqlite3.Connection, job: Job, status: JobStatus) -> Job:
        c.execute(
            "UPDATE jobs SET status = ?, updated_at = ? WHERE id = ?",
            (status.value, self._now_us(), job.id),
        )
        return _job(c.execute(Q["job_get"], {"id": job.id}).fetchone())

    def job_pause(self, job_id: str) -> Job:
        with self._tx() as c:
            job = _job(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be paused")
            if job.status is not JobStatus.ACTIVE:
                return job
            return self._set_status(c, job, JobStatus.PAUSED)

    def job_resume(self, job_id: str, misfire_grace: float) -> Job:
        now = self.now()
        with self._tx() as c:
            job = _job(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be resumed")
            if job.status is not JobStatus.PAUSED:
                return job
            if job.schedule.kind is ScheduleKind.CRON:
                grace_line = to_us(now - timedelta(seconds=misfire_grace))
                stale = [
                    r
                    for r in c.execute(Q["executions_pending_of_job"], {"job_id": job_id})
                    if r["trigger"] == Trigger.SCHEDULE.value
                    and r["attempt"] == 0
                    and r["scheduled_for"] < grace_line
                ]
                for r in stale:
                    c.execute(
                        Q["execution_mark_skipped"],
                        {
                            "id": r["id"],
                            "reason": "job was paused at its fire time",
                            "now": to_us(now),
                        },
                    )
                if stale:
                    nxt = job.schedule.next_fire_after(now)
                    if nxt is not None:
                        self._insert_executions(
                            c, job_id, job.shard, job.priority, [planned(nxt, job.jitter)]
                        )
                    c.execute(
                        Q["job_set_next_fire"],
                        {
                            "id": job_id,
                            "next_fire_at": to_us(nxt) if nxt else None,
                            "now": to_us(now),
                        },
                    )
            return self._set_status(c, job, JobStatus.ACTIVE)

    def job_cancel(self, job_id: str) -> Job:
        with self._tx() as c:
            job = _job(self._job_for_update(c, job_id))
            c.execute(
                Q["executions_cancel_pending"],
                {
                    "job_id": job_id,
                    "trigger": None,
                    "reason": "job cancelled",
                    "now": self._now_us(),
                },
            )
            return self._set_status(c, job, JobStatus.CANCELLED)

    def job_run_now(self, job_id: str) -> Execution:
        now = self.now()
        with self._tx() as c:
            job = _job(self._job_for_update(c, job_id))
            if job.status in (JobStatus.CANCELLED, JobStatus.PAUSED):
                raise ConflictError(f"job {job_id!r} is {job.status.value}; resume it first")
            run = planned(now, 0.0, trigger=Trigger.MANUAL)
            self._insert_executions(c, job_id, job.shard, job.priority, [run])
            return self._execution(c, run.id)

    def _insert_executions(
        self,
        c: sqlite3.Connection,
        job_id: str,
        shard: int,
        priority: int,
        runs: Sequence[PlannedExecution],
    ) -> list[str]:
        """Insert planned runs, ignoring ones that exist already; returns the ids inserted."""
        now = self._now_us()
        inserted = []
        for run in runs:
            row = c.execute(
                Q["execution_insert"],
                {
                    "id": run.id,
                    "job_id": job_id,
                    "shard": shard,
                    "trigger": run.trigger.value,
                    "scheduled_for": to_us(run.scheduled_for),
                    "due_at": to_us(run.due_at),
                    "status": run.status.value,
                    "priority": priority,
                    "reason": run.reason,
                    "now": now,
                },
            ).fetchone()
            if row:
                inserted.append(row[0])
        return inserted

    def _execution(self, c: sqlite3.Connection, execution_id: str) -> Execution:
        row = c.execute(Q["execution_get"], {"id": execution_id}).fetchone()
        if row is None:
            raise NotFoundError(f"execution {execution_id!r} not found")
        return self._with_attempts(c, [row])[0]

    def _with_attempts(self, c: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> list[Execution]:
        by_id: dict[str, list[Attempt]] = {r["id"]: [] for r in rows}
        for a in c.execute(Q["attempts_of"], {"ids": json.dumps(list(by_id))}):
            by_id[a["execution_id"]].append(_attempt(a))
        return [_execution(r, tuple(by_id[r["id"]])) for r in rows]

    def execution_get(self, execution_id: str) -> Execution | None:
        with self._read() as c:
            row = c.execute(Q["execution_get"], {"id": execution_id}).fetchone()
            return self._with_attempts(c, [row])[0] if row else None

    def execution_list(
        self,
        job_id: str,
        *,
        status: ExecutionStatus | None = None,
        before_id: str | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        with self._read() as c:
            before = (
                c.execute(Q["execution_get"], {"id": before_id}).fetchone() if before_id else None
            )
            rows = c.execute(
                Q["execution_list"],
                {
                    "job_id": job_id,
                    "status": status.value if status else None,
                    "before_scheduled_for": before["scheduled_for"] if before else None,
                    "before_id": before_id,
                    "limit": limit,
                },
            ).fetchall()
            return self._with_attempts(c, rows)

    def dead_letter_list(
        self, *, tenant: str | None = None, after_id: str | None = None, limit: int = 100
    ) -> list[DeadLetter]:
        with self._read() as c:
            rows = c.execute(
                Q["dead_letter_list"],
                {"tenant": tenant, "after_id": after_id or "", "limit": limit},
            )
            return [
                DeadLetter(
                    execution_id=r["execution_id"],
                    job_id=r["job_id"],
                    task=r["task"],
                    params=json.loads(r["params"]),
                    attempts=r["attempts"],
                    last_error=r["last_error"],
                    created_at=from_us(r["created_at"]),
                )
                for r in rows
            ]

    def dead_letter_replay(self, execution_id: str) -> Execution:
        with self._tx() as c:
            if c.execute(Q["dead_letter_delete"], {"id": execution_id}).rowcount == 0:
                raise NotFoundError(f"dead letter {execution_id!r} not found")
            c.execute(Q["execution_replay"], {"id": execution_id, "now": self._now_us()})
            return self._execution(c, execution_id)

    def dead_letter_drop(self, execution_id: str) -> None:
        with self._tx() as c:
            if c.execute(Q["dead_letter_delete"], {"id": execution_id}).rowcount == 0:
                raise NotFoundError(f"dead letter {execution_id!r} not found")

    # --- scheduler role ---------------------------------------------------------------------
    def shard_acquire(self, owner: str, lease_ttl: float) -> ShardLeases:
        now = self._now_us()
        ttl_us = int(lease_ttl * 1_000_000)
        args = {"owner": owner, "now": now, "lease_expires_at": now + ttl_us}
        with self._tx() as c:
            c.execute(Q["scheduler_register"], args)
            c.execute(Q["scheduler_forget_dead"], {"dead_before": now - ttl_us})
            live = c.execute(Q["scheduler_live_count"]).fetchone()[0]
            fair_share = math.ceil(self.shard_count / max(live, 1))
            held = {r["shard"]: r["epoch"] for r in c.execute(Q["shard_renew"], args)}
            acquired: set[int] = set()
            if len(held) > fair_share:
                excess = sorted(held)[fair_share:]
                c.execute(Q["shard_give_up"], {"owner": owner, "shards": json.dumps(excess)})
                for shard in excess:
                    del held[shard]
            elif len(held) < fair_share:
                for r in c.execute(Q["shard_take"], {**args, "wanted": fair_share - len(held)}):
                    held[r["shard"]] = r["epoch"]
                    acquired.add(r["shard"])
        return ShardLeases(owner, held, frozenset(acquired))

    def shard_release(self, owner: str) -> None:
        with self._tx() as c:
            c.execute(Q["shard_release"], {"owner": owner})
            c.execute(Q["scheduler_unregister"], {"owner": owner})

    def _fenced_shards(self, c: sqlite3.Connection, leases: ShardLeases) -> list[int]:
        """The shards whose lease this owner still holds at the epoch it believes: a scheduler
        that stalled past its lease finds its shards gone and writes nothing to them."""
        current = c.execute(Q["shard_held"], {"owner": leases.owner, "now": self._now_us()})
        return [r["shard"] for r in current if leases.epochs.get(r["shard"]) == r["epoch"]]

    def execution_dispatch(self, params: DispatchParams) -> list[QueueItem]:
        now = self.now()
        now_us = to_us(now)
        out: list[QueueItem] = []
        with self._tx() as c:
            shards = self._fenced_shards(c, params.leases)
            if not shards:
                return []
            rows = c.execute(
                Q["execution_dispatch_candidates"],
                {
                    "shards": json.dumps(shards),
                    "horizon": to_us(now + timedelta(seconds=params.window)),
                    "limit": params.limit,
                },
            ).fetchall()
            for r in rows:
                first_dispatch = r["attempt"] == 0 and r["trigger"] == Trigger.SCHEDULE.value
                plan = plan_dispatch(
                    schedule=_schedule(r),
                    misfire=MisfirePolicy(r["misfire"]),
                    catchup_window=r["catchup_window"],
                    jitter=r["jitter"],
                    scheduled_for=from_us(r["scheduled_for"]),
                    first_dispatch=first_dispatch,
                    materialize_next=first_dispatch and r["scheduled_for"] == r["next_fire_at"],
                    now=now,
                    window=params.window,
                    misfire_grace=params.misfire_grace,
                )
                if plan.run_current:
                    c.execute(Q["execution_mark_queued"], {"id": r["id"]})
                    out.append(QueueItem(r["id"], from_us(r["due_at"]), r["priority"]))
                else:
                    c.execute(
                        Q["execution_mark_skipped"],
                        {"id": r["id"], "reason": plan.skip_reason, "now": now_us},
                    )
                    c.execute(Q["job_complete_one_shot"], {"id": r["job_id"], "now": now_us})
                runs = [*plan.also, *([plan.next_fire] if plan.next_fire else [])]
                inserted = set(
                    self._insert_executions(c, r["job_id"], r["shard"], r["priority"], runs)
                )
                out.extend(
                    QueueItem(run.id, run.due_at, r["priority"])
                    for run in plan.also
                    if run.status is ExecutionStatus.QUEUED and run.id in inserted
                )
                if plan.next_fire is not None:
                    c.execute(
                        Q["job_set_next_fire"],
                        {
                            "id": r["job_id"],
                            "next_fire_at": to_us(plan.next_fire.scheduled_for),
                            "now": now_us,
                        },
                    )
        return out

    def execution_sweep(
        self, leases: ShardLeases, shards: Sequence[int], overdue_by: float | None, limit: int
    ) -> list[QueueItem]:
        now = self.now()
        before = to_us(now - timedelta(seconds=overdue_by)) if overdue_by is not None else 2**62
        with self._read() as c:
            owned = [s for s in shards if s in leases.epochs]
            rows = c.execute(
                Q["execution_sweep"],
                {"shards": json.dumps(owned), "before": before, "limit": limit},
            )
            return [QueueItem(r["id"], from_us(r["due_at"]), r["priority"]) for r in rows]

    def execution_reap(self, leases: ShardLeases, limit: int) -> list[Execution]:
        now_us = self._now_us()
        with self._tx() as c:
            shards = self._fenced_shards(c, leases)
            rows = c.execute(
                Q["execution_expired_leases"],
                {"shards": json.dumps(shards), "now": now_us, "limit": limit},
            ).fetchall()
            for r in rows:
                retry = RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"])
                error = f"worker lost: lease expired during attempt {r['attempt']}"
                self._finish(
                    c,
                    r,
                    Completion(
                        r["id"],
                        r["fencing_token"],
                        succeeded=False,
                        error=error,
                        retry_in=backoff_delay(retry, r["attempt"])
                        if r["attempt"] < retry.max_attempts
                        else None,
                    ),
                    AttemptOutcome.LOST,
                    now_us,
                )
            return self._with_attempts(
                c, [c.execute(Q["execution_get"], {"id": r["id"]}).fetchone() for r in rows]
            )

    # --- worker role ------------------------------------------------------------------------
    def execution_claim(
        self, execution_ids: Sequence[str], owner: str, lease_ttl: float
    ) -> ClaimResult:
        now_us = self._now_us()
        lease_until = now_us + int(lease_ttl * 1_000_000)
        started: list[ClaimedRun] = []
        not_due: list[QueueItem] = []
        with self._tx() as c:
            rows = c.execute(
                Q["execution_claim_candidates"], {"ids": json.dumps(list(execution_ids))}
            ).fetchall()
            rows = [r for r in rows if r["status"] == ExecutionStatus.QUEUED.value]
            running: dict[str, list[str]] = {}
            for r in c.execute(
                Q["execution_running_of_jobs"],
                {"job_ids": json.dumps(sorted({r["job_id"] for r in rows}))},
            ):
                running.setdefault(r["job_id"], []).append(r["id"])
            for r in sorted(rows, key=lambda r: (r["due_at"], r["id"])):
                job_status = JobStatus(r["job_status"])
                if job_status is JobStatus.CANCELLED:
                    c.execute(
                        Q["execution_mark_skipped"],
                        {"id": r["id"], "reason": "job cancelled", "now": now_us},
                    )
                    continue
                if job_status is JobStatus.PAUSED:
                    c.execute(
                        Q["execution_defer"],
                        {"id": r["id"], "due_at": r["due_at"], "reason": "held: job paused"},
                    )
                    continue
                if r["due_at"] > now_us:
                    not_due.append(QueueItem(r["id"], from_us(r["due_at"]), r["priority"]))
                    continue
                overlap = OverlapPolicy(r["overlap"])
                busy = running.get(r["job_id"], [])
                replaced: tuple[str, ...] = ()
                if busy and overlap is OverlapPolicy.SKIP:
                    reason = f"overlap=skip: execution {busy[0]} of this job was still running"
                    c.execute(
                        Q["execution_mark_skipped"],
                        {"id": r["id"], "reason": reason, "now": now_us},
                    )
                    continue
                if busy and overlap is OverlapPolicy.QUEUE:
                    c.execute(
                        Q["execution_defer"],
                        {
                            "id": r["id"],
                            "due_at": now_us + int(OVERLAP_QUEUE_RECHECK * 1_000_000),
                            "reason": f"overlap=queue: waiting for execution {busy[0]}",
                        },
                    )
                    continue
                if busy and overlap is OverlapPolicy.REPLACE:
                    for victim in busy:
                        gone = c.execute(
                            Q["execution_replace"],
                            {
                                "id": victim,
                                "reason": f"replaced by execution {r['id']}",
                                "now": now_us,
                            },
                        ).fetchone()
                        if gone:
                            c.execute(
                                Q["attempt_finish"],
                                {
                                    "id": victim,
                                    "fencing_token": gone["fencing_token"],
                                    "outcome": AttemptOutcome.CANCELLED.value,
                                    "error": f"replaced by execution {r['id']}",
                                    "now": now_us,
                                },
                            )
                    replaced = tuple(busy)
                    busy.clear()
                row = c.execute(
                    Q["execution_start"],
                    {"id": r["id"], "owner": owner, "lease_expires_at": lease_until, "now": now_us},
                ).fetchone()
                c.execute(
                    Q["attempt_insert"],
                    {
                        "id": row["id"],
                        "attempt": row["attempt"],
                        "owner": owner,
                        "fencing_token": row["fencing_token"],
                        "now": now_us,
                    },
                )
                running.setdefault(r["job_id"], []).append(r["id"])
                started.append(
                    ClaimedRun(
                        execution=_execution(row, ()),
                        task=r["task"],
                        params=json.loads(r["params"]),
                        timeout=r["timeout"],
                        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
                        replaced=replaced,
                    )
                )
        return ClaimResult(started, not_due)

    def execution_heartbeat(self, owner: str, lease_ttl: float) -> dict[str, int]:
        lease_until = self._now_us() + int(lease_ttl * 1_000_000)
        with self._tx() as c:
            rows = c.execute(
                Q["execution_heartbeat"], {"owner": owner, "lease_expires_at": lease_until}
            )
            return {r["id"]: r["fencing_token"] for r in rows}

    def execution_finish_many(self, completions: Sequence[Completion]) -> list[str]:
        now_us = self._now_us()
        accepted = []
        with self._tx() as c:
            current = {
                r["id"]: r
                for r in c.execute(
                    Q["execution_current_tokens"],
                    {"ids": json.dumps([x.execution_id for x in completions])},
                )
            }
            for done in completions:
                r = current.get(done.execution_id)
                if (
                    r is None
                    or r["status"] != "running"
                    or r["fencing_token"] != done.fencing_token
                ):
                    continue
                if done.succeeded:
                    outcome = AttemptOutcome.SUCCEEDED
                elif done.timed_out:
                    outcome = AttemptOutcome.TIMED_OUT
                else:
                    outcome = AttemptOutcome.FAILED
                self._finish(c, r, done, outcome, now_us)
                accepted.append(done.execution_id)
        return accepted

    def _finish(
        self,
        c: sqlite3.Connection,
        r: sqlite3.Row,
        done: Completion,
        outcome: AttemptOutcome,
        now_us: int,
    ) -> None:
        """Move a running execution (token already checked) to its next state, and log the attempt."""
        due_at, reason, uncount = None, None, 0
        if done.succeeded:
            status = ExecutionStatus.SUCCEEDED
        elif outcome is AttemptOutcome.RELEASED:
            status, due_at, uncount = ExecutionStatus.SCHEDULED, now_us, 1
            reason = "released by a stopping worker"
        elif r["job_status"] == JobStatus.CANCELLED.value:
            status, reason = ExecutionStatus.CANCELLED, "job cancelled"
        elif done.retry_in is not None:
            status = ExecutionStatus.SCHEDULED
            due_at = now_us + int(done.retry_in * 1_000_000)
            reason = f"retry after attempt {r['attempt']} failed"
        else:
            status = ExecutionStatus.FAILED
        c.execute(
            Q["execution_finish"],
            {
                "id": r["id"],
                "fencing_token": done.fencing_token,
                "status": status.value,
                "due_at": due_at,
                "result": json.dumps(done.result) if done.succeeded else None,
                "error": done.error,
                "reason": reason,
                "uncount_attempt": uncount,
                "now": now_us,
            },
        )
        c.execute(
            Q["attempt_finish"],
            {
                "id": r["id"],
                "fencing_token": done.fencing_token,
                "outcome": outcome.value,
                "error": done.error,
                "now": now_us,
            },
        )
        if status is ExecutionStatus.FAILED:
            tenant = c.execute("SELECT tenant FROM jobs WHERE id = ?", (r["job_id"],)).fetchone()[0]
            c.execute(
                Q["dead_letter_insert"],
                {
                    "id": r["id"],
                    "job_id": r["job_id"],
                    "tenant": tenant,
                    "attempts": r["attempt"],
                    "error": done.error,
                    "now": now_us,
                },
            )
        if status.is_final and r["trigger"] == Trigger.SCHEDULE.value:
            c.execute(Q["job_complete_one_shot"], {"id": r["job_id"], "now": now_us})

    def execution_release(self, owner: str, held: Mapping[str, int]) -> int:
        now_us = self._now_us()
        released = 0
        with self._tx() as c:
            for r in c.execute(
                Q["execution_current_tokens"], {"ids": json.dumps(list(held))}
            ).fetchall():
                if r["status"] == "running" and r["fencing_token"] == held[r["id"]]:
                    done = Completion(
                        r["id"], r["fencing_token"], succeeded=False, error="released"
                    )
                    self._finish(c, r, done, AttemptOutcome.RELEASED, now_us)
                    released += 1
        return released


# --- row mapping ------------------------------------------------------------------------------
def _schedule_columns(schedule: Schedule) -> dict[str, Any]:
    return {
        "schedule_kind": schedule.kind.value,
        "schedule_expression": schedule.expression,
        "schedule_at": to_us(schedule.at) if schedule.at else None,
        "timezone": schedule.timezone,
    }


def _policy_columns(
    retry: RetryPolicy,
    timeout: float | None,
    overlap: OverlapPolicy,
    misfire: MisfirePolicy,
    priority: int,
) -> dict[str, Any]:
    return {
        "max_attempts": retry.max_attempts,
        "backoff_base": retry.backoff_base,
        "backoff_cap": retry.backoff_cap,
        "timeout": timeout,
        "overlap": overlap.value,
        "misfire": misfire.value,
        "priority": priority,
    }


_SCHEDULES: dict[tuple[Any, ...], Schedule] = {}


def _schedule(r: sqlite3.Row) -> Schedule:
    """Rebuild a job's Schedule; cached, since a parsed cron expression is reused for every fire."""
    key = (r["schedule_kind"], r["schedule_expression"], r["schedule_at"], r["timezone"])
    schedule = _SCHEDULES.get(key)
    if schedule is None:
        if len(_SCHEDULES) > 100_000:
            _SCHEDULES.clear()
        schedule = _SCHEDULES[key] = Schedule(
            kind=ScheduleKind(key[0]),
            expression=key[1],
            at=_opt_dt(key[2]),
            timezone=key[3],
        )
    return schedule


def _job(r: sqlite3.Row) -> Job:
    return Job(
        id=r["id"],
        task=r["task"],
        params=json.loads(r["params"]),
        schedule=_schedule(r),
        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
        timeout=r["timeout"],
        overlap=OverlapPolicy(r["overlap"]),
        misfire=MisfirePolicy(r["misfire"]),
        catchup_window=r["catchup_window"],
        priority=r["priority"],
        jitter=r["jitter"],
        tenant=r["tenant"],
        status=JobStatus(r["status"]),
        next_fire_at=_opt_dt(r["next_fire_at"]),
        shard=r["shard"],
        created_at=from_us(r["created_at"]),
        updated_at=from_us(r["updated_at"]),
    )


def _attempt(a: sqlite3.Row) -> Attempt:
    return Attempt(
        attempt=a["attempt"],
        worker=a["worker"],
        fencing_token=a["fencing_token"],
        started_at=from_us(a["started_at"]),
        finished_at=_opt_dt(a["finished_at"]),
        outcome=AttemptOutcome(a["outcome"]),
        error=a["error"],
    )


def _execution(r: sqlite3.Row, attempts: tuple[Attempt, ...]) -> Execution:
    return Execution(
        id=r["id"],
        job_id=r["job_id"],
        shard=r["shard"],
        trigger=Trigger(r["trigger"]),
        scheduled_for=from_us(r["scheduled_for"]),
        due_at=from_us(r["due_at"]),
        status=ExecutionStatus(r["status"]),
        attempt=r["attempt"],
        priority=r["priority"],
        lease_owner=r["lease_owner"],
        lease_expires_at=_opt_dt(r["lease_expires_at"]),
        fencing_token=r["fencing_token"],
        result=json.loads(r["result"]) if r["result"] is not None else None,
        last_error=r["last_error"],
        reason=r["reason"],
        created_at=from_us(r["created_at"]),
        started_at=_opt_dt(r["started_at"]),
        finished_at=_opt_dt(r["finished_at"]),
        attempts=attempts,
    )
