"""How the SQL backends' rows map to onbeat's records and back: times as integer microseconds (UTC),
enums by value, a job's columns, and the small helpers of its keyset reads. Pure functions, no
connection: ``store/sql_store/`` holds the transactions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from onbeat import validation
from onbeat.auth import ApiKey, Role
from onbeat.errors import UnreadableRecordError, ValidationError
from onbeat.model import (
    Attempt,
    AttemptOutcome,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.plan import ClaimCandidate
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.base import NewJob, PublishedTask


def to_us(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def from_us(us: int) -> datetime:
    # positional: timedelta's keyword arguments cost twice the whole addition (every row's times)
    return _EPOCH + timedelta(0, 0, us)


def opt_dt(us: int | None) -> datetime | None:
    return None if us is None else _EPOCH + timedelta(0, 0, us)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
MAX_US = 2**62
"""Beyond any time in microseconds: an open end of a time range."""


def claim_candidate(r: sqlite3.Row) -> ClaimCandidate:
    return ClaimCandidate(
        id=r["id"],
        job_id=r["job_id"],
        trigger=_TRIGGERS.get(r["trigger"]) or Trigger(r["trigger"]),  # (a bad value: ValueError)
        attempt=r["attempt"],
        catchup=bool(r["catchup"]),
        scheduled_for=from_us(r["scheduled_for"]),
        due_at=from_us(r["due_at"]),
        queued_at=opt_dt(r["queued_at"]),
        priority=r["priority"],
        job_status=_JOB_STATUSES[r["job_status"]],
        overlap=_OVERLAPS[r["overlap"]],
        misfire=_MISFIRES[r["misfire"]],
        catchup_window=r["catchup_window"],
        shard=r["shard"],
    )


# Enum members by value: a dict look-up, where calling the enum costs a microsecond per row.
_TRIGGERS = {t.value: t for t in Trigger}
_JOB_STATUSES = {s.value: s for s in JobStatus}
_EXECUTION_STATUSES = {s.value: s for s in ExecutionStatus}
_OVERLAPS = {o.value: o for o in OverlapPolicy}
_MISFIRES = {m.value: m for m in MisfirePolicy}


def misfire_policy(value: str) -> MisfirePolicy:
    return _MISFIRES.get(value) or MisfirePolicy(value)  # (a bad value: ValueError)


def fingerprint(new: NewJob) -> str:
    """What a submission asks for, so that reusing its idempotency key for another is refused.
    The JSON of ``dataclasses.asdict`` of the submission without its key (keys stored earlier
    must still match), built without ``asdict``'s deep copy of every value: that copy was 30 %
    of a keyed batch create's CPU."""
    described = _described(new)
    described["idempotency_key"] = None
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _described(value: Any) -> dict[str, Any]:
    """A dataclass instance as nested dicts of its fields (the leaves not copied: only encoded)."""
    described = {name: getattr(value, name) for name in _field_names(type(value))}
    for name, field_value in described.items():
        if hasattr(field_value, "__dataclass_fields__"):
            described[name] = _described(field_value)
    return described


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def schedule_columns(schedule: Schedule) -> dict[str, Any]:
    return {
        "schedule_kind": schedule.kind.value,
        "schedule_expression": schedule.expression,
        "schedule_at": to_us(schedule.at) if schedule.at else None,
        "timezone": schedule.timezone,
    }


