"""The creates answer with ``job_document`` written as plain values, without building ``JobOut``:
for every kind of job its bytes must be the model's, or a client would read another document
than the one the OpenAPI schema and every other route give it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onbeat.api.deps import serialized
from onbeat.api.schemas import JobOut, in_utc, job_document
from onbeat.model import Job, JobStatus, MisfirePolicy, OverlapPolicy, RetryPolicy
from onbeat.schedule import Schedule
from onbeat.testing.strategies import submissions

BASE = datetime(2026, 3, 1, tzinfo=UTC)
instants = st.integers(0, 400 * 86_400_000_000).map(lambda us: BASE + timedelta(microseconds=us))


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    """A stored job of any submission, status and next fire time."""
    new = draw(submissions())
    created = draw(instants)
    return Job(
        id=draw(st.text(min_size=1, max_size=30)),
        task=new.task,
        params=new.params,
        schedule=new.schedule,
        retry=new.retry,
        timeout=new.timeout,
        overlap=new.overlap,
        misfire=new.misfire,
        catchup_window=new.catchup_window,
        priority=new.priority,
        jitter=new.jitter,
        tenant=new.tenant,
        status=draw(st.sampled_from(JobStatus)),
        next_fire_at=draw(st.none() | st.just(new.schedule.next_fire_after(created))),
        shard=draw(st.integers(0, 1023)),
        created_at=created,
        updated_at=created + draw(st.integers(0, 10**9).map(lambda us: timedelta(microseconds=us))),
    )


@given(jobs())
def test_job_document__is_written_as_job_out_would_be(job: Job) -> None:
    document: dict[str, Any] = job_document(job)
    written = serialized(document, in_utc=in_utc(document)).body
    assert written == JobOut.model_validate(document).model_dump_json().encode()
    assert serialized(document).body == written  # pydantic's own writer, without instants
    batch = serialized({"items": [document]}, in_utc=in_utc(document)).body
    assert batch == b'{"items":[' + written + b"]}"


@pytest.mark.parametrize(
    "offset",
    [timedelta(seconds=30), timedelta(hours=-3, seconds=-1), timedelta(microseconds=1)],
)
def test_job_document__an_offset_with_seconds_is_written_as_job_out_would_be(
    offset: timedelta,
) -> None:
    """orjson rounds such an offset to the minute where pydantic truncates it: left to
    pydantic. (A submitted ``at`` is stored in UTC; a Schedule made in Python may keep its.)"""
    at = datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=timezone(offset))
    schedule = dataclasses.replace(Schedule.parse(at=at), at=at)
    job = dataclasses.replace(_job(), schedule=schedule, next_fire_at=at, created_at=at)
    document = job_document(job)
    written = serialized(document, in_utc=in_utc(document)).body
    assert written == JobOut.model_validate(document).model_dump_json().encode()
    assert b"+00:00:30" not in written  # what neither writes; the model's bytes are the test


def test_job_document__an_integer_past_64_bits_is_written_as_job_out_would_be() -> None:
    job = dataclasses.replace(_job(), params={"big": 2**64, "small": -(2**63) - 1, "ok": 2**63})
    document = job_document(job)
    written = serialized(document, in_utc=in_utc(document)).body
    assert written == JobOut.model_validate(document).model_dump_json().encode()
    assert b'"big":18446744073709551616' in written


def _job() -> Job:
    return Job(
        id="j1",
        task="tasks.noop",
        params={"n": 1},
        schedule=Schedule.parse(cron="0 0 1 1 *", timezone="Europe/Paris"),
        retry=RetryPolicy(3, 1.0, 300.0),
        timeout=None,
        overlap=OverlapPolicy.SKIP,
        misfire=MisfirePolicy.RUN_ONCE,
        catchup_window=3600.0,
        priority=0,
        jitter=0.0,
        tenant="default",
        status=JobStatus.ACTIVE,
        next_fire_at=datetime(2026, 12, 31, 23, tzinfo=UTC),
        shard=1,
        created_at=BASE,
        updated_at=BASE,
    )
