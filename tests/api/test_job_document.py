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
from onbeat.model import Job, JobStatus, MisfirePolicy, OverlapPolicy, RetryPolicy
from onbeat.schedule import Schedule

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]
CRONS = ["* * * * *", "30 2 * * *", "0 0 1 1 *", "*/7 * * * * *", "0 1-3 * 3,10,11 0"]
BASE = datetime(2026, 3, 1, tzinfo=UTC)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
instants = st.integers(0, 400 * 86_400_000_000).map(lambda us: BASE + timedelta(microseconds=us))


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    kind = draw(st.sampled_from(["cron", "once", "now"]))
    zone = draw(st.sampled_from(ZONES))
    if kind == "cron":
        return Schedule.parse(cron=draw(st.sampled_from(CRONS)), timezone=zone)
    if kind == "once":
        return Schedule.parse(at=draw(instants), timezone=zone)
    return Schedule.parse(timezone=zone)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    schedule = draw(schedules())
    created = draw(instants)
    return Job(
        id=draw(st.text(min_size=1, max_size=30)),
        task=draw(st.text(min_size=1, max_size=30)),
        params=draw(st.dictionaries(st.text(max_size=10), json_values, max_size=4)),
        schedule=schedule,
        retry=RetryPolicy(
            draw(st.integers(1, 100)), draw(st.floats(0, 1e6)), draw(st.floats(0, 1e7))
        ),
        timeout=draw(st.none() | st.floats(0.001, 1e6)),
        overlap=draw(st.sampled_from(OverlapPolicy)),
        misfire=draw(st.sampled_from(MisfirePolicy)),
        catchup_window=draw(st.floats(0, 1e7)),
        priority=draw(st.integers(-100, 100)),
        jitter=draw(st.floats(0, 3600)),
        tenant="default",
        status=draw(st.sampled_from(JobStatus)),
        next_fire_at=draw(st.none() | st.just(schedule.next_fire_after(created))),
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