def policy_columns(
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


def schedule_of(r: sqlite3.Row) -> Schedule:
    """Rebuild a job's Schedule; cached, since a parsed cron expression is reused for every fire."""
    key = (r["schedule_kind"], r["schedule_expression"], r["schedule_at"], r["timezone"])
    schedule = _SCHEDULES.get(key)
    if schedule is None:
        if len(_SCHEDULES) > 100_000:
            _SCHEDULES.clear()
        schedule = _SCHEDULES[key] = Schedule(
            kind=ScheduleKind(key[0]),
            expression=key[1],
            at=opt_dt(key[2]),
            timezone=key[3],
        )
    return schedule


def job_of(r: sqlite3.Row) -> Job:
    return Job(
        id=r["id"],
        task=r["task"],
        params=json.loads(r["params"]),
        schedule=schedule_of(r),
        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
        timeout=r["timeout"],
        overlap=OverlapPolicy(r["overlap"]),
        misfire=MisfirePolicy(r["misfire"]),
        catchup_window=r["catchup_window"],
        priority=r["priority"],
        jitter=r["jitter"],
        tenant=r["tenant"],
        status=JobStatus(r["status"]),
        next_fire_at=opt_dt(r["next_fire_at"]),
        shard=r["shard"],
        created_at=from_us(r["created_at"]),
        updated_at=from_us(r["updated_at"]),
    )


def stored_params(params: dict[str, Any]) -> str:
    """A job's params as its row keeps them: the JSON they were checked as (a submission's or an
    edit's ``validation.CheckedParams``), else encoded the same way."""
    if type(params) is validation.CheckedParams:
        return params.text
    return json.dumps(params, ensure_ascii=False)


def new_job_of(new: NewJob, row: Mapping[str, Any]) -> Job:
    """The Job that a new job's row (``_job_row``'s) stores, built from what was submitted
    rather than read back (a bulk create's ``submit_many``: 55-56 -> 51 us a job). Equal to
    ``job_of`` of the stored row (the store contract holds it so)."""
    return Job(
        id=row["id"],
        task=new.task,
        params=json.loads(row["params"]),  # a copy, as a read gives: not the caller's dict
        schedule=new.schedule,
        retry=new.retry,
        timeout=new.timeout,
        overlap=new.overlap,
        misfire=new.misfire,
        catchup_window=new.catchup_window,
        priority=new.priority,
        jitter=new.jitter,
        tenant=new.tenant,
        status=JobStatus(row["status"]),
        next_fire_at=opt_dt(row["next_fire_at"]),
        shard=row["shard"],
        created_at=from_us(row["now"]),
        updated_at=from_us(row["now"]),
    )


def readable_job(r: sqlite3.Row) -> Job:
    """The job of a row, checked as a submission is, for the API role's reads: a row written
    behind onbeat's back raises UnreadableRecordError saying what in it is wrong."""
    try:
        job = job_of(r)
        validation.check_job(job)
    except ValidationError as exc:
        raise UnreadableRecordError("job", r["id"], f"{exc.field} {exc.message}") from exc
    except json.JSONDecodeError as exc:
        raise UnreadableRecordError("job", r["id"], f"params is not JSON ({exc})") from exc
    except (ValueError, TypeError, OverflowError) as exc:
        raise UnreadableRecordError("job", r["id"], str(exc)) from exc
    return job


def api_key_of(r: sqlite3.Row) -> ApiKey:
    return ApiKey(
        id=r["id"],
        tenant=r["tenant"],
        role=Role(r["role"]),
        created_at=from_us(r["created_at"]),
        revoked_at=opt_dt(r["revoked_at"]),
    )


def attempt_of(a: sqlite3.Row) -> Attempt:
    return Attempt(
        attempt=a["attempt"],
        worker=a["worker"],
        fencing_token=a["fencing_token"],
        started_at=from_us(a["started_at"]),
        finished_at=opt_dt(a["finished_at"]),
        outcome=AttemptOutcome(a["outcome"]),
        error=a["error"],
    )


def running_attempt_of(r: sqlite3.Row) -> Attempt:
    """The attempt a running run's row describes (attempts are stored when they end)."""
    return Attempt(
        attempt=r["attempt"],
        worker=r["lease_owner"],
        fencing_token=r["fencing_token"],
        started_at=from_us(r["started_at"]),
        finished_at=None,
        outcome=AttemptOutcome.RUNNING,
        error=None,
    )


def execution_of(r: sqlite3.Row, attempts: tuple[Attempt, ...]) -> Execution:
    """A run held ahead (stored as running, to count in flight and be reaped, with no start yet)
    reads as queued: it has not started, and its ``lease_owner`` names the worker that will start
    it at its due time (docs/architecture.md, "Claims ahead of the due time")."""
    status = r["status"]
    if status == "running" and r["started_at"] is None:
        status = "queued"
    return Execution(
        id=r["id"],
        job_id=r["job_id"],
        shard=r["shard"],
        trigger=_TRIGGERS.get(r["trigger"]) or Trigger(r["trigger"]),  # (a bad value: ValueError)
        scheduled_for=from_us(r["scheduled_for"]),
        due_at=from_us(r["due_at"]),
        status=_EXECUTION_STATUSES.get(status) or ExecutionStatus(status),
        attempt=r["attempt"],
        priority=r["priority"],
        lease_owner=r["lease_owner"],
        lease_expires_at=opt_dt(r["lease_expires_at"]),
        fencing_token=r["fencing_token"],
        result=json.loads(r["result"]) if r["result"] is not None else None,
        last_error=r["last_error"],
        reason=r["reason"],
        created_at=from_us(r["created_at"]),
        started_at=opt_dt(r["started_at"]),
        finished_at=opt_dt(r["finished_at"]),
        attempts=attempts,
        catchup=bool(r["catchup"]),
    )


LEAST_CHAR = "\x01"
"""The least code point a stored text can hold."""
TEXT_MAX = "\U0010ffff"
"""Above every id and name the dashboard searches (the greatest code point)."""


def prefix_end(prefix: str) -> str:
    """A string above every string that starts with ``prefix`` (non-empty) and below every other
    string above them: its last character, one code point up (both backends compare UTF-8 bytes,
    which sort as code points do: PostgreSQL's text keys are COLLATE "C")."""
    stem = prefix.rstrip(TEXT_MAX)
    if not stem:  # only the greatest code point: nothing sorts after its own extensions
        return prefix + TEXT_MAX * 64
    following = ord(stem[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are not text
        following = 0xE000
    return stem[:-1] + chr(following)


def after_last(found: Sequence[str]) -> str:
    """The least string after the last of ``found`` ("" for none). No stored text holds NUL
    (PostgreSQL's cannot, and onbeat's validation refuses control characters), so that is the
    last one with the least other code point appended."""
    return found[-1] + LEAST_CHAR if found else ""


def unique(ordered: Iterable[str]) -> Iterator[str]:
    previous = None
    for item in ordered:
        if item != previous:
            yield item
        previous = item


def published_task_of(r: Any) -> PublishedTask:
    return PublishedTask(
        name=r["name"],
        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
        timeout=r["timeout"],
        is_async=bool(r["is_async"]),
        worker=r["worker"],
        seen_at=from_us(r["seen_at"]),
    )
