"""The creates answer with ``job_document`` written as plain values, without building ``JobOut``:
for every kind of job its bytes must be the model's, or a client would read another document
than the one the OpenAPI schema and every other route give it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from onbeat.api.deps import serialized
from onbeat.api.schemas import JobOut, job_document
from onbeat.model import Job, JobStatus
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
    written = serialized(document).body
    assert written == JobOut.model_validate(document).model_dump_json().encode()
    assert serialized({"items": [document]}).body == b'{"items":[' + written + b"]}"
