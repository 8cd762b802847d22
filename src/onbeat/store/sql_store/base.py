"""The base of the SQL transactions: the backend's hooks, conflict retries, shared writes."""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from onbeat.batch_json import batch_json
from onbeat.errors import (
    NotFoundError,
)
from onbeat.model import (
    Attempt,
    Execution,
    ExecutionStatus,
    Job,
    JobEventKind,
    JobStatus,
    Trigger,
)
from onbeat.plan import (
    PlannedExecution,
    planned,
    skip_cause,
)
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.rows import (
    attempt_of,
    execution_of,
    from_us,
    job_of,
    running_attempt_of,
    to_us,
)

log = logging.getLogger("onbeat.store")


MAX_CONFLICT_RETRIES = 5
"""Times a transaction runs when the database aborts it for a conflict (a deadlock)."""
_P = ParamSpec("_P")
_T = TypeVar("_T")
_S = TypeVar("_S", bound="SQLBase")


_under_way = threading.local()
"""Per thread, the fire times the transaction under way skipped, by cause (``skips``): reported
to ``on_skipped`` only once it committed, so a transaction run again is not counted twice."""


def retried(method: Callable[Concatenate[_S, _P], _T]) -> Callable[Concatenate[_S, _P], _T]:
    """Run a transaction again, after a short random pause, when the backend aborted it for a
    conflict with another (``_retry_errors``): nothing of it was committed."""

    @functools.wraps(method)
    def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if getattr(_under_way, "skips", None) is not None:  # called by another: it reports
            return method(self, *args, **kwargs)
        for attempt in itertools.count(1):
            _under_way.skips = Counter()
            try:
                result = method(self, *args, **kwargs)
            except self._retry_errors:
                if attempt == MAX_CONFLICT_RETRIES:
                    raise
                log.info(
                    "%s conflicted with another transaction; running it again", method.__name__
                )
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
                continue
            finally:
                skips, _under_way.skips = _under_way.skips, None
            if skips and self.on_skipped is not None:
                self.on_skipped(skips)
            return result
        raise AssertionError("unreachable")

    return run


class _KeyTaken(Exception):
    """A concurrent submission under the same idempotency key committed first."""


IDEMPOTENCY_RETENTION = timedelta(days=1)
MAX_ALERT_RUNS = 100
"""Most skipped runs one alert lists (it also says how many there were)."""
MAX_ALERT_ERROR = 2000
"""Characters of a dead letter's last error an alert carries."""
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


Witness = Callable[[Connection], bool]
"""Whether what only one transaction writes (a new job's id) is stored, asked on another
connection: it settles that transaction's COMMIT whose answer was lost across a server restart,
where the server's own word on it may be another transaction's."""


