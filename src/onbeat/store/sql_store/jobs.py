"""The API's transactions: jobs, their runs and dead letters as users see and change them."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from onbeat.batch_json import batch_json
from onbeat.errors import (
    ConflictError,
    NotFoundError,
    UnreadableRecordError,
    ValidationError,
)
from onbeat.model import (
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobEvent,
    JobEventKind,
    JobStatus,
    Trigger,
)
from onbeat.plan import (
    PAUSED_AT_FIRE_TIME,
    PlannedExecution,
    first_execution,
    new_ids,
    plan_missed_while_paused,
    planned,
    shard_of,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import ScheduleKind
from onbeat.store.base import (
    CreatedJob,
    JobChanges,
    NewJob,
)
from onbeat.store.rows import (
    fingerprint,
    from_us,
    job_of,
    new_job_of,
    policy_columns,
    readable_job,
    schedule_columns,
    schedule_of,
    stored_params,
    to_us,
)
from onbeat.store.sql_store.base import (
    IDEMPOTENCY_RETENTION,
    Connection,
    _KeyTaken,
    retried,
)
from onbeat.store.sql_store.limits import LimitTransactions

log = logging.getLogger("onbeat.store")


def _same_submission(stored: str, submitted: str) -> None:
    """A key used again must carry the same submission (its fingerprint)."""
    if stored != submitted:
        raise ValidationError(
            "Idempotency-Key", "was already used for a different submission; use a new key"
        )


class JobTransactions(LimitTransactions):
    """The API's transactions: jobs, their runs and dead letters as users see and change them."""

    def job_create(self, new: NewJob) -> CreatedJob:
        return self.job_create_many([new])[0]

    @retried
    def job_create_many(
        self, news: Sequence[NewJob], queue_within: float | None = None
    ) -> list[CreatedJob]:
        try:
            return self._create_jobs(news, queue_within)
        except _KeyTaken:  # rolled back; this time the lookup finds the other submission's job
            return self._create_jobs(news, queue_within)

    def _create_jobs(self, news: Sequence[NewJob], queue_within: float | None) -> list[CreatedJob]:
        """Insert the jobs with their creation events, their first runs and idempotency keys,
        in one transaction. The batch's keys are looked up first, all at once: a
        key already stored replays its job, and a key repeated within the batch replays the job
        its first use makes (both only for the same submission)."""
        now = self.now()
        # Rows and first fire times are made before the transaction opens: under load, Python
        # work between statements is time the session sits idle in a transaction, which the
        # server ends after IDLE_IN_TRANSACTION_TIMEOUT (a batch of 1,000 cron jobs).
        ids = new_ids(2 * len(news))  # each job's id, then its first run's
        made = [
            self._job_row(new, now, queue_within, ids[2 * i], ids[2 * i + 1])
            for i, new in enumerate(news)
        ]
        rows: list[dict[str, Any]] = []
        firsts: list[tuple[str, int, int, PlannedExecution]] = []
        keys: list[dict[str, str]] = []
        # A job replayed from the store, or (the id of a job this batch creates, replayed).
        answers: list[Job | tuple[str, bool]] = []
        queued: dict[str, QueueItem] = {}

        def committed(c: Connection) -> bool:
            """Whether the batch's first new job is stored: its id is new, so only this
            transaction could have stored it (a retry after a 503 would create them all again).
            A batch of replays only wrote nothing that counts: its answers stand."""
            return (
                not rows
                or c.execute(self._q["job_get"], {"id": rows[0]["id"]}).fetchone() is not None
            )

        with self._tx(settle=True, witness=committed) as c:
            stored = self._stored_keys(c, news, now)
            new_keys: dict[tuple[str, str], tuple[str, str]] = {}
            for new, (row, first) in zip(news, made, strict=True):
                if new.idempotency_key is not None:
                    name, submitted = (new.tenant, new.idempotency_key), fingerprint(new)
                    if name in stored:
                        _same_submission(stored[name][0], submitted)
                        answers.append(job_of(self._job_for_update(c, stored[name][1])))
                        continue
                    if name in new_keys:
                        _same_submission(new_keys[name][0], submitted)
                        answers.append((new_keys[name][1], True))
                        continue
                    new_keys[name] = (submitted, row["id"])
                    keys.append(
                        {"tenant": new.tenant, "key": new.idempotency_key}
                        | {"fingerprint": submitted, "job_id": row["id"]}
                    )
                rows.append(row)
                if first:
                    firsts.append((row["id"], row["shard"], new.priority, first))
                    if first.status is ExecutionStatus.QUEUED:
                        item = QueueItem(first.id, first.due_at, new.priority, row["shard"])
                        queued[row["id"]] = item
                answers.append((row["id"], False))
            if rows:
                self._insert_jobs(c, rows, to_us(now))
            if keys:
                # Of concurrent submissions under one key, the others wait for the first to
                # commit and insert nothing: rolled back, the retry replays the first's job.
                params = {"keys": batch_json(keys), "now": to_us(now)}
                inserted = c.execute(self._q["idempotency_keys_insert"], params).fetchall()
                if len(inserted) < len(keys):
                    raise _KeyTaken
            self._insert_planned(c, firsts, new_jobs=True)
        # After the commit, as the rows are made before it: not time idle in the transaction.
        created = {
            row["id"]: new_job_of(new, row) for new, (row, _) in zip(news, made, strict=True)
        }
        return [
            CreatedJob(a, replayed=True)
            if isinstance(a, Job)
            else CreatedJob(created[a[0]], replayed=a[1], queued=None if a[1] else queued.get(a[0]))
            for a in answers
        ]

    def _stored_keys(
        self, c: Connection, news: Sequence[NewJob], now: datetime
    ) -> dict[tuple[str, str], tuple[str, str]]:
        """(tenant, key) -> (fingerprint, job id) of the batch's keys already stored: one
        statement per tenant (a batch has one), after the expired keys are pruned."""
        by_tenant: dict[str, list[str]] = {}
        for new in news:
            if new.idempotency_key is not None:
                by_tenant.setdefault(new.tenant, []).append(new.idempotency_key)
        if not by_tenant:
            return {}
        c.execute(self._q["idempotency_key_prune"], {"before": to_us(now - IDEMPOTENCY_RETENTION)})
        found = {}
        for tenant, keys in by_tenant.items():
            params = {"tenant": tenant, "keys": batch_json(keys)}
            for r in c.execute(self._q["idempotency_keys_get"], params).fetchall():
                found[(tenant, r["key"])] = (r["fingerprint"], r["job_id"])
        return found

    def _job_row(
        self, new: NewJob, now: datetime, queue_within: float | None, job_id: str, run_id: str
    ) -> tuple[dict[str, Any], PlannedExecution | None]:
        """A new job's row (``job_id``), and its first run (``run_id``; None if its schedule
        never fires)."""
        first = first_execution(new.schedule, new.jitter, now, queue_within, run_id)
        row = {
            "id": job_id,
            "tenant": new.tenant,
            "task": new.task,
            "params": stored_params(new.params),
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

    @retried
    def job_update(self, job_id: str, changes: JobChanges) -> Job:
        with self._tx(settle=True) as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be edited")
            # Runs held ahead were claimed under the old fields: claimed again, they get the new.
            now = self._decision_instant(c, job)
            retry = changes.retry or job.retry
            columns: dict[str, Any] = {
                "id": job_id,
                "params": stored_params(
                    changes.params if changes.params is not None else job.params
                ),
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

    def _decision_instant(self, c: Connection, job: Job) -> datetime:
        """The instant an edit, pause or cancel of the locked ``job`` takes effect at, read once
        the job's runs a worker claimed ahead, and has not started, are pending again, so that
        the decision treats them as any pending run. A confirm (which locks runs, not the job)
        that started one committed before that write, so before this instant; one that comes
        after waits on the row and finds it unclaimed. Read before the write, the instant could
        precede a run a confirm started meanwhile: a run of a fire time after its job's cancel
        (found by the fault suite's S4)."""
        unclaimed = c.execute(self._q["executions_unclaim_of_job"], {"job_id": job.id}).fetchall()
        self._usage_end(c, [job.tenant] * len(unclaimed))
        return self.now()

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

    @retried
    def job_pause(self, job_id: str) -> Job:
        with self._tx(settle=True) as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status is JobStatus.CANCELLED:
                raise ConflictError(f"job {job_id!r} is cancelled and cannot be paused")
            if job.status is not JobStatus.ACTIVE:
                return job
            # As for a cancel: the fire times up to the pause event's instant were in force and
            # must have their records, even those a stalled scheduler never planned.
            now = self._decision_instant(c, job)
            self._record_fires_until(c, job, now)
            return self._set_status(c, job, JobStatus.PAUSED, JobEventKind.PAUSED, now)

    @retried
    def job_resume(self, job_id: str, misfire_grace: float) -> Job:
        now = self.now()
        with self._tx(settle=True) as c:
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
        with self._tx(settle=True) as c:
            job = job_of(self._job_for_update(c, job_id))
            # One instant for all of it: the fire times up to the cancel event's instant (where
            # the audit ends the job's active time) must all have their records.
            now = self._decision_instant(c, job)
            if job.status is not JobStatus.CANCELLED:
                self._record_fires_until(c, job, now)
            cancelled = c.execute(
                self._q["executions_cancel_pending"],
                {"job_id": job_id, "reason": "job cancelled", "now": to_us(now)},
            ).fetchall()
            self._archive(c, [r["id"] for r in cancelled])
            return self._set_status(c, job, JobStatus.CANCELLED, JobEventKind.CANCELLED, now)

    @retried
    def job_run_now(self, job_id: str) -> Execution:
        now = self.now()
        run = planned(now, 0.0, trigger=Trigger.MANUAL)

        def committed(c: Connection) -> bool:
            """Whether the new run is stored (a retry would make a second one)."""
            return c.execute(self._q["execution_get"], {"id": run.id}).fetchone() is not None

        with self._tx(settle=True, witness=committed) as c:
            job = job_of(self._job_for_update(c, job_id))
            if job.status in (JobStatus.CANCELLED, JobStatus.PAUSED):
                raise ConflictError(f"job {job_id!r} is {job.status.value}; resume it first")
            # Two manual runs requested in the same microsecond are two runs, not one.
            while not self._insert_executions(c, job_id, job.shard, job.priority, [run]):
                now += timedelta(microseconds=1)
                run = planned(now, 0.0, trigger=Trigger.MANUAL)
            return self._execution(c, run.id)

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
        with self._tx(settle=True) as c:
            if c.execute(self._q["dead_letter_delete"], {"id": execution_id}).rowcount == 0:
                raise NotFoundError(f"dead letter {execution_id!r} not found")
            run = self._execution(c, execution_id)
            if job_of(self._job_for_update(c, run.job_id)).status is JobStatus.CANCELLED:
                raise ConflictError(f"job {run.job_id!r} is cancelled; its runs cannot be replayed")
            # Back from the history to the hot table, where the dispatcher finds it.
            at = {"id": execution_id, "scheduled_for": to_us(run.scheduled_for)}
            if c.execute(self._q["execution_unarchive"], at).rowcount:
                c.execute(self._q["history_delete_run"], at)
            c.execute(self._q["execution_replay"], {"id": execution_id, "now": self._now_us()})
            return self._execution(c, execution_id)

    def dead_letter_drop(self, execution_id: str) -> None:
        with self._tx(settle=True) as c:
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
