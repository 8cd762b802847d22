"""Hypothesis strategies the suites share: what a submission may carry, as the store and the
API receive it (the API's checks already passed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from onbeat.model import MisfirePolicy, OverlapPolicy, RetryPolicy
from onbeat.schedule import Schedule
from onbeat.store.records import NewJob

__all__ = ["ZONES", "json_values", "schedules", "submissions"]

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]
"""Zones with DST gaps and overlaps, a half-hour DST shift and a quarter-hour offset."""

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)  # beyond 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
"""A params value: any JSON but NaN and infinities, which submissions refuse."""

schedules = st.one_of(
    st.builds(
        lambda cron, zone: Schedule.parse(cron=cron, timezone=zone),
        st.sampled_from(
            ["* * * * *", "30 2 * * *", "0 0 1 1 *", "*/7 * * * * *", "0 1-3 * 3,10,11 0"]
        ),
        st.sampled_from(ZONES),
    ),
    st.builds(  # an instant given in any UTC offset
        lambda seconds, offset: Schedule.parse(
            at=(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).astimezone(
                timezone(timedelta(minutes=offset))
            )
        ),
        st.floats(-86_400, 10**8).map(lambda s: round(s, 6)),
        st.integers(-12 * 60, 14 * 60),
    ),
    st.just(Schedule.parse()),
)


def submissions(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[NewJob]:
    """A NewJob of any schedule, params and policies; ``fields`` replace a field's strategy."""
    return st.builds(
        NewJob,
        **{
            "task": st.sampled_from(["tasks.noop", "tâche.ü"]),
            "params": st.dictionaries(st.text(max_size=8), json_values, max_size=4),
            "schedule": schedules,
            "retry": st.builds(
                RetryPolicy, st.integers(1, 50), st.floats(0, 1e4), st.floats(0, 1e6)
            ),
            "timeout": st.none() | st.floats(0.001, 1e6),
            "overlap": st.sampled_from(OverlapPolicy),
            "misfire": st.sampled_from(MisfirePolicy),
            "catchup_window": st.floats(0, 1e6),
            "priority": st.integers(-100, 100),
            "jitter": st.floats(0, 3600),
            "tenant": st.sampled_from(["default", "acme"]),
            **fields,
        },
    )
