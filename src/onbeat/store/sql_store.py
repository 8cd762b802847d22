"""SQLStore: the Store's transactions, shared by every SQL backend.

Each method is one transaction that reads rows, hands them to the pure decisions of ``plan``
(dispatch, claim, misfire, overlap) and writes the outcome in batched statements. A backend
supplies its connection handling, its clock and its named statements (``sql/<backend>/queries.sql``,
the same names with the same parameters in every backend); the policy lives here once.

Isolation: a backend must make each method's read-decide-write atomic against every other
process. SQLite does it by serialising writers (``BEGIN IMMEDIATE``); PostgreSQL, under READ
COMMITTED, by row locks its statements take (``FOR UPDATE`` in the reads a decision rests on,
locks on the jobs of a claim in ``_lock_jobs``, the shard rows in ``_fenced_shards``), and by
conditions re-checked in every UPDATE (status, fencing token, lease expiry). ``store/base.py``
says what each method guarantees.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from onbeat.auth import ApiKey
from onbeat.errors import (
    ConflictError,
    NotFoundError,
    UnreadableRecordError,
    ValidationError,
)
from onbeat.model import (
    Attempt,
    AttemptOutcome,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobEvent,
    JobEventKind,
    JobStatus,
    MisfirePolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.plan import (
    BACKLOG_LATENESS,
    PAUSED_AT_FIRE_TIME,
    WAITING,
    PlannedExecution,
    RunningRun,
    first_execution,
    new_id,
    plan_claim,
    plan_dispatch,
    plan_finish,
    plan_missed_while_paused,
    plan_reap,
    planned,
    shard_of,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.base import (
    MAX_SEARCH_TASKS,
    ActivityBucket,
    ClaimedRun,
    ClaimResult,
    Completion,
    CreatedJob,
    DispatchParams,
    JobChanges,
    NewJob,
    PublishedTask,
    SchedulerShards,
    ShardLeases,
    SweepCursor,
    SweepPage,
    TaskDefaults,
    WorkerLoad,
)
from onbeat.store.rows import (
    MAX_US,
    TEXT_MAX,
    after_last,
    api_key_of,
    attempt_of,
    claim_candidate,
    execution_of,
    fingerprint,
    from_us,
    job_of,
    opt_dt,
    policy_columns,
    prefix_end,
    published_task_of,
    readable_job,
    schedule_columns,
    schedule_of,
    to_us,
    unique,
)

log = logging.getLogger("onbeat.store")


MAX_CONFLICT_RETRIES = 5
"""Times a transaction runs when the database aborts it for a conflict (a deadlock)."""
_P = ParamSpec("_P")
_T = TypeVar("_T")
_S = TypeVar("_S", bound="SQLStore")


def retried(method: Callable[Concatenate[_S, _P], _T]) -> Callable[Concatenate[_S, _P], _T]:
    """Run a transaction again, after a short random pause, when the backend aborted it for a
    conflict with another (``_retry_errors``): nothing of it was committed."""

    @functools.wraps(method)
    def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in itertools.count(1):
            try:
                return method(self, *args, **kwargs)
            except self._retry_errors:
                if attempt == MAX_CONFLICT_RETRIES:
                    raise
                log.info(
                    "%s conflicted with another transaction; running it again", method.__name__
                )
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise AssertionError("unreachable")

    return run


class _KeyTaken(Exception):
    """A concurrent submission under the same idempotency key committed first."""


IDEMPOTENCY_RETENTION = timedelta(days=1)
Row = Any
"""A result row, read by column name (``row["id"]``) or position (``row[0]``)."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row: ...

    def fetchall(self) -> list[Row]: ...

    def __iter__(self) -> Iterator[Row]: ...


class Connection(Protocol):
    """What the transactions need of a backend's connection (sqlite3's interface)."""

    def execute(self, sql: str, parameters: Mapping[str, Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Mapping[str, Any]], /) -> object: ...