class SQLBase:
    """What every role's transactions rest on: the backend's hooks and the writes that several
    roles share (planning a job's next run, inserting and ending runs, reading them back)."""

    shard_count: int
    _q: Mapping[str, str]
    _retry_errors: tuple[type[Exception], ...] = ()
    _waits_extend_leases = False
    """Whether a lease a claim or heartbeat writes is pushed back by the server time that passed
    since it was computed (waiting for a pooled connection or a lock), so it runs from the
    commit: on the server's own clock only, never with an injected one."""
    on_skipped: Callable[[Mapping[str, int]], None] | None = None
    """Errors by which the backend aborts a transaction for a conflict; it is run again."""

    # --- what a backend provides ------------------------------------------------------------
    def _tx(
        self, settle: bool = False, witness: Witness | None = None
    ) -> AbstractContextManager[Connection]:
        """A write transaction, committed when the block ends, rolled back if it raises.
        ``settle``: the API's writes, whose client, told that nothing changed, sends the change
        again. Where the connection to the store can be lost while COMMIT awaits its answer,
        such a loss is settled by asking the store whether it committed; without ``settle`` it
        raises StoreOutcomeUnknownError (which the services' idempotent writes just retry).
        ``witness``: for a write that a retry would apply twice (a create), what settles it
        where the store's own answer cannot be trusted (across a server restart)."""
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

    def _insert_jobs(self, c: Connection, rows: Sequence[Mapping[str, Any]], now: int) -> None:
        """Insert new jobs (``rows``: ``job_insert``'s parameters) and their creation events."""
        raise NotImplementedError

    def _insert_runs(
        self, c: Connection, rows: Sequence[Mapping[str, Any]], new_jobs: bool
    ) -> set[str]:
        """Insert runs (``rows``: ``execution_insert``'s parameters), none for a job, fire time
        and trigger that has a run already, in the hot table or the history; returns the ids
        inserted. ``new_jobs``: the jobs were inserted in this transaction (no run of theirs
        exists)."""
        raise NotImplementedError

    def _start_runs(
        self, c: Connection, ids: Sequence[str], owner: str, lease_expires_at: int, now: int
    ) -> list[Row]:
        """Start the runs of ``ids`` that are still queued (leased to ``owner``, attempt and
        fencing token moved on); returns the started runs' rows. An attempt is written once,
        when it ends (``attempt_end``): until then its run's row is its record."""
        raise NotImplementedError

    def _confirm_runs(
        self, c: Connection, owner: str, held: Mapping[str, int], now: int, lease_expires_at: int
    ) -> dict[str, int]:
        """Start the runs ``owner`` claimed ahead (``held``: id -> token) that may still start
        (as ``_start_runs``); returns id -> the new fencing token of each started."""
        raise NotImplementedError

    def _finish_final(self, c: Connection, finishes: Sequence[Mapping[str, Any]]) -> None:
        """End running runs (tokens checked) for good: write their attempts, move them to the
        history with their final outcome without updating the hot row first, wake their jobs'
        runs waiting for a predecessor (``_wake_waiting``), and complete a one-shot job whose
        scheduled run this was. ``finishes``: the ``execution_finish``
        parameters of each, plus ``scheduled_for``, ``outcome`` (the attempt's), ``job_id`` and
        ``trigger``."""
        raise NotImplementedError

    def _move_final(self, c: Connection, ids: str) -> None:
        """Move the runs of ``ids`` (a JSON array) that are final from ``runs`` to
        ``execution_history``, in whichever statements suit the backend."""
        raise NotImplementedError

    def _set_next_fires(self, c: Connection, heads: Mapping[str, int | None], now: int) -> None:
        """Record each job's next fire time (``heads``: job id -> microseconds, or None for no
        more fires), in whichever statements suit the backend."""
        raise NotImplementedError

    # --- shared by the roles -------------------------------------------------------------
    def _job_for_update(self, c: Connection, job_id: str) -> Row:
        row: Row | None = c.execute(self._q["job_get_for_update"], {"id": job_id}).fetchone()
        if row is None:
            raise NotFoundError(f"job {job_id!r} not found")
        return row

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
        self,
        c: Connection,
        planned_runs: Sequence[tuple[str, int, int, PlannedExecution]],
        *,
        new_jobs: bool = False,
    ) -> set[str]:
        """Insert (job_id, shard, priority, run) rows, ignoring runs that exist already (same job,
        fire time and trigger); returns the ids actually inserted. ``new_jobs``: the jobs were
        inserted in this transaction, so no run of theirs exists and none is looked up."""
        if not planned_runs:
            return set()
        now = self._now_us()
        inserted = self._insert_runs(
            c,
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
            new_jobs,
        )
        self._alert_skips(
            c,
            [
                (job_id, run.id, to_us(run.scheduled_for), run.reason or "skipped")
                for job_id, _, _, run in planned_runs
                if run.status is ExecutionStatus.SKIPPED and run.id in inserted
            ],
        )
        self._archive(
            c, [run.id for *_, run in planned_runs if run.status.is_final and run.id in inserted]
        )
        return inserted

    def _archive(self, c: Connection, ids: Iterable[str]) -> None:
        """The runs of ``ids`` that are final now leave the hot table for the history, in the
        transaction that ended them (one batch per transaction); the others stay."""
        batch = list(ids)
        if batch:
            self._move_final(c, batch_json(batch))

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
        if status is ExecutionStatus.SKIPPED:
            self._alert_skips(
                c,
                [
                    (r["job_id"], r["id"], r["scheduled_for"], why)
                    for r, why in zip(rows, reasons, strict=True)
                ],
            )
        self._archive(c, [r["id"] for r in rows])
        self._complete_one_shots(c, rows)

    def _alert_skips(self, c: Connection, skips: Sequence[tuple[str, str, int, str]]) -> None:
        """Write the alerts of runs just skipped, (job id, execution id, fire time, reason) each:
        one alert per job and batch of skips (a dispatch that skips a late run and the fire times
        after it writes two), listing at most ``MAX_ALERT_RUNS`` of them (and how many there were),
        so a long stall of an every-second job is one alert, not thousands."""
        skipped = Counter(skip_cause(reason) for *_, reason in skips)
        if (under_way := getattr(_under_way, "skips", None)) is not None:
            under_way.update(skipped)
        elif skipped and self.on_skipped is not None:
            self.on_skipped(skipped)
        by_job: dict[str, list[dict[str, str]]] = {}
        for job_id, execution_id, scheduled_for, reason in skips:
            by_job.setdefault(job_id, []).append(
                {
                    "execution_id": execution_id,
                    "scheduled_for": from_us(scheduled_for).isoformat(),
                    "reason": reason,
                }
            )
        now = self._now_us()
        c.executemany(
            self._q["alert_insert"],
            [
                {
                    "kind": "skipped",
                    "job_id": job_id,
                    "payload": batch_json({"count": len(runs), "runs": runs[:MAX_ALERT_RUNS]}),
                    "now": now,
                }
                for job_id, runs in by_job.items()
            ],
        )

    def _dead_letter(self, c: Connection, dead: Sequence[Mapping[str, Any]]) -> None:
        """Record runs that exhausted their attempts as dead letters (rows as ``dead_letter_insert``
        takes them), each with its alert, in the caller's transaction."""
        c.executemany(self._q["dead_letter_insert"], dead)
        c.executemany(
            self._q["alert_insert"],
            [
                {
                    "kind": "dead_letter",
                    "job_id": d["job_id"],
                    "payload": batch_json(
                        {
                            "execution_id": d["id"],
                            "attempts": d["attempts"],
                            "error": (d["error"] or "")[:MAX_ALERT_ERROR],
                        }
                    ),
                    "now": d["now"],
                }
                for d in dead
            ],
        )

    def _complete_one_shots(self, c: Connection, rows: Sequence[Row]) -> None:
        ids = sorted({r["job_id"] for r in rows if r["trigger"] == Trigger.SCHEDULE.value})
        if ids:
            c.execute(
                self._q["job_complete_one_shot"], {"ids": batch_json(ids), "now": self._now_us()}
            )

    def _execution(self, c: Connection, execution_id: str) -> Execution:
        row = c.execute(self._q["execution_get"], {"id": execution_id}).fetchone()
        if row is None:
            raise NotFoundError(f"execution {execution_id!r} not found")
        return self._with_attempts(c, [row])[0]

    def _with_attempts(self, c: Connection, rows: Sequence[Row]) -> list[Execution]:
        """The runs with their attempts: the ended ones as stored, and the one running, which
        is not stored until it ends, from its run's row (unless a version that stored attempts
        at their start stored it)."""
        by_id: dict[str, list[Attempt]] = {r["id"]: [] for r in rows}
        for a in c.execute(self._q["attempts_of"], {"ids": batch_json(list(by_id))}):
            by_id[a["execution_id"]].append(attempt_of(a))
        for r in rows:
            attempts = by_id[r["id"]]
            running = r["status"] == ExecutionStatus.RUNNING.value and r["started_at"] is not None
            if running and all(a.fencing_token != r["fencing_token"] for a in attempts):
                attempts.append(running_attempt_of(r))
        return [execution_of(r, tuple(by_id[r["id"]])) for r in rows]

    def _wake_waiting(self, c: Connection, job_ids: Sequence[str], now_us: int) -> None:
        """A run of these jobs ended: their runs waiting for a predecessor are due now."""
        if job_ids:
            c.execute(
                self._q["executions_wake_waiting"],
                {"job_ids": batch_json(sorted(set(job_ids))), "now": now_us},
            )
