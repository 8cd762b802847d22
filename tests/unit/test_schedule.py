"""Unit tests for onbeat.schedule: kinds, cron syntax, validation errors and concrete DST cases."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from onbeat.cron import restart
from onbeat.errors import ValidationError
from onbeat.schedule import (
    MAX_PREVIEW,
    DstFlag,
    FireTime,
    Schedule,
    ScheduleKind,
)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def local(
    zone: str, year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, fold: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold)


def fires(expr: str, after: datetime, count: int, timezone: str = "UTC") -> list[datetime]:
    return [f.at for f in Schedule.parse(cron=expr, timezone=timezone).fire_times(after, count)]


def fire_times(
    expr: str, after: datetime, count: int, timezone: str
) -> list[tuple[datetime, DstFlag]]:
    schedule = Schedule.parse(cron=expr, timezone=timezone)
    return [(f.at, f.dst) for f in schedule.fire_times(after, count)]


# --- kinds -----------------------------------------------------------------------------------------


def test_parse__neither_cron_nor_at_is_now() -> None:
    schedule = Schedule.parse()
    assert schedule == Schedule(ScheduleKind.NOW)
    assert schedule.expression is None and schedule.at is None and schedule.timezone == "UTC"


def test_now__first_fire_is_now_and_never_again() -> None:
    schedule = Schedule.parse(timezone="Europe/Berlin")
    now = local("Europe/Berlin", 2026, 5, 1, 12, 0)
    first = schedule.first_fire(now)
    assert first == now and first is not None and first.tzinfo is UTC
    assert schedule.next_fire_after(now) is None
    assert schedule.fire_times(now, 10) == []


def test_once__iso_string_with_offset_is_normalised_to_utc() -> None:
    schedule = Schedule.parse(at="2026-03-29T02:30:00+02:00")
    assert schedule.kind is ScheduleKind.ONCE
    assert schedule.at == utc(2026, 3, 29, 0, 30)
    assert schedule.at is not None and schedule.at.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-29T02:30:00Z", utc(2026, 3, 29, 2, 30)),
        ("2026-03-29 02:30:00.250000-05:30", utc(2026, 3, 29, 8, 0, 0, 250000)),
        ("20260329T023000+0100", utc(2026, 3, 29, 1, 30)),
        ("  2026-03-29T02:30Z  ", utc(2026, 3, 29, 2, 30)),
    ],
)
def test_once__iso_8601_forms(text: str, expected: datetime) -> None:
    assert Schedule.parse(at=text).at == expected


def test_once__aware_datetime_in_a_zone_is_normalised_to_utc() -> None:
    at = local("America/New_York", 2026, 11, 1, 1, 30, fold=1)  # the second 01:30: EST
    schedule = Schedule.parse(at=at, timezone="America/New_York")
    assert schedule.at == utc(2026, 11, 1, 6, 30)
    assert schedule.timezone == "America/New_York"


def test_once__first_fire_is_at_even_in_the_past() -> None:
    schedule = Schedule.parse(at=utc(2020, 1, 1))
    assert schedule.first_fire(utc(2026, 1, 1)) == utc(2020, 1, 1)
    assert schedule.next_fire_after(utc(2019, 1, 1)) is None


def test_once__fire_times_preview() -> None:
    schedule = Schedule.parse(at="2026-06-01T00:00:00Z")
    assert schedule.fire_times(utc(2026, 1, 1), 5) == [FireTime(utc(2026, 6, 1), None)]
    assert schedule.fire_times(utc(2026, 6, 1), 5) == []


def test_cron__parse_strips_and_keeps_the_expression() -> None:
    schedule = Schedule.parse(cron="  */15 * * * *\n", timezone="Europe/Berlin")
    assert schedule.kind is ScheduleKind.CRON
    assert schedule.expression == "*/15 * * * *"
    assert schedule.at is None and schedule.timezone == "Europe/Berlin"


def test_cron__first_fire_is_strictly_after_now() -> None:
    schedule = Schedule.parse(cron="*/15 * * * *")
    assert schedule.first_fire(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 15)
    assert schedule.first_fire(utc(2026, 1, 1, 10, 0, 0, 1)) == utc(2026, 1, 1, 10, 15)
    assert schedule.first_fire(utc(2026, 1, 1, 9, 59, 59, 999999)) == utc(2026, 1, 1, 10, 0)


def test_cron__next_fire_after_is_strictly_after_and_utc() -> None:
    schedule = Schedule.parse(cron="0 9 * * *", timezone="Asia/Tokyo")
    after = local("Asia/Tokyo", 2026, 1, 1, 9, 0)
    nxt = schedule.next_fire_after(after)
    assert nxt == utc(2026, 1, 2, 0, 0)
    assert nxt is not None and nxt.tzinfo is UTC


def test_cron__fire_times_count_is_capped() -> None:
    schedule = Schedule.parse(cron="* * * * * *")
    assert len(schedule.fire_times(utc(2026, 1, 1), 10**9)) == MAX_PREVIEW
    assert schedule.fire_times(utc(2026, 1, 1), 0) == []
    assert schedule.fire_times(utc(2026, 1, 1), -5) == []


def test_cron__fire_times_agree_with_repeated_next_fire_after() -> None:
    schedule = Schedule.parse(cron="*/20 1-3 * * *", timezone="America/New_York")
    after = utc(2026, 10, 31, 0, 0)
    previews = schedule.fire_times(after, 30)
    cursor: datetime | None = after
    for preview in previews:
        assert cursor is not None
        cursor = schedule.next_fire_after(cursor)
        assert cursor == preview.at


def test_cron__past_the_end_of_time_is_none() -> None:
    schedule = Schedule.parse(cron="0 0 1 1 *", timezone="Europe/Berlin")
    assert schedule.next_fire_after(datetime(9999, 12, 31, 23, 0, tzinfo=UTC)) is None


@pytest.mark.parametrize("method", ["first_fire", "next_fire_after"])
def test_cron__naive_instants_are_refused(method: str) -> None:
    schedule = Schedule.parse(cron="0 * * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        getattr(schedule, method)(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.fire_times(datetime(2026, 1, 1), 1)


def test_schedule__direct_construction_validates_and_normalises() -> None:
    stored = Schedule("cron", expression=" 0 * * * * ", timezone="Europe/Berlin")  # type: ignore[arg-type]
    assert stored.kind is ScheduleKind.CRON and stored.expression == "0 * * * *"
    once = Schedule(
        ScheduleKind.ONCE, at=datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    )
    assert once.at == utc(2026, 1, 1, 0) and once.at is not None and once.at.tzinfo is UTC
    with pytest.raises(ValidationError) as info:
        Schedule(ScheduleKind.CRON)
    assert info.value.field == "cron"
    with pytest.raises(ValidationError) as info:
        Schedule(ScheduleKind.NOW, expression="0 * * * *")
    assert info.value.field == "schedule"
    with pytest.raises(ValidationError) as info:
        Schedule(ScheduleKind.ONCE)
    assert info.value.field == "at"
    with pytest.raises(ValidationError) as info:
        Schedule("weekly")  # type: ignore[arg-type]
    assert info.value.field == "schedule"


def test_schedule__value_semantics() -> None:
    a = Schedule.parse(cron="0 * * * *", timezone="Europe/Berlin")
    b = Schedule.parse(cron="0 * * * *", timezone="Europe/Berlin")
    assert a == b and hash(a) == hash(b)
    assert a != Schedule.parse(cron="0 * * * *")
    assert pickle.loads(pickle.dumps(a)) == a
    assert copy.deepcopy(a) == a
    assert dataclasses.asdict(a) == {
        "kind": ScheduleKind.CRON,
        "expression": "0 * * * *",
        "at": None,
        "timezone": "Europe/Berlin",
    }
    moved = dataclasses.replace(a, timezone="Asia/Kolkata")
    assert moved.next_fire_after(utc(2026, 1, 1, 0, 0)) == utc(2026, 1, 1, 0, 30)


# --- cron syntax ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@hourly", [utc(2026, 1, 1, 11), utc(2026, 1, 1, 12)]),
        ("@daily", [utc(2026, 1, 2), utc(2026, 1, 3)]),
        ("@midnight", [utc(2026, 1, 2), utc(2026, 1, 3)]),
        ("@weekly", [utc(2026, 1, 4), utc(2026, 1, 11)]),  # Sundays
        ("@monthly", [utc(2026, 2, 1), utc(2026, 3, 1)]),
        ("@yearly", [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("@annually", [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("@DAILY", [utc(2026, 1, 2), utc(2026, 1, 3)]),
    ],
)
def test_cron__macros(macro: str, expected: list[datetime]) -> None:
    assert fires(macro, utc(2026, 1, 1, 10, 30), 2) == expected


def test_cron__macro_is_evaluated_in_the_zone() -> None:
    assert fires("@daily", utc(2026, 1, 1), 1, "Asia/Kolkata") == [utc(2026, 1, 1, 18, 30)]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # names, any case; 2026-01-01 is a Thursday
        ("0 9 * jan,JUL Mon-fri", utc(2026, 1, 1), [utc(2026, 1, 1, 9), utc(2026, 1, 2, 9)]),
        ("0 9 * * SAT,sun", utc(2026, 1, 1), [utc(2026, 1, 3, 9), utc(2026, 1, 4, 9)]),
        ("0 9 * FEB *", utc(2026, 1, 1), [utc(2026, 2, 1, 9), utc(2026, 2, 2, 9)]),
        # day-of-week 7 is Sunday too
        ("0 0 * * 7", utc(2026, 1, 1), [utc(2026, 1, 4), utc(2026, 1, 11)]),
        # steps, ranges, lists
        (
            "*/20 * * * *",
            utc(2026, 1, 1, 10, 5),
            [utc(2026, 1, 1, 10, 20), utc(2026, 1, 1, 10, 40)],
        ),
        (
            "5/20 * * * *",
            utc(2026, 1, 1, 10, 45),
            [utc(2026, 1, 1, 11, 5), utc(2026, 1, 1, 11, 25)],
        ),
        (
            "10-20/5 3 * * *",
            utc(2026, 1, 1, 3, 12),
            [utc(2026, 1, 1, 3, 15), utc(2026, 1, 1, 3, 20)],
        ),
        ("0 1,13,22 * * *", utc(2026, 1, 1, 14), [utc(2026, 1, 1, 22), utc(2026, 1, 2, 1)]),
        ("0 0 1-3,15 * *", utc(2026, 1, 2, 1), [utc(2026, 1, 3), utc(2026, 1, 15)]),
        ("0 0 */10 * *", utc(2026, 1, 25), [utc(2026, 1, 31), utc(2026, 2, 1)]),
        ("0 0 1 */4 *", utc(2026, 1, 25), [utc(2026, 5, 1), utc(2026, 9, 1)]),
        # a one-value range with a step is that one value (cronsim 2.8 alone reads it as 5/10)
        ("5-5/10 * * * *", utc(2026, 1, 1), [utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 1, 5)]),
        ("0 0 * * MON-MON/2", utc(2026, 1, 1), [utc(2026, 1, 5), utc(2026, 1, 12)]),
        # Feb 29 only in leap years
        ("0 0 29 2 *", utc(2026, 1, 1), [utc(2028, 2, 29), utc(2032, 2, 29)]),
        # both day fields restricted: either matches (the 13th, or a Friday)
        ("0 0 13 * FRI", utc(2026, 2, 8), [utc(2026, 2, 13), utc(2026, 2, 20)]),
        ("0 0 13 * 1", utc(2026, 2, 10), [utc(2026, 2, 13), utc(2026, 2, 16)]),
        # one of them starts with '*': both must match (Fridays among the 1st, 11th, 21st, 31st)
        ("0 0 */10 * FRI", utc(2026, 1, 1), [utc(2026, 5, 1), utc(2026, 7, 31)]),
    ],
)
def test_cron__syntax(expr: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expr, after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        (
            "*/20 * * * * *",
            utc(2026, 1, 1, 10, 0, 50),
            [utc(2026, 1, 1, 10, 1, 0), utc(2026, 1, 1, 10, 1, 20), utc(2026, 1, 1, 10, 1, 40)],
        ),
        (
            "30 0 12 * * *",
            utc(2026, 1, 1),
            [utc(2026, 1, 1, 12, 0, 30), utc(2026, 1, 2, 12, 0, 30), utc(2026, 1, 3, 12, 0, 30)],
        ),
        (
            "0,15 0 0 1 JAN *",
            utc(2026, 1, 1),
            [utc(2026, 1, 1, 0, 0, 15), utc(2027, 1, 1), utc(2027, 1, 1, 0, 0, 15)],
        ),
    ],
)
def test_cron__leading_seconds_field(expr: str, after: datetime, expected: list[datetime]) -> None:
    assert fires(expr, after, len(expected)) == expected


def test_cron__cached_iterator_matches_a_freshly_parsed_one() -> None:
    # schedule.py restarts a parsed CronSim instead of parsing again; guard that trick.
    start = datetime(2026, 3, 1, 12, 34, 56, 789)
    for expr in ["*/7 * * * *", "0 30 2 * * MON-FRI", "0 0 29 2 *", "15 10 1,15 * *"]:
        template = CronSim(expr, datetime(2000, 1, 1))
        restarted = restart(template, start)
        fresh = CronSim(expr, start)
        assert [next(restarted) for _ in range(20)] == [next(fresh) for _ in range(20)]


# --- validation -----------------------------------------------------------------------------------


def test_cron__error_message_names_field_value_and_range() -> None:
    with pytest.raises(ValidationError) as info:
        Schedule.parse(cron="61 * * * *")
    assert (
        str(info.value)
        == "cron: invalid expression '61 * * * *': minute value 61 out of range 0-59"
    )
    assert info.value.field == "cron"
    assert (
        info.value.message == "invalid expression '61 * * * *': minute value 61 out of range 0-59"
    )


INVALID: list[tuple[dict[str, Any], str, str]] = [
    # field counts
    ({"cron": ""}, "cron", "expression is empty"),
    ({"cron": "   "}, "cron", "expression is empty"),
    ({"cron": "* * * *"}, "cron", "expected 5 fields"),
    ({"cron": "* * * * * * *"}, "cron", "got 7"),
    ({"cron": "0 * * * * 2026"}, "cron", "day-of-week value 2026 out of range 0-7"),
    # out of range
    ({"cron": "60 * * * * *"}, "cron", "second value 60 out of range 0-59"),
    ({"cron": "* 24 * * *"}, "cron", "hour value 24 out of range 0-23"),
    ({"cron": "* * 0 * *"}, "cron", "day-of-month value 0 out of range 1-31"),
    ({"cron": "* * 32 * *"}, "cron", "day-of-month value 32 out of range 1-31"),
    ({"cron": "* * * 13 *"}, "cron", "month value 13 out of range 1-12"),
    ({"cron": "* * * * 8"}, "cron", "day-of-week value 8 out of range 0-7"),
    ({"cron": "0-1000000000 * * * *"}, "cron", "minute value 1000000000 out of range 0-59"),
    ({"cron": "9" * 200 + " * * * *"}, "cron", "out of range 0-59"),
    # ranges, steps, lists
    ({"cron": "5-1 * * * *"}, "cron", "minute range '5-1' is backwards"),
    ({"cron": "* * * * FRI-MON"}, "cron", "day-of-week range 'FRI-MON' is backwards"),
    ({"cron": "*/0 * * * *"}, "cron", "minute step 0 out of range 1-60"),
    ({"cron": "* */25 * * *"}, "cron", "hour step 25 out of range 1-24"),
    ({"cron": "*/x * * * *"}, "cron", "minute step 'x' is not a number"),
    ({"cron": "1,,2 * * * *"}, "cron", "empty list item"),
    ({"cron": "-5 * * * *"}, "cron", "minute has an empty value"),
    ({"cron": "1-2-3 * * * *"}, "cron", "minute value '2-3' is not a number 0-59"),
    ({"cron": "\u0663 * * * *"}, "cron", "is not a number 0-59"),
    # names
    ({"cron": "* * * FOO *"}, "cron", "month value 'FOO' is not a number 1-12 or a name JAN..DEC"),
    ({"cron": "* * * * FUNDAY"}, "cron", "day-of-week value 'FUNDAY' is not a number 0-7"),
    ({"cron": "* * MON * *"}, "cron", "day-of-month value 'MON' is not a number 1-31"),
    ({"cron": "JAN * * * *"}, "cron", "minute value 'JAN' is not a number 0-59"),
    # non-standard syntax
    ({"cron": "0 0 L * *"}, "cron", "not supported"),
    ({"cron": "0 0 15W * *"}, "cron", "not supported"),
    ({"cron": "0 0 * * MON#2"}, "cron", "not supported"),
    ({"cron": "0 0 ? * *"}, "cron", "not supported"),
    ({"cron": "H * * * *"}, "cron", "not supported"),
    ({"cron": "@reboot"}, "cron", "unknown macro"),
    ({"cron": "@fortnightly"}, "cron", "unknown macro"),
    # can never fire
    ({"cron": "0 0 31 2 *"}, "cron", "can never fire: day-of-month 31 never occurs in February"),
    ({"cron": "0 0 30 2 *"}, "cron", "can never fire: day-of-month 30 never occurs in February"),
    ({"cron": "0 0 30,31 FEB */7"}, "cron", "can never fire"),
    ({"cron": "0 0 31 4,6,9,11 *"}, "cron", "never occurs in April or June or September or Nov"),
    # huge strings
    ({"cron": "* " * 200}, "cron", "expression is 399 characters long; at most 256 allowed"),
    ({"cron": "1," * 500_000 + "1 * * * *"}, "cron", "at most 256 allowed"),
    ({"cron": 5}, "cron", "expression must be a string, got int"),
    # time zones
    ({"cron": "0 * * * *", "timezone": ""}, "timezone", "is empty"),
    ({"cron": "0 * * * *", "timezone": "Mars/Olympus_Mons"}, "timezone", "unknown time zone"),
    ({"cron": "0 * * * *", "timezone": "Europe"}, "timezone", "unknown time zone"),
    ({"cron": "0 * * * *", "timezone": "utc"}, "timezone", "unknown time zone"),
    ({"cron": "0 * * * *", "timezone": "../etc/passwd"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "/etc/localtime"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "localtime"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "posixrules"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "Factory"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "right/UTC"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "zone.tab"}, "timezone", "not an IANA time zone"),
    ({"cron": "0 * * * *", "timezone": "Europe/Berlin\x00"}, "timezone", "not an IANA time"),
    ({"cron": "0 * * * *", "timezone": "Europe/" * 100}, "timezone", "at most 64 allowed"),
    ({"cron": "0 * * * *", "timezone": 1}, "timezone", "got int"),
    ({"cron": "0 * * * *", "timezone": None}, "timezone", "got NoneType"),
    ({"timezone": "Nowhere/Land"}, "timezone", "unknown time zone"),
    ({"at": "2026-01-01T00:00Z", "timezone": "Nowhere/Land"}, "timezone", "unknown time zone"),
    # once
    ({"at": "2026-03-29T02:30:00"}, "at", "'2026-03-29T02:30:00' has no UTC offset"),
    ({"at": "2026-03-29"}, "at", "has no UTC offset"),
    ({"at": datetime(2026, 3, 29, 2, 30)}, "at", "'2026-03-29 02:30:00' has no UTC offset"),
    ({"at": "next tuesday"}, "at", "'next tuesday' is not an ISO-8601 timestamp"),
    ({"at": "2026-13-01T00:00Z"}, "at", "is not an ISO-8601 timestamp"),
    ({"at": ""}, "at", "is not an ISO-8601 timestamp"),
    ({"at": "2026-01-01T00:00Z" * 10}, "at", "at most 64 allowed"),
    ({"at": 1767225600}, "at", "must be an ISO-8601 string or an aware datetime, got int"),
    ({"at": date(2026, 1, 1)}, "at", "got date"),
    # both
    ({"cron": "0 * * * *", "at": "2026-01-01T00:00Z"}, "schedule", "not both"),
]


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    INVALID,
    ids=[f"{i}-{field}" for i, (_, field, _) in enumerate(INVALID)],
)
def test_parse__invalid_input_names_the_field(
    kwargs: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(ValidationError) as info:
        Schedule.parse(**kwargs)
    assert info.value.field == field
    assert fragment in info.value.message
    assert str(info.value).startswith(f"{field}: ")
    assert len(str(info.value)) < 300  # never echoes a huge input back


@pytest.mark.parametrize(
    "name",
    ["UTC", "Etc/UTC", "Etc/GMT+5", "America/Port-au-Prince", "America/Argentina/Buenos_Aires"],
)
def test_parse__valid_time_zones(name: str) -> None:
    assert Schedule.parse(cron="0 * * * *", timezone=name).timezone == name


def test_parse__etc_gmt_sign_is_posix_style() -> None:
    # Etc/GMT+5 is UTC-05:00 (POSIX sign convention); zoneinfo knows it, we just pass it through.
    assert fires("0 0 * * *", utc(2026, 1, 1), 1, "Etc/GMT+5") == [utc(2026, 1, 1, 5)]


# --- DST ------------------------------------------------------------------------------------------


def test_dst__berlin_spring_forward_fires_once_at_end_of_gap() -> None:
    # 2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist.
    got = fire_times("30 2 * * *", utc(2026, 3, 28, 12), 3, "Europe/Berlin")
    assert got == [
        (utc(2026, 3, 29, 1, 0), "gap"),  # 03:00 CEST
        (utc(2026, 3, 30, 0, 30), None),  # 02:30 CEST
        (utc(2026, 3, 31, 0, 30), None),
    ]


def test_dst__two_nonexistent_times_of_one_gap_are_one_fire() -> None:
    got = fire_times("0,30 2 * * *", utc(2026, 3, 28, 12), 2, "Europe/Berlin")
    assert got == [(utc(2026, 3, 29, 1, 0), "gap"), (utc(2026, 3, 30, 0, 0), None)]
    # ...and a real 03:00 at the same instant is the same fire
    got = fire_times("0 2,3 * * *", utc(2026, 3, 28, 12), 3, "Europe/Berlin")
    assert got == [
        (utc(2026, 3, 29, 1, 0), "gap"),
        (utc(2026, 3, 30, 0, 0), None),
        (utc(2026, 3, 30, 1, 0), None),
    ]


def test_dst__seconds_field_in_a_gap_fires_at_end_of_gap() -> None:
    got = fire_times("15 30 2 * * *", utc(2026, 3, 28, 12), 2, "Europe/Berlin")
    assert got == [(utc(2026, 3, 29, 1, 0), "gap"), (utc(2026, 3, 30, 0, 30, 15), None)]


def test_dst__hourly_in_a_gap_still_fires_every_real_hour() -> None:
    got = fire_times("0 * * * *", utc(2026, 3, 28, 23, 30), 4, "Europe/Berlin")
    assert got == [
        (utc(2026, 3, 29, 0, 0), None),  # 01:00 CET
        (utc(2026, 3, 29, 1, 0), "gap"),  # 02:00 does not exist -> 03:00 CEST
        (utc(2026, 3, 29, 2, 0), None),  # 04:00 CEST
        (utc(2026, 3, 29, 3, 0), None),
    ]


def test_dst__a_missed_half_past_fires_at_end_of_gap() -> None:
    # 02:30 does not exist; it is not silently skipped: it fires at 03:00 CEST.
    got = fire_times("30 * * * *", utc(2026, 3, 29, 0, 0), 3, "Europe/Berlin")
    assert got == [
        (utc(2026, 3, 29, 0, 30), None),
        (utc(2026, 3, 29, 1, 0), "gap"),
        (utc(2026, 3, 29, 1, 30), None),
    ]


def test_dst__berlin_fall_back_fires_once_at_first_occurrence() -> None:
    # 2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice.
    got = fire_times("30 2 * * *", utc(2026, 10, 24, 12), 2, "Europe/Berlin")
    assert got == [(utc(2026, 10, 25, 0, 30), "overlap"), (utc(2026, 10, 26, 1, 30), None)]


def test_dst__new_york_spring_forward() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT
    got = fire_times("30 2 * * *", utc(2026, 3, 7, 12), 2, "America/New_York")
    assert got == [(utc(2026, 3, 8, 7, 0), "gap"), (utc(2026, 3, 9, 6, 30), None)]


def test_dst__new_york_fall_back_fixed_time_fires_once() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens at 05:30Z and 06:30Z; fires at 05:30Z only.
    got = fire_times("30 1 * * *", utc(2026, 10, 31, 12), 2, "America/New_York")
    assert got == [(utc(2026, 11, 1, 5, 30), "overlap"), (utc(2026, 11, 2, 6, 30), None)]


def test_dst__new_york_fall_back_hourly_fires_at_both_one_oclocks() -> None:
    got = fire_times("0 * * * *", utc(2026, 11, 1, 3, 30), 4, "America/New_York")
    assert got == [
        (utc(2026, 11, 1, 4, 0), None),  # 00:00 EDT
        (utc(2026, 11, 1, 5, 0), "overlap"),  # 01:00 EDT
        (utc(2026, 11, 1, 6, 0), "overlap"),  # 01:00 EST
        (utc(2026, 11, 1, 7, 0), None),  # 02:00 EST
    ]
    # "every hour" spelled as a range is the same expression
    spelled = fire_times("0 0-23 * * *", utc(2026, 11, 1, 3, 30), 4, "America/New_York")
    assert spelled == got


def test_dst__fixed_hour_every_quarter_fires_only_in_first_pass() -> None:
    got = fire_times("*/15 1 * * *", utc(2026, 11, 1, 4, 0), 5, "America/New_York")
    assert got == [
        (utc(2026, 11, 1, 5, 0), "overlap"),
        (utc(2026, 11, 1, 5, 15), "overlap"),
        (utc(2026, 11, 1, 5, 30), "overlap"),
        (utc(2026, 11, 1, 5, 45), "overlap"),
        (utc(2026, 11, 2, 6, 0), None),
    ]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # hourly, from inside the first pass of 01:00-02:00: the second pass comes next
        ("0 * * * *", utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 0)),
        ("50 * * * *", utc(2026, 11, 1, 5, 55), utc(2026, 11, 1, 6, 50)),
        ("0,50 * * * *", utc(2026, 11, 1, 5, 55), utc(2026, 11, 1, 6, 0)),
        ("*/15 * * * *", utc(2026, 11, 1, 5, 20), utc(2026, 11, 1, 5, 30)),
        # ...and from inside the second pass
        ("0 * * * *", utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7, 0)),
        ("*/15 * * * *", utc(2026, 11, 1, 6, 20), utc(2026, 11, 1, 6, 30)),
        # fixed times, from inside the second pass: what is left of it already fired
        ("45 1 * * *", utc(2026, 11, 1, 6, 10), utc(2026, 11, 2, 6, 45)),
        ("* 1,2 * * *", utc(2026, 11, 1, 6, 10), utc(2026, 11, 1, 7, 0)),
        ("* * 1 * * *", utc(2026, 11, 1, 6, 10), utc(2026, 11, 2, 6, 0)),
    ],
)
def test_dst__next_fire_after_from_inside_a_repeated_hour(
    expr: str, after: datetime, expected: datetime
) -> None:
    schedule = Schedule.parse(cron=expr, timezone="America/New_York")
    assert schedule.next_fire_after(after) == expected


def test_dst__lord_howe_half_hour_gap() -> None:
    # 2026-10-04 02:00 +10:30 -> 02:30 +11: 02:15 does not exist, fires at 02:30 (15:30Z).
    got = fire_times("15 2 * * *", utc(2026, 10, 3, 0), 2, "Australia/Lord_Howe")
    assert got == [(utc(2026, 10, 3, 15, 30), "gap"), (utc(2026, 10, 4, 15, 15), None)]
    hourly = fire_times("0 * * * *", utc(2026, 10, 3, 14, 0), 3, "Australia/Lord_Howe")
    assert hourly == [
        (utc(2026, 10, 3, 14, 30), None),  # 01:00 +10:30
        (utc(2026, 10, 3, 15, 30), "gap"),  # 02:00 does not exist -> 02:30 +11
        (utc(2026, 10, 3, 16, 0), None),  # 03:00 +11
    ]


def test_dst__lord_howe_half_hour_overlap() -> None:
    # 2026-04-05 02:00 +11 -> 01:30 +10:30: 01:30-02:00 happens twice.
    got = fire_times("45 1 * * *", utc(2026, 4, 4, 0), 2, "Australia/Lord_Howe")
    assert got == [(utc(2026, 4, 4, 14, 45), "overlap"), (utc(2026, 4, 5, 15, 15), None)]
    quarter = fire_times("*/15 * * * *", utc(2026, 4, 4, 14, 0), 6, "Australia/Lord_Howe")
    assert quarter == [
        (utc(2026, 4, 4, 14, 15), None),  # 01:15 +11
        (utc(2026, 4, 4, 14, 30), "overlap"),  # 01:30 +11
        (utc(2026, 4, 4, 14, 45), "overlap"),  # 01:45 +11
        (utc(2026, 4, 4, 15, 0), "overlap"),  # 01:30 +10:30
        (utc(2026, 4, 4, 15, 15), "overlap"),  # 01:45 +10:30
        (utc(2026, 4, 4, 15, 30), None),  # 02:00 +10:30
    ]


def test_dst__kolkata_has_no_dst_and_a_half_hour_offset() -> None:
    got = fire_times("30 9 * * *", utc(2026, 3, 1), 2, "Asia/Kolkata")
    assert got == [(utc(2026, 3, 1, 4, 0), None), (utc(2026, 3, 2, 4, 0), None)]
    hourly = fires("0 * * * *", utc(2026, 3, 1), 2, "Asia/Kolkata")
    assert hourly == [utc(2026, 3, 1, 0, 30), utc(2026, 3, 1, 1, 30)]


def test_dst__apia_skipped_2011_12_30() -> None:
    # Samoa jumped from 2011-12-29 23:59:59 -10:00 to 2011-12-31 00:00 +14:00.
    zone = ZoneInfo("Pacific/Apia")
    got = fire_times("0 12 * * *", local("Pacific/Apia", 2011, 12, 28, 13), 3, "Pacific/Apia")
    assert got == [
        (utc(2011, 12, 29, 22, 0), None),  # 12-29 12:00 -10
        (utc(2011, 12, 30, 10, 0), "gap"),  # 12-30 12:00 never existed -> 12-31 00:00 +14
        (utc(2011, 12, 30, 22, 0), None),  # 12-31 12:00 +14
    ]
    local_days = [at.astimezone(zone).date() for at, _ in got]
    assert date(2011, 12, 30) not in local_days
    assert local_days == [date(2011, 12, 29), date(2011, 12, 31), date(2011, 12, 31)]


def test_dst__kiritimati_skipped_1994_12_31() -> None:
    got = fire_times("0 12 * * *", utc(1994, 12, 30, 0), 3, "Pacific/Kiritimati")
    assert got == [
        (utc(1994, 12, 30, 22, 0), None),  # 12-30 12:00 -10
        (utc(1994, 12, 31, 10, 0), "gap"),  # 12-31 never existed -> 1995-01-01 00:00 +14
        (utc(1994, 12, 31, 22, 0), None),  # 1995-01-01 12:00 +14
    ]


def test_dst__sydney_southern_hemisphere() -> None:
    # 2026-04-05 03:00 AEDT -> 02:00 AEST; 2026-10-04 02:00 AEST -> 03:00 AEDT
    autumn = fire_times("30 2 * * *", utc(2026, 4, 4, 0), 2, "Australia/Sydney")
    assert autumn == [(utc(2026, 4, 4, 15, 30), "overlap"), (utc(2026, 4, 5, 16, 30), None)]
    spring = fire_times("30 2 * * *", utc(2026, 10, 3, 0), 2, "Australia/Sydney")
    assert spring == [(utc(2026, 10, 3, 16, 0), "gap"), (utc(2026, 10, 4, 15, 30), None)]


def test_dst__sao_paulo_midnight_did_not_exist() -> None:
    # 2018-11-04 00:00 -03 -> 01:00 -02
    got = fire_times("0 0 * * *", utc(2018, 11, 3, 12), 2, "America/Sao_Paulo")
    assert got == [(utc(2018, 11, 4, 3, 0), "gap"), (utc(2018, 11, 5, 2, 0), None)]
    assert got[0][0].astimezone(ZoneInfo("America/Sao_Paulo")).replace(tzinfo=None) == datetime(
        2018, 11, 4, 1, 0
    )


def test_dst__sao_paulo_repeated_hour_before_midnight() -> None:
    # 2019-02-17 00:00 -02 -> 2019-02-16 23:00 -03: 23:30 happens twice, fires once.
    got = fire_times("30 23 * * *", utc(2019, 2, 16, 12), 2, "America/Sao_Paulo")
    assert got == [(utc(2019, 2, 17, 1, 30), "overlap"), (utc(2019, 2, 18, 2, 30), None)]


def test_dst__flag_is_none_for_ordinary_fires_and_utc() -> None:
    assert {
        f.dst for f in Schedule.parse(cron="*/7 * * * *").fire_times(utc(2026, 3, 29), 500)
    } == {None}
    berlin = Schedule.parse(cron="0 12 * * *", timezone="Europe/Berlin")
    assert {f.dst for f in berlin.fire_times(utc(2026, 1, 1), 365)} == {None}