class SQLStore:
    """The transactions of ``Store`` over a backend's named statements (``_q``)."""

    shard_count: int
    _q: Mapping[str, str]
    _retry_errors: tuple[type[Exception], ...] = ()
    """Errors by which the backend aborts a transaction for a conflict; it is run again."""

    # --- what a backend provides ------------------------------------------------------------
    def _tx(self) -> AbstractContextManager[Connection]:
        """A write transaction, committed when the block ends, rolled back if it raises."""
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Connection]:
        """A connection for reads that need no transaction of their own."""
        raise NotImplementedError

    def now(self) -> datetime:
        raise NotImplementedError

    def _now_us(self) -> int:
        return to_us(self.now())

    def _lock_jobs_of_runs(self, c: Connection, execution_ids: Sequence[str]) -> None:
        """Lock the jobs of these runs until commit, so decisions about one job's runs (a claim's
        overlap check, an outcome that wakes the runs waiting for it) are taken one at a time.
        Every transaction locks jobs before runs. A backend that serialises writers has nothing
        to do."""

    def _lock_shard_map(self, c: Connection) -> None:
        """Make ``shard_acquire``'s read of the live schedulers and leases, and the share it takes
        from them, one at a time across processes."""

    # --- API role ---------------------------------------------------------------------------
    def job_create(self, new: NewJob) -> CreatedJob:
        return self.job_create_many([new])[0]

    @retried
    def job_create_many(self, news: Sequence[NewJob]) -> list[CreatedJob]:
        try:
            return self._create_jobs(news)
        except _KeyTaken:  # rolled back; this time the lookup finds the other submission's job
            return self._create_jobs(news)

    def _create_jobs(self, news: Sequence[NewJob]) -> list[CreatedJob]:
        """Insert the jobs, their creation events and first runs with one statement each, in one
        transaction. A job with an idempotency key is looked up first, in submission order, so a
        key repeated within the batch returns the job its first use made."""
        now = self.now()
        rows: list[dict[str, Any]] = []
        firsts: list[tuple[str, int, int, PlannedExecution]] = []
        answers: list[Job | str] = []  # a job replayed, or the id of one created
        with self._tx() as c:
            for new in news:
                if new.idempotency_key is not None:
                    replayed = self._idempotent_job(c, new, now)
                    if replayed is not None:
                        answers.append(replayed)
                        continue
                row, first = self._job_row(new, now)
                if new.idempotency_key is not None:
                    # Inserted now (the key refers to it); the key's insert decides: of
                    # concurrent submissions under one key, the others wait for the first to
                    # commit and insert nothing.
                    c.execute(self._q["job_insert"], row)
                    key = {
                        "tenant": new.tenant,
                        "key": new.idempotency_key,
                        "fingerprint": fingerprint(new),
                        "job_id": row["id"],
                        "now": row["now"],
                    }
                    if c.execute(self._q["idempotency_key_insert"], key).fetchone() is None:
                        raise _KeyTaken
                else:
                    rows.append(row)
                if first:
                    firsts.append((row["id"], row["shard"], new.priority, first))
                answers.append(row["id"])
            c.executemany(self._q["job_insert"], rows)
            created = [a for a in answers if isinstance(a, str)]
            c.executemany(
                self._q["job_event_insert"],
                [
                    {"id": job_id, "kind": JobEventKind.CREATED.value, "now": to_us(now)}
                    for job_id in created
                ],
            )
            self._insert_planned(c, firsts)
            jobs = {
                r["id"]: job_of(r)
                for r in c.execute(self._q["jobs_by_ids"], {"ids": json.dumps(created)})
            }
        return [
            CreatedJob(jobs[a], replayed=False) if isinstance(a, str) else CreatedJob(a, True)
            for a in answers
        ]

    def _job_row(
        self, new: NewJob, now: datetime
    ) -> tuple[dict[str, Any], PlannedExecution | None]:
        """A new job's row, and its first run (None if its schedule never fires)."""
        job_id = new_id()
        first = first_execution(new.schedule, new.jitter, now)
        row = {
            "id": job_id,
            "tenant": new.tenant,
            "task": new.task,
            "params": json.dumps(new.params),
            **schedule_columns(new.schedule),
            **policy_columns(new.retry, new.timeout, new.overlap, new.misfire, new.priority),
            "catchup_window": new.catchup_window,
            "jitter": new.jitter,
            "status": JobStatus.ACTIVE.value if first else JobStatus.COMPLETED.value,
            "next_fire_at": to_us(first.scheduled_for) if first else None,
            "shard": shard_of(job_id, self.shard_count),
            "now": to_us(now),
        }
        return row, first

    def _idempotent_job(self, c: Connection, new: NewJob, now: datetime) -> Job | None:
        c.execute(self._q["idempotency_key_prune"], {"before": to_us(now - IDEMPOTENCY_RETENTION)})
        found = c.execute(
            self._q["idempotency_key_get"], {"tenant": new.tenant, "key": new.idempotency_key}
        ).fetchone()
        if found is None:
            return None
        if found["fingerprint"] != fingerprint(new):
            raise ValidationError(
                "Idempotency-Key", "was already used for a different submission; use a new key"
            )
        return job_of(self._job_for_update(c, found["job_id"]))

    def job_get(self, job_id: str) -> Job | None:
        with self._read() as c:
            row = c.execute(self._q["job_get"], {"id": job_id}).fetchone()
        return readable_job(row) if row else None

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
        }
        jobs: list[Job] = []
        with self._read() as c:
            while len(jobs) < limit:  # an unreadable row is left out, and the next one read
                wanted = limit - len(jobs)
                rows = c.execute(self._q["job_list"], {**args, "limit": wanted}).fetchall()
                for row in rows:
                    try:
                        jobs.append(readable_job(row))
                    except UnreadableRecordError as exc:
                        log.error("%s; it is left out of the listing", exc)
                if len(rows) < wanted:
                    break
                args["after_id"] = rows[-1]["id"]
        return jobs

    def _job_for_update(self, c: Connection, job_id: str) -> Row:
        row: Row | None = c.execute(self._q["job_get_for_update"], {"id": job_id}).fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return row

    @retried
    def job_update(self, job_id: str, changes: JobChanges) -> Job:
        now = self.now()
        with self._tx() as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be edited")
            retry = changes.retry or job.retry
            columns: dict[str, Any] = {
                "id": job_id,
                "params": json.dumps(changes.params if changes.params is not None else job.params),
                **schedule_columns(changes.schedule or job.schedule),
                **policy_columns(
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
                # The old schedule was in force until now: its fire times up to now keep (or get)
                # their records and run as planned; its future ones were never due and go.
                self._record_fires_until(c, job, now)
                c.execute(
                    self._q["executions_drop_future"],
                    {"job_id": job_id, "after": to_us(now)},
                )
                head = self._plan_head(
                    c,
                    job_id,
                    job.shard,
                    changes.schedule,
                    columns["jitter"],
                    columns["priority"],
                    changes.schedule.first_fire(now),
                )
                columns["next_fire_at"] = to_us(head) if head else None
                if job.status is JobStatus.COMPLETED and head:
                    columns["status"] = JobStatus.ACTIVE.value
            c.execute(self._q["job_update"], columns)
            if changes.schedule is not None:
                self._event(c, job_id, JobEventKind.RESCHEDULED, to_us(now))
            return job_of(c.execute(self._q["job_get"], {"id": job_id}).fetchone())

    def _record_fires_until(self, c: Connection, job: Job, now: datetime) -> None:
        """Give every fire time of the job's schedule up to ``now`` its record, before the schedule
        changes or the job is cancelled: after a stall the chain's head lies in the past and the
        fire times after it were never planned. They are inserted as scheduled runs due at their
        fire time, so the dispatcher applies the misfire policy to them as to any late run."""
        head = job.next_fire_at
        if job.schedule.kind is not ScheduleKind.CRON or head is None or head > now:
            return
        fires = []
        fire = job.schedule.next_fire_after(head)
        while fire is not None and fire <= now:
            fires.append(planned(fire, job.jitter))
            fire = job.schedule.next_fire_after(fire)
        self._insert_executions(c, job.id, job.shard, job.priority, fires)

    def _replan(
        self,
        c: Connection,
        job_id: str,
        shard: int,
        schedule: Schedule,
        jitter: float,
        priority: int,
        fire: datetime | None,
    ) -> None:
        """``_plan_head`` from ``fire`` on, and record the result as the job's next fire time."""
        head = self._plan_head(c, job_id, shard, schedule, jitter, priority, fire)
        c.execute(
            self._q["job_set_next_fire"],
            {"id": job_id, "next_fire_at": to_us(head) if head else None, "now": self._now_us()},
        )

    def _plan_head(
        self,
        c: Connection,
        job_id: str,
        shard: int,
        schedule: Schedule,
        jitter: float,
        priority: int,
        fire: datetime | None,
    ) -> datetime | None:
        """Make the first fire time from ``fire`` on that has no started or finished run the job's
        next planned run (status scheduled), and return it. A fire time that already has a queued,
        running or final run is taken care of, so the chain goes on after it; inserting blindly
        (ON CONFLICT DO NOTHING) would leave the job with no planned run, silent for good."""
        while fire is not None:
            row = c.execute(
                self._q["execution_schedule_run_at"],
                {"job_id": job_id, "scheduled_for": to_us(fire)},
            ).fetchone()
            if row is None:
                run = planned(fire, jitter if schedule.kind is ScheduleKind.CRON else 0.0)
                self._insert_executions(c, job_id, shard, priority, [run])
                return fire
            if row["status"] == ExecutionStatus.SCHEDULED.value:
                return fire
            fire = schedule.next_fire_after(fire)
        return None

    def _set_status(
        self,
        c: Connection,
        job: Job,
        status: JobStatus,
        event: JobEventKind,
        now: datetime | None = None,
    ) -> Job:
        now_us = self._now_us() if now is None else to_us(now)
        c.execute(self._q["job_set_status"], {"id": job.id, "status": status.value, "now": now_us})
        self._event(c, job.id, event, now_us)
        return job_of(c.execute(self._q["job_get"], {"id": job.id}).fetchone())

    def _event(self, c: Connection, job_id: str, kind: JobEventKind, at_us: int) -> None:
        """Record a change of the job's firing, at the same instant as the change it records (the
        audit computes a now-job's fire time from it)."""
        c.execute(self._q["job_event_insert"], {"id": job_id, "kind": kind.value, "now": at_us})

    @retried
    def job_pause(self, job_id: str) -> Job:
        with self._tx() as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be paused")
            if job.status is not JobStatus.ACTIVE:
                return job
            return self._set_status(c, job, JobStatus.PAUSED, JobEventKind.PAUSED)

    @retried
    def job_resume(self, job_id: str, misfire_grace: float) -> Job:
        now = self.now()
        with self._tx() as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be resumed")
            if job.status is not JobStatus.PAUSED:
                return job
            pending = c.execute(self._q["executions_pending_of_job"], {"job_id": job_id}).fetchall()
            if job.schedule.kind is ScheduleKind.CRON:
                grace_line = to_us(now - timedelta(seconds=misfire_grace))
                stale = [
                    r
                    for r in pending
                    if r["trigger"] == Trigger.SCHEDULE.value
                    and r["attempt"] == 0
                    and r["scheduled_for"] < grace_line
                ]
                if stale:
                    self._end_pending(c, stale, ExecutionStatus.SKIPPED, PAUSED_AT_FIRE_TIME)
                    skipped, after_grace = plan_missed_while_paused(
                        job.schedule,
                        from_us(max(r["scheduled_for"] for r in stale)),
                        from_us(grace_line),
                        job.jitter,
                    )
                    self._insert_executions(c, job_id, job.shard, job.priority, skipped)
                    head = job.next_fire_at
                    if head is None or to_us(head) < grace_line:
                        head = after_grace
                    self._replan(c, job_id, job.shard, job.schedule, job.jitter, job.priority, head)
            else:  # a one-shot run held by the pause runs now, not as a misfire
                c.executemany(
                    self._q["execution_due_now"],
                    [{"id": r["id"], "now": to_us(now)} for r in pending],
                )
            return self._set_status(c, job, JobStatus.ACTIVE, JobEventKind.RESUMED)

    @retried
    def job_cancel(self, job_id: str) -> Job:
        with self._tx() as c:
            job = job_of(self._job_for_update(c, job_id))
            # One instant for all of it: the fire times up to the cancel event's instant (where
            # the audit ends the job's active time) must all have their records.
            now = self.now()
            if job.status is not JobStatus.CANCELLED:
                self._record_fires_until(c, job, now)
            c.execute(
                self._q["executions_cancel_pending"],
                {"job_id": job_id, "reason": "job cancelled", "now": to_us(now)},
            )
            return self._set_status(c, job, JobStatus.CANCELLED, JobEventKind.CANCELLED, now)

    @retried
    def job_run_now(self, job_id: str) -> Execution:
        now = self.now()
        with self._tx() as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status in (JobStatus.CANCELLED, JobStatus.PAUSED):
                raise ConflictError(f"job {job_id!r} is {job.status.value}; resume it first")
            # Two manual runs requested in the same microsecond are two runs, not one.
            while True:
                run = planned(now, 0.0, trigger=Trigger.MANUAL)
                if self._insert_executions(c, job_id, job.shard, job.priority, [run]):
                    return self._execution(c, run.id)
                now += timedelta(microseconds=1)

    def _insert_executions(
        self,
        c: Connection,
        job_id: str,
        shard: int,
        priority: int,
        runs: Sequence[PlannedExecution],
    ) -> set[str]:
        return self._insert_planned(c, [(job_id, shard, priority, run) for run in runs])

    def _insert_planned(
        self, c: Connection, planned_runs: Sequence[tuple[str, int, int, PlannedExecution]]
    ) -> set[str]:
        """Insert (job_id, shard, priority, run) rows, ignoring runs that exist already (same job,
        fire time and trigger); returns the ids actually inserted."""
        if not planned_runs:
            return set()
        now = self._now_us()
        c.executemany(
            self._q["execution_insert"],
            [
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
                    "catchup": run.catchup,
                    "now": now,
                }
                for job_id, shard, priority, run in planned_runs
            ],
        )
        ids = json.dumps([run.id for *_, run in planned_runs])
        return {r[0] for r in c.execute(self._q["executions_existing"], {"ids": ids})}

    def _end_pending(
        self,
        c: Connection,
        rows: Sequence[Row],
        status: ExecutionStatus,
        reason: str | Sequence[str],
    ) -> None:
        """Skip or cancel pending runs (rows with id, job_id, trigger), each with its reason; a
        one-shot job whose scheduled run ends this way is completed."""
        now = self._now_us()
        reasons = [reason] * len(rows) if isinstance(reason, str) else reason
        c.executemany(
            self._q["execution_end_pending"],
            [
                {"id": r["id"], "status": status.value, "reason": why, "now": now}
                for r, why in zip(rows, reasons, strict=True)
            ],
        )
        self._complete_one_shots(c, rows)

    def _complete_one_shots(self, c: Connection, rows: Sequence[Row]) -> None:
        ids = sorted({r["job_id"] for r in rows if r["trigger"] == Trigger.SCHEDULE.value})
        if ids:
            c.execute(
                self._q["job_complete_one_shot"], {"ids": json.dumps(ids), "now": self._now_us()}
            )

    def _execution(self, c: Connection, execution_id: str) -> Execution:
        row = c.execute(self._q["execution_get"], {"id": execution_id}).fetchone()
        if row is None:
            raise NotFoundError(f"execution {execution_id!r} not found")
        return self._with_attempts(c, [row])[0]

    def _with_attempts(self, c: Connection, rows: Sequence[Row]) -> list[Execution]:
        by_id: dict[str, list[Attempt]] = {r["id"]: [] for r in rows}
        for a in c.execute(self._q["attempts_of"], {"ids": json.dumps(list(by_id))}):
            by_id[a["execution_id"]].append(attempt_of(a))
        return [execution_of(r, tuple(by_id[r["id"]])) for r in rows]

    def execution_get(self, execution_id: str) -> Execution | None:
        with self._read() as c:
            row = c.execute(self._q["execution_get"], {"id": execution_id}).fetchone()
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
                c.execute(self._q["execution_get"], {"id": before_id}).fetchone()
                if before_id
                else None
            )
            rows = c.execute(
                self._q["execution_list"],
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
                self._q["dead_letter_list"]
                if tenant is None
                else self._q["dead_letter_list_of_tenant"],
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

    @retried
    def dead_letter_replay(self, execution_id: str) -> Execution:
        with self._tx() as c:
            if c.execute(self._q["dead_letter_delete"], {"id": execution_id}).rowcount == 0:
                raise NotFoundError(f"dead letter {execution_id!r} not found")
            job_id = self._execution(c, execution_id).job_id
            if job_of(self._job_for_update(c, job_id)).status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled; its runs cannot be replayed")
            c.execute(self._q["execution_replay"], {"id": execution_id, "now": self._now_us()})
            return self._execution(c, execution_id)

    def dead_letter_drop(self, execution_id: str) -> None:
        with self._tx() as c:
            if c.execute(self._q["dead_letter_delete"], {"id": execution_id}).rowcount == 0:
                raise NotFoundError(f"dead letter {execution_id!r} not found")

    def job_events(self, job_id: str) -> list[JobEvent]:
        with self._read() as c:
            return [
                JobEvent(from_us(r["at"]), JobEventKind(r["kind"]), schedule_of(r))
                for r in c.execute(self._q["job_events"], {"job_id": job_id})
            ]

    def execution_fire_records(
        self, job_id: str, since: datetime, until: datetime
    ) -> list[tuple[datetime, ExecutionStatus]]:
        with self._read() as c:
            rows = c.execute(
                self._q["execution_fire_times"],
                {"job_id": job_id, "since": to_us(since), "until": to_us(until)},
            )
            return [(from_us(r["scheduled_for"]), ExecutionStatus(r["status"])) for r in rows]

    # --- API keys ---------------------------------------------------------------------------
    def api_key_insert(self, key: ApiKey, key_hash: str) -> None:
        with self._tx() as c:
            c.execute(
                self._q["api_key_insert"],
                {
                    "id": key.id,
                    "key_hash": key_hash,
                    "tenant": key.tenant,
                    "role": key.role.value,
                    "now": to_us(key.created_at),
                },
            )

    def api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        with self._read() as c:
            row = c.execute(self._q["api_key_by_hash"], {"key_hash": key_hash}).fetchone()
        return api_key_of(row) if row else None

    def api_key_list(self) -> list[ApiKey]:
        with self._read() as c:
            return [api_key_of(r) for r in c.execute(self._q["api_key_list"])]

    def api_key_revoke(self, key_id: str) -> bool:
        with self._tx() as c:
            return (
                c.execute(self._q["api_key_revoke"], {"id": key_id, "now": self._now_us()}).rowcount
                > 0
            )

    def api_key_count_active(self) -> int:
        with self._read() as c:
            count: int = c.execute(self._q["api_key_count_active"]).fetchone()[0]
        return count

    # --- scheduler role ---------------------------------------------------------------------
    @retried
    def shard_acquire(self, owner: str, lease_ttl: float) -> ShardLeases:
        now = self._now_us()
        ttl_us = int(lease_ttl * 1_000_000)
        args = {"owner": owner, "now": now, "lease_expires_at": now + ttl_us}
        with self._tx() as c:
            self._lock_shard_map(c)
            c.execute(self._q["scheduler_register"], args)
            c.execute(self._q["scheduler_forget_dead"], {"dead_before": now - ttl_us})
            # As even as possible: the first (shards % live) owners, by name, hold one shard more.
            live = [r[0] for r in c.execute(self._q["scheduler_live"])]
            base, extra = divmod(self.shard_count, len(live))
            fair_share = base + (1 if live.index(owner) < extra else 0)
            held = {r["shard"]: r["epoch"] for r in c.execute(self._q["shard_renew"], args)}
            acquired: set[int] = set()
            if len(held) > fair_share:
                excess = sorted(held)[fair_share:]
                c.execute(self._q["shard_give_up"], {"owner": owner, "shards": json.dumps(excess)})
                for shard in excess:
                    del held[shard]
            elif len(held) < fair_share:
                for r in c.execute(
                    self._q["shard_take"], {**args, "wanted": fair_share - len(held)}
                ):
                    held[r["shard"]] = r["epoch"]
                    acquired.add(r["shard"])
        return ShardLeases(owner, held, frozenset(acquired))

    @retried
    def shard_release(self, owner: str) -> None:
        with self._tx() as c:
            c.execute(self._q["shard_release"], {"owner": owner})
            c.execute(self._q["scheduler_unregister"], {"owner": owner})

    def _fenced_shards(self, c: Connection, leases: ShardLeases) -> list[int]:
        """The shards whose lease this owner still holds at the epoch it believes: a scheduler
        that stalled past its lease finds its shards gone and writes nothing to them."""
        current = c.execute(self._q["shard_held"], {"owner": leases.owner, "now": self._now_us()})
        return [r["shard"] for r in current if leases.epochs.get(r["shard"]) == r["epoch"]]

    @retried
    def execution_dispatch(self, params: DispatchParams) -> list[QueueItem]:
        now = self.now()
        now_us = to_us(now)
        out: list[QueueItem] = []
        with self._tx() as c:
            shards = self._fenced_shards(c, params.leases)
            if not shards:
                return []
            rows = c.execute(
                self._q["execution_dispatch_candidates"],
                {
                    "shards": json.dumps(shards),
                    "horizon": to_us(now + timedelta(seconds=params.window)),
                    "limit": params.limit,
                },
            ).fetchall()
            to_queue: list[str] = []
            catchups: list[str] = []
            to_skip: list[tuple[Row, str]] = []
            new_runs: list[tuple[str, int, int, PlannedExecution]] = []
            next_fires: dict[str, tuple[Row, PlannedExecution]] = {}
            for r in rows:
                first_dispatch = r["attempt"] == 0 and r["trigger"] == Trigger.SCHEDULE.value
                plan = plan_dispatch(
                    schedule=schedule_of(r),
                    misfire=MisfirePolicy(r["misfire"]),
                    catchup_window=r["catchup_window"],
                    jitter=r["jitter"],
                    scheduled_for=from_us(r["scheduled_for"]),
                    due_at=from_us(r["due_at"]),
                    first_dispatch=first_dispatch,
                    materialize_next=first_dispatch and r["scheduled_for"] == r["next_fire_at"],
                    now=now,
                    window=params.window,
                    misfire_grace=params.misfire_grace,
                    next_recorded=opt_dt(r["next_recorded"]),
                )
                if plan.current.run:
                    to_queue.append(r["id"])
                    if plan.current.catchup:
                        catchups.append(r["id"])
                    out.append(QueueItem(r["id"], from_us(r["due_at"]), r["priority"], r["shard"]))
                else:
                    to_skip.append((r, plan.current.reason or "skipped"))
                new_runs.extend((r["job_id"], r["shard"], r["priority"], run) for run in plan.also)
                if plan.next_fire is not None:
                    next_fires[r["job_id"]] = (r, plan.next_fire)
            c.execute(
                self._q["execution_mark_queued"], {"ids": json.dumps(to_queue), "now": now_us}
            )
            if catchups:
                c.execute(self._q["execution_mark_catchup"], {"ids": json.dumps(catchups)})
            if to_skip:
                self._end_pending(
                    c, [r for r, _ in to_skip], ExecutionStatus.SKIPPED, [w for _, w in to_skip]
                )
            heads = [
                (r["job_id"], r["shard"], r["priority"], run) for r, run in next_fires.values()
            ]
            inserted = self._insert_planned(c, [*new_runs, *heads])
            out.extend(
                QueueItem(run.id, run.due_at, priority, shard)
                for _, shard, priority, run in new_runs
                if run.status is ExecutionStatus.QUEUED and run.id in inserted
            )
            head_updates = []
            for r, run in next_fires.values():
                head: datetime | None = run.scheduled_for
                if run.id not in inserted:  # the fire time has a run already: plan past it
                    head = self._plan_head(
                        c, r["job_id"], r["shard"], schedule_of(r), r["jitter"], r["priority"], head
                    )
                head_updates.append(
                    {
                        "id": r["job_id"],
                        "next_fire_at": to_us(head) if head else None,
                        "now": now_us,
                    }
                )
            c.executemany(self._q["job_set_next_fire"], head_updates)
        return out

    @retried
    def job_repair_next_runs(
        self, leases: ShardLeases, after_id: str, limit: int
    ) -> tuple[list[str], str | None]:
        now = self.now()
        repaired = []
        with self._tx() as c:
            shards = self._fenced_shards(c, leases)
            rows = c.execute(
                self._q["jobs_without_next_run"],
                {"shards": json.dumps(shards), "after_id": after_id, "limit": limit},
            ).fetchall()
            for r in rows:
                if r["has_next_run"]:
                    continue
                schedule = schedule_of(r)
                start = opt_dt(r["next_fire_at"])
                if start is None:
                    latest = opt_dt(r["latest_fire"])
                    start = schedule.next_fire_after(max(latest, now) if latest else now)
                self._replan(c, r["id"], r["shard"], schedule, r["jitter"], r["priority"], start)
                repaired.append(r["id"])
        return repaired, (rows[-1]["id"] if len(rows) == limit else None)

    def execution_sweep(
        self,
        leases: ShardLeases,
        shards: Sequence[int],
        overdue_by: float | None,
        limit: int,
        after: SweepCursor | None = None,
    ) -> SweepPage:
        """One range read per shard on executions_dispatch, from the cursor's (due_at, id) on, so
        a page costs its own rows, not the backlog's."""
        now = self.now()
        before = to_us(now - timedelta(seconds=overdue_by)) if overdue_by is not None else MAX_US
        start = after.shard if after is not None else -1
        owned = sorted({s for s in shards if s in leases.epochs and s >= start})
        items: list[QueueItem] = []
        last: Row | None = None
        with self._read() as c:
            for shard in owned:
                if len(items) >= limit:
                    break
                after_due_at, after_id = -MAX_US, ""  # from the shard's first run
                if after is not None and shard == after.shard:
                    after_due_at, after_id = to_us(after.due_at), after.execution_id
                rows = c.execute(
                    self._q["execution_sweep"],
                    {
                        "shard": shard,
                        "before": before,
                        "after_due_at": after_due_at,
                        "after_id": after_id,
                        "limit": limit - len(items),
                    },
                ).fetchall()
                items.extend(
                    QueueItem(r["id"], from_us(r["due_at"]), r["priority"], r["shard"])
                    for r in rows
                )
                last = rows[-1] if rows else last
        if last is None or len(items) < limit:
            return SweepPage(items, None)
        return SweepPage(items, SweepCursor(last["shard"], from_us(last["due_at"]), last["id"]))

    @retried
    def execution_reap(self, limit: int) -> list[Execution]:
        """Read the expired leases without a write transaction (most passes find none, and every
        scheduler of every process reaps every second), decide each run in Python, then apply the
        decisions with one conditional UPDATE and log the lost attempts (and dead letters) of
        exactly the runs it changed."""
        now_us = self._now_us()
        with self._read() as c:
            expired = {
                r["id"]: r
                for r in c.execute(
                    self._q["execution_expired_leases"], {"now": now_us, "limit": limit}
                )
            }
        if not expired:
            return []
        decisions = [_reap_decision(r, now_us) for r in expired.values()]
        with self._tx() as c:
            self._lock_jobs_of_runs(c, list(expired))
            reaped = c.execute(
                self._q["execution_reap"], {"decisions": json.dumps(decisions), "now": now_us}
            ).fetchall()
            c.executemany(
                self._q["attempt_finish"],
                [
                    {
                        "id": r["id"],
                        "fencing_token": r["fencing_token"],
                        "outcome": AttemptOutcome.LOST.value,
                        "error": r["last_error"],
                        "now": now_us,
                    }
                    for r in reaped
                ],
            )
            failed = [r for r in reaped if r["status"] == ExecutionStatus.FAILED.value]
            c.executemany(
                self._q["dead_letter_insert"],
                [
                    {
                        "id": r["id"],
                        "job_id": r["job_id"],
                        "tenant": expired[r["id"]]["tenant"],
                        "attempts": r["attempt"],
                        "error": r["last_error"],
                        "now": now_us,
                    }
                    for r in failed
                ],
            )
            self._complete_one_shots(
                c, [r for r in reaped if r["status"] != ExecutionStatus.QUEUED.value]
            )
            self._wake_waiting(c, [r["job_id"] for r in reaped], now_us)
            return self._with_attempts(c, reaped)

    # --- worker role ------------------------------------------------------------------------
    @retried
    def execution_claim(
        self, execution_ids: Sequence[str], owner: str, lease_ttl: float, misfire_grace: float
    ) -> ClaimResult:
        """Decide each run with ``plan_claim`` (pause, due, misfire, overlap), then write the
        decisions in batches."""
        now = self.now()
        now_us = to_us(now)
        with self._tx() as c:
            self._lock_jobs_of_runs(c, execution_ids)
            rows = {
                r["id"]: r
                for r in c.execute(
                    self._q["execution_claim_candidates"], {"ids": json.dumps(list(execution_ids))}
                )
                if r["status"] == ExecutionStatus.QUEUED.value
            }
            job_ids = json.dumps(sorted({r["job_id"] for r in rows.values()}))
            running: dict[str, list[RunningRun]] = {}
            for r in c.execute(self._q["execution_running_of_jobs"], {"job_ids": job_ids}):
                running.setdefault(r["job_id"], []).append(
                    RunningRun(r["id"], from_us(r["started_at"]))
                )
            grace_line = to_us(now - timedelta(seconds=misfire_grace))
            late_jobs = sorted(
                {r["job_id"] for r in rows.values() if (r["queued_at"] or 0) < grace_line}
            )
            newest_missed = {
                r["job_id"]: from_us(r["newest"])
                for r in (
                    c.execute(
                        self._q["execution_newest_missed_of_jobs"],
                        {"job_ids": json.dumps(late_jobs), "grace_line": grace_line},
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
                        {"job_ids": json.dumps(late), "now": now_us},
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
            self._replace(c, plan.replaced, now_us)
            if plan.catchup:
                c.execute(self._q["execution_mark_catchup"], {"ids": json.dumps(plan.catchup)})
            to_start = [rows[run.id] for run in plan.start]
            not_due = [
                QueueItem(run.id, run.due_at, run.priority, run.shard) for run in plan.not_due
            ]
            replaced = plan.replaced
            started = c.execute(
                self._q["execution_start_many"],
                {
                    "ids": json.dumps([r["id"] for r in to_start]),
                    "owner": owner,
                    "lease_expires_at": now_us + int(lease_ttl * 1_000_000),
                    "now": now_us,
                },
            ).fetchall()
            c.executemany(
                self._q["attempt_insert"],
                [
                    {
                        "id": row["id"],
                        "attempt": row["attempt"],
                        "owner": owner,
                        "fencing_token": row["fencing_token"],
                        "now": now_us,
                    }
                    for row in started
                ],
            )
        job_of = {r["id"]: r for r in to_start}
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
        return ClaimResult(runs, not_due, waiting)

    def _replace(self, c: Connection, replaced: Mapping[str, list[str]], now_us: int) -> None:
        """overlap=replace: cancel the running predecessors, fencing their tokens."""
        for newer, victims in replaced.items():
            why = f"replaced by execution {newer}"
            for victim in victims:
                gone = c.execute(
                    self._q["execution_replace"], {"id": victim, "reason": why, "now": now_us}
                ).fetchone()
                if gone:
                    c.execute(
                        self._q["attempt_finish"],
                        {
                            "id": victim,
                            "fencing_token": gone["fencing_token"],
                            "outcome": AttemptOutcome.CANCELLED.value,
                            "error": why,
                            "now": now_us,
                        },
                    )

    @retried
    def execution_heartbeat(
        self, owner: str, held: Mapping[str, int], lease_ttl: float
    ) -> dict[str, int]:
        lease_until = self._now_us() + int(lease_ttl * 1_000_000)
        with self._tx() as c:
            rows = c.execute(
                self._q["execution_heartbeat"],
                {"owner": owner, "held": json.dumps(dict(held)), "lease_expires_at": lease_until},
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
                    {"ids": json.dumps([x.execution_id for x in completions])},
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
        """Move running executions (tokens already checked) to their next state and log each
        attempt, in three batched statements."""
        finishes, attempts, dead, final = [], [], [], []
        for r, done, outcome in outcomes:
            end = plan_finish(
                succeeded=done.succeeded,
                released=outcome is AttemptOutcome.RELEASED,
                job_cancelled=r["job_status"] == JobStatus.CANCELLED.value,
                attempt=r["attempt"],
                retry_in=done.retry_in,
            )
            status = end.status
            finishes.append(
                {
                    "id": r["id"],
                    "fencing_token": done.fencing_token,
                    "status": status.value,
                    "due_at": None if end.due_in is None else now_us + int(end.due_in * 1_000_000),
                    "result": json.dumps(done.result) if done.succeeded else None,
                    "error": done.error,
                    "reason": end.reason,
                    "uncount_attempt": int(end.uncount),
                    "now": now_us,
                }
            )
            attempts.append(
                {
                    "id": r["id"],
                    "fencing_token": done.fencing_token,
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
                    }
                )
            if status.is_final:
                final.append(r)
        c.executemany(self._q["execution_finish"], finishes)
        c.executemany(self._q["attempt_finish"], attempts)
        c.executemany(self._q["dead_letter_insert"], dead)
        self._complete_one_shots(c, final)
        self._wake_waiting(c, [r["job_id"] for r, _, _ in outcomes], now_us)

    def _wake_waiting(self, c: Connection, job_ids: Sequence[str], now_us: int) -> None:
        """A run of these jobs ended: their runs waiting for a predecessor are due now."""
        if job_ids:
            c.execute(
                self._q["executions_wake_waiting"],
                {"job_ids": json.dumps(sorted(set(job_ids))), "now": now_us},
            )

    @retried
    def execution_release(self, owner: str, held: Mapping[str, int]) -> int:
        now_us = self._now_us()
        with self._tx() as c:
            self._lock_jobs_of_runs(c, list(held))
            rows = c.execute(self._q["execution_current_tokens"], {"ids": json.dumps(list(held))})
            outcomes = [
                (
                    r,
                    Completion(r["id"], r["fencing_token"], False, error="released"),
                    AttemptOutcome.RELEASED,
                )
                for r in rows
                if r["status"] == "running"
                and r["lease_owner"] == owner
                and r["fencing_token"] == held[r["id"]]
            ]
            self._finish(c, outcomes, now_us)
        return len(outcomes)

    # --- dashboard reads --------------------------------------------------------------------
    def job_search(
        self,
        *,
        tenant: str | None,
        status: JobStatus | None = None,
        text: str | None = None,
        after_id: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        # One covering-index range per (tenant, status) and per (tenant, task, status), each in
        # id order and at most ``limit`` long, merged: no filter combination scans the table.
        id_from = "" if after_id is None else after_last([after_id])
        statuses = [status] if status is not None else list(JobStatus)
        with self._read() as c:
            tenants = [tenant] if tenant is not None else self._tenants(c)
            pages: list[list[str]] = []
            for owner in tenants:
                ranges = [("", TEXT_MAX)]
                tasks: list[str] = []
                if text:
                    ranges = [(text.lower(), prefix_end(text.lower()))]
                    tasks = self._tasks_from(c, owner, text)
                for state, (low, high) in itertools.product(statuses, ranges):
                    args = {"tenant": owner, "status": state.value, "limit": limit}
                    args |= {"id_from": max(id_from, low), "id_to": high}
                    pages.append([r[0] for r in c.execute(self._q["job_search_ids"], args)])
                for state, task in itertools.product(statuses, tasks):
                    args = {"tenant": owner, "task": task, "status": state.value}
                    args |= {"id_from": id_from, "limit": limit}
                    pages.append([r[0] for r in c.execute(self._q["job_search_ids_of_task"], args)])
            ids = list(itertools.islice(unique(heapq.merge(*pages)), limit))
            return [job_of(r) for r in c.execute(self._q["jobs_by_ids"], {"ids": json.dumps(ids)})]

    def _tenants(self, c: Connection) -> list[str]:
        """Every tenant that has a job, one index seek each."""
        found: list[str] = []
        while (
            tenant := c.execute(self._q["job_tenant_from"], {"from": after_last(found)}).fetchone()[
                0
            ]
        ) is not None:
            found.append(tenant)
        return found

    def _tasks_from(self, c: Connection, tenant: str, prefix: str) -> list[str]:
        """The first ``MAX_SEARCH_TASKS`` task names of ``tenant`` that start with ``prefix``."""
        found: list[str] = []
        args = {"tenant": tenant, "to": prefix_end(prefix)}
        while len(found) < MAX_SEARCH_TASKS:
            start = after_last(found) if found else prefix
            task = c.execute(self._q["job_task_from"], {**args, "from": start}).fetchone()[0]
            if task is None:
                break
            found.append(task)
        return found

    def execution_activity(
        self, *, tenant: str | None, since: datetime, until: datetime, bucket: timedelta
    ) -> list[ActivityBucket]:
        since_us, bucket_us = to_us(since), bucket // timedelta(microseconds=1)
        count = -(-(to_us(until) - since_us) // bucket_us)
        args = {
            "tenant": tenant,
            "since": since_us,
            "until": to_us(until),
            "bucket": bucket_us,
            "shards": json.dumps(list(range(self.shard_count))),
        }
        finished: list[Counter[ExecutionStatus]] = [Counter() for _ in range(count)]
        delays: list[Counter[int]] = [Counter() for _ in range(count)]
        depth_change = [0] * count  # runs that joined the queue minus runs that left it
        with self._read() as c:
            for r in c.execute(self._q["execution_activity"], args):
                if r["ended"] is not None:
                    finished[r["ended"]][ExecutionStatus(r["status"])] += r["runs"]
                    if r["delay_class"] is not None:
                        delays[r["ended"]][r["delay_class"]] += r["runs"]
                if r["joined"] is not None:
                    depth_change[r["joined"]] += r["runs"]
                    if r["left_at"] is not None and r["left_at"] < count:
                        depth_change[r["left_at"]] -= r["runs"]
        depths = itertools.accumulate(depth_change)
        return [
            ActivityBucket(since + i * bucket, finished[i], delays[i], depth)
            for i, depth in enumerate(depths)
        ]

    def execution_running_by_owner(self, *, tenant: str | None) -> list[WorkerLoad]:
        args = {"tenant": tenant, "now": self._now_us()}
        with self._read() as c:
            return [
                WorkerLoad(r["owner"], r["running"], r["expired"])
                for r in c.execute(self._q["execution_running_by_owner"], args)
            ]

    def scheduler_shards(self) -> list[SchedulerShards]:
        with self._read() as c:
            return [
                SchedulerShards(r["owner"], r["shards"], from_us(r["last_seen"]))
                for r in c.execute(self._q["scheduler_shards"], {"now": self._now_us()})
            ]

    def dead_letter_count(self, *, tenant: str | None, limit: int) -> int:
        total = 0
        with self._read() as c:
            for owner in [tenant] if tenant is not None else self._tenants(c):
                args = {"tenant": owner, "limit": limit - total}
                total += c.execute(self._q["dead_letter_count_of_tenant"], args).fetchone()[0]
                if total >= limit:
                    break
        return total

    def execution_last_of_jobs(self, job_ids: Sequence[str]) -> dict[str, Execution]:
        with self._read() as c:
            rows = c.execute(self._q["execution_last_of_jobs"], {"ids": json.dumps(list(job_ids))})
            return {r["job_id"]: execution_of(r, ()) for r in rows}

    def api_key_get(self, key_id: str) -> ApiKey | None:
        with self._read() as c:
            row = c.execute(self._q["api_key_get"], {"id": key_id}).fetchone()
        return api_key_of(row) if row else None

    @retried
    def secret_get_or_create(self, name: str, value: str) -> str:
        with self._tx() as c:
            c.execute(
                self._q["secret_insert"], {"name": name, "value": value, "now": self._now_us()}
            )
            stored: str = c.execute(self._q["secret_get"], {"name": name}).fetchone()[0]
        return stored

    # --- task catalog -----------------------------------------------------------------------
    @retried
    def task_publish(self, worker: str, tasks: Sequence[TaskDefaults]) -> None:
        if not tasks:
            return
        with self._tx() as c:
            now = self._now_us()
            c.executemany(
                self._q["task_publish"],
                [
                    {
                        "name": t.name,
                        "max_attempts": t.retry.max_attempts,
                        "backoff_base": t.retry.backoff_base,
                        "backoff_cap": t.retry.backoff_cap,
                        "timeout": t.timeout,
                        "is_async": t.is_async,
                        "worker": worker,
                        "now": now,
                    }
                    for t in sorted(tasks, key=lambda t: t.name)  # one lock order for every worker
                ],
            )

    def task_catalog(
        self, seen_within: float, names: Sequence[str] | None = None
    ) -> list[PublishedTask]:
        since = self._now_us() - int(seen_within * 1_000_000)
        with self._read() as c:
            if names is None:
                rows = c.execute(self._q["task_catalog"], {"since": since}).fetchall()
            else:
                params = {"since": since, "names": json.dumps(list(names))}
                rows = c.execute(self._q["task_catalog_of_names"], params).fetchall()
        return [published_task_of(r) for r in rows]


def _reap_decision(r: Row, now_us: int) -> dict[str, Any]:
    """``plan_reap``'s verdict on an expired lease, as the reap statement takes it."""
    end = plan_reap(
        job_cancelled=r["job_status"] == JobStatus.CANCELLED.value,
        attempt=r["attempt"],
        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
    )
    return {
        "id": r["id"],
        "fencing_token": r["fencing_token"],
        "status": end.status.value,
        "due_at": None if end.due_in is None else now_us + int(end.due_in * 1_000_000),
        "error": f"worker lost: lease expired during attempt {r['attempt']}",
        "reason": end.reason,
    }
