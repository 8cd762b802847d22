"""S10's reference, checked against facts worked out by hand (no onbeat involved): if it were
wrong, agreeing with it would prove nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from tests.faults.dst_reference import CronSpec, daily_at, reference_fires, transitions, walk


def fires(
    spec: CronSpec, zone: str, start: datetime, hours: int
) -> list[tuple[datetime, str | None]]:
    end = start + timedelta(hours=hours)
    return reference_fires(spec, walk(ZoneInfo(zone), start, end), start, end)


def test_transitions__berlin_2026_and_apia_s_skipped_day() -> None:
    berlin = transitions("Europe/Berlin", 2026, 2027)
    assert [t.at for t in berlin] == [
        datetime(2026, 3, 29, 1, tzinfo=UTC),
        datetime(2026, 10, 25, 1, tzinfo=UTC),
    ]
    [skip] = [t for t in transitions("Pacific/Apia", 2011, 2012) if t.shift == timedelta(days=1)]
    assert skip.at == datetime(2011, 12, 30, 10, tzinfo=UTC)


def test_gap__a_skipped_daily_time_fires_once_at_the_jump() -> None:
    """Berlin 2026-03-29: 02:30 does not exist; 03:00 CEST is 01:00Z."""
    got = fires(
        daily_at(datetime(2026, 3, 29, 2, 30)),
        "Europe/Berlin",
        datetime(2026, 3, 28, 12, tzinfo=UTC),
        24,
    )
    assert got == [(datetime(2026, 3, 29, 1, tzinfo=UTC), "gap")]


def test_fold__daily_once_at_the_first_pass_and_hourly_at_both() -> None:
    """New York 2026-11-01: 01:30 EDT is 05:30Z, 01:30 EST is 06:30Z."""
    start = datetime(2026, 11, 1, 4, tzinfo=UTC)
    daily = fires(daily_at(datetime(2026, 11, 1, 1, 30)), "America/New_York", start, 4)
    assert daily == [(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "overlap")]
    hourly = fires(CronSpec("30 * * * *", frozenset({30})), "America/New_York", start, 4)
    assert hourly == [
        (datetime(2026, 11, 1, 4, 30, tzinfo=UTC), None),
        (datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "overlap"),
        (datetime(2026, 11, 1, 6, 30, tzinfo=UTC), "overlap"),
        (datetime(2026, 11, 1, 7, 30, tzinfo=UTC), None),
    ]
