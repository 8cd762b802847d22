"""The idempotency fingerprint: keys stored earlier must keep matching their submissions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from onbeat.model import MisfirePolicy, OverlapPolicy, RetryPolicy
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.store.records import NewJob
from onbeat.store.rows import fingerprint


def _as_stored_before(new: NewJob) -> str:
    """How fingerprints were computed until 2026-12-02 (``dataclasses.asdict``)."""
    described = dataclasses.asdict(dataclasses.replace(new, idempotency_key=None))
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


schedules = st.one_of(
    st.just(Schedule(ScheduleKind.NOW)),
    st.builds(
        lambda at: Schedule(ScheduleKind.ONCE, at=at),
        st.datetimes(timezones=st.just(UTC), min_value=datetime(2020, 1, 1)),
    ),
    st.sampled_from(
        [
            Schedule(ScheduleKind.CRON, "*/5 * * * *"),
            Schedule(ScheduleKind.CRON, "0 9 * * MON-FRI", timezone="Europe/Berlin"),
        ]
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
submissions = st.builds(
    NewJob,
    task=st.text(min_size=1, max_size=10),
    params=st.dictionaries(st.text(max_size=5), json_values, max_size=4),
    schedule=schedules,
    retry=st.builds(RetryPolicy, st.integers(1, 10), st.floats(0, 10), st.floats(10, 100)),
    timeout=st.none() | st.floats(1, 100),
    overlap=st.sampled_from(OverlapPolicy),
    misfire=st.sampled_from(MisfirePolicy),
    priority=st.integers(-10, 10),
    tenant=st.sampled_from(["default", "acme"]),
    idempotency_key=st.none() | st.text(min_size=1, max_size=8),
)


@given(submissions)
def test_fingerprint__is_the_one_keys_were_stored_with(new: NewJob) -> None:
    assert fingerprint(new) == _as_stored_before(new)


def test_fingerprint__tells_submissions_apart_and_ignores_the_key() -> None:
    new = NewJob("report.send", {"to": "a"}, Schedule(ScheduleKind.NOW), idempotency_key="k1")
    assert fingerprint(new) == fingerprint(dataclasses.replace(new, idempotency_key="k2"))
    assert fingerprint(new) != fingerprint(dataclasses.replace(new, params={"to": "b"}))
    assert fingerprint(new) != fingerprint(dataclasses.replace(new, retry=RetryPolicy(4)))
