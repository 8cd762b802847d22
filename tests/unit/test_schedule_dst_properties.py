"""Property tests for cron schedules across daylight-saving transitions.

The reference oracle below shares no code with onbeat.schedule or its cron library: expressions
are generated together with the value sets they mean, and the oracle walks UTC minute by minute,
reads the local wall clock with zoneinfo, matches the sets, and applies the DST policy:

* gap: wall times skipped by a forward jump that match fire once, at the jump's instant;
* overlap: a repeated wall time fires at its first occurrence only, unless the hour field covers
  all 24 hours, in which case every matching instant fires.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from onbeat.schedule import DstFlag, FireTime, Schedule
from tests.faults.dst_reference import MINUTE, Transition, offset_at, transitions

WINDOW = timedelta(hours=30)

ZONES = [
    "Europe/Berlin",  # northern hemisphere, 1 h shift at 02:00/03:00
    "America/New_York",  # northern hemisphere, transitions at 02:00 local
    "Australia/Sydney",  # southern hemisphere
    "America/Santiago",  # southern hemisphere, transitions at midnight
    "America/Havana",  # transitions at midnight (00:00 -> 01:00, 01:00 -> 00:00)
    "Asia/Beirut",  # transitions at midnight
    "America/Asuncion",  # southern hemisphere, midnight transitions until 2024
    "Australia/Lord_Howe",  # 30-minute DST shift
    "Antarctica/Troll",  # 2-hour DST shift
    "America/St_Johns",  # -03:30, not a whole hour, with DST
    "Pacific/Chatham",  # +12:45/+13:45, not a whole hour, with DST
    "Asia/Kolkata",  # +05:30, no DST
    "Asia/Kathmandu",  # +05:45, no DST
    "Pacific/Apia",  # skipped 2011-12-30; DST until 2021
    "Pacific/Kiritimati",  # +14, skipped 1994-12-31; no DST now
    "Africa/Casablanca",  # DST suspended during Ramadan (transitions at 02:00/03:00)
    "Europe/Dublin",  # "negative DST" in the tz database
    "Asia/Tokyo",  # no DST
    "UTC",
]
YEARS = (2020, 2036)  # [start, end) of the span the random instants come from

# Windows around transitions before 2020, for zones whose most extreme transition is historic.
HISTORIC = [
    ("Pacific/Apia", 2011, 2012),  # 2011-12-30 never happened
    ("Pacific/Kiritimati", 1994, 1995),  # 1994-12-31 never happened
    ("America/Sao_Paulo", 2018, 2019),  # 00:00 did not exist on 2018-11-04
]


# --- transitions, found by scanning with zoneinfo ------------------------------------------------


@dataclass(frozen=True)
class Spec:
    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday; 7 is folded into 0
    either_day: bool  # both day fields restricted: a day matches if either does

    def day_matches(self, wall: datetime) -> bool:
        in_month = wall.month in self.months
        dom = wall.day in self.days
        dow = (wall.isoweekday() % 7) in self.weekdays
        return in_month and ((dom or dow) if self.either_day else (dom and dow))

    def minute_matches(self, wall: datetime) -> bool:
        return wall.minute in self.minutes and wall.hour in self.hours and self.day_matches(wall)

    @property
    def every_hour(self) -> bool:
        return self.hours == frozenset(range(24))


Part = tuple[str, frozenset[int]]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def render(value: int, names: list[str] | None, offset: int, draw: st.DrawFn) -> str:
    if names is not None and draw(st.booleans()):
        name = names[value - offset]
        return draw(st.sampled_from([name, name.lower(), name.title()]))
    return str(value)


@st.composite
def field_part(
    draw: st.DrawFn,
    low: int,
    high: int,
    *,
    names: list[str] | None = None,
    focus: list[int] | None = None,
    star_weight: int = 1,
) -> Part:
    """One field: '*', '*/n', 'a', 'a,b,c', 'a-b', 'a-b/n' or 'a/n', with the set it means."""
    name_high = high if names is None else low + len(names) - 1
    value = st.integers(low, high)
    if focus:  # mostly values near a DST transition
        value = st.one_of(
            st.sampled_from(focus), st.sampled_from(focus), st.sampled_from(focus), value
        )
    form = draw(
        st.sampled_from(
            ["*"] * star_weight + ["step", "one", "list", "range", "range-step", "from"]
        )
    )
    everything = range(low, high + 1)
    if form == "*":
        return "*", frozenset(everything)
    if form == "step":
        step = draw(st.integers(1, high - low + 1))
        return f"*/{step}", frozenset(everything[::step])
    if form == "one":
        v = draw(value)
        return render(v, names if v <= name_high else None, low, draw), frozenset({v})
    if form == "list":
        values = draw(st.lists(value, min_size=1, max_size=4))
        text = ",".join(render(v, names if v <= name_high else None, low, draw) for v in values)
        return text, frozenset(values)
    a, b = sorted(draw(st.tuples(value, value)))
    if form == "from":
        step = draw(st.integers(1, high - low + 1))
        return f"{a}/{step}", frozenset(range(a, high + 1, step))
    text = f"{a}-{b}"
    if form == "range":
        return text, frozenset(range(a, b + 1))
    step = draw(st.integers(1, high - low + 1))
    return f"{text}/{step}", frozenset(range(a, b + 1, step))


def mostly_star(
    part: st.SearchStrategy[Part], everything: frozenset[int]
) -> st.SearchStrategy[Part]:
    return st.one_of(st.just(("*", everything)), st.just(("*", everything)), part)


@dataclass(frozen=True)
class Focus:
    """Field values around a DST transition, so generated expressions often name its times."""

    hours: list[int]
    days: list[int]
    months: list[int]
    weekdays: list[int]


@st.composite
def specs(draw: st.DrawFn, focus: Focus | None = None) -> Spec:
    seconds_part: Part | None = None
    if draw(st.integers(0, 9)) == 0:  # now and then a leading seconds field
        seconds_part = draw(
            st.sampled_from(
                [
                    ("0", frozenset({0})),
                    ("15", frozenset({15})),
                    ("0,30", frozenset({0, 30})),
                    ("*/20", frozenset({0, 20, 40})),
                ]
            )
        )
    minutes = draw(field_part(0, 59, focus=[0, 15, 30, 45]))
    near = focus or Focus([], [], [], [])
    hours = draw(field_part(0, 23, focus=near.hours, star_weight=2))
    days = draw(mostly_star(field_part(1, 31, focus=near.days), frozenset(range(1, 32))))
    months = draw(
        mostly_star(field_part(1, 12, names=MONTHS, focus=near.months), frozenset(range(1, 13)))
    )
    weekdays = draw(
        mostly_star(field_part(0, 7, names=DAYS, focus=near.weekdays), frozenset(range(8)))
    )
    if min(days[1]) > 29 and (days[0].startswith("*") or weekdays[0].startswith("*")):
        days = ("*", frozenset(range(1, 32)))  # would never fire: refused, tested elsewhere
    parts = [minutes[0], hours[0], days[0], months[0], weekdays[0]]
    seconds = frozenset({0})
    if seconds_part is not None:
        parts.insert(0, seconds_part[0])
        seconds = frozenset(seconds_part[1])
    return Spec(
        text=" ".join(parts),
        seconds=seconds,
        minutes=minutes[1],
        hours=hours[1],
        days=days[1],
        months=months[1],
        weekdays=frozenset(d % 7 for d in weekdays[1]),
        either_day=not days[0].startswith("*") and not weekdays[0].startswith("*"),
    )


# --- the oracle ------------------------------------------------------------------------------------


def oracle(spec: Spec, zone: ZoneInfo, start: datetime, end: datetime) -> list[FireTime]:
    """Fire times in (start, end], brute force: every UTC minute, read on the local wall clock."""
    fired: dict[datetime, DstFlag] = {}

    def fire(at: datetime, flag: DstFlag) -> None:
        if start < at <= end:
            fired[at] = "gap" if "gap" in (flag, fired.get(at)) else flag

    minute = start.astimezone(UTC).replace(second=0, microsecond=0)
    previous = offset_at(zone, minute - MINUTE)
    while minute <= end:
        here = minute.astimezone(zone)
        offset = here.utcoffset()
        assert offset is not None
        wall = here.replace(tzinfo=None, fold=0)
        if offset > previous:  # clocks jumped forward: [wall - jump, wall) never happened
            skipped = wall - (offset - previous)
            while skipped < wall:
                if spec.minute_matches(skipped):
                    fire(minute, "gap")
                    break
                skipped += MINUTE
        twice = here.replace(fold=1 - here.fold).utcoffset() != offset
        repeat = twice and here.fold == 1 and not spec.every_hour  # fired in the first pass
        if spec.minute_matches(wall) and not repeat:
            for second in sorted(spec.seconds):
                fire(minute + timedelta(seconds=second), "overlap" if twice else None)
        previous = offset
        minute += MINUTE
    return [FireTime(at, flag) for at, flag in sorted(fired.items())]


def product(spec: Spec, zone_name: str, start: datetime, end: datetime) -> list[FireTime]:
    schedule = Schedule.parse(cron=spec.text, timezone=zone_name)
    out: list[FireTime] = []
    cursor = start
    while True:
        batch = schedule.fire_times(cursor, 500)
        for fire in batch:
            if fire.at > end:
                return out
            out.append(fire)
        if len(batch) < 500:
            return out
        cursor = batch[-1].at


# --- strategies for instants -----------------------------------------------------------------------


@st.composite
def zone_and_start(draw: st.DrawFn) -> tuple[str, datetime, Focus | None]:
    """A zone, a start instant, and field values around a transition in the window (if any)."""
    if draw(st.integers(0, 7)) == 0:
        name, first, end = draw(st.sampled_from(HISTORIC))
    else:
        name = draw(st.sampled_from(ZONES))
        first, end = YEARS
    zone = ZoneInfo(name)
    nearby = transitions(name, first, end)
    if nearby and draw(st.integers(0, 4)) > 0:
        transition = draw(st.sampled_from(nearby))
        # put the transition somewhere inside the window
        lead = draw(st.integers(1, int(WINDOW.total_seconds()) - 1))
        start = transition.at - timedelta(seconds=lead)
        # the local hours the jump skips or repeats, and their neighbours
        edge = (transition.at - MINUTE).astimezone(zone).replace(tzinfo=None) + MINUTE
        other = transition.at.astimezone(zone).replace(tzinfo=None)
        wall, stop = min(edge, other), max(edge, other)
        affected: set[int] = set()
        while wall < stop:
            affected.add(wall.hour)
            wall += timedelta(minutes=15)
        around = {(h + d) % 24 for h in affected for d in (-1, 1)} - affected
        dates = {edge.date(), other.date(), (edge - MINUTE).date()}
        focus: Focus | None = Focus(
            hours=sorted(affected) * 3 + sorted(around),
            days=sorted({d.day for d in dates}),
            months=sorted({d.month for d in dates}),
            weekdays=sorted({d.isoweekday() % 7 for d in dates}),
        )
    else:
        low = int(datetime(first, 1, 1, tzinfo=UTC).timestamp())
        high = int(datetime(end, 1, 1, tzinfo=UTC).timestamp()) - 1
        start = datetime.fromtimestamp(draw(st.integers(low, high)), UTC)
        focus = None
    if draw(st.booleans()):
        start += timedelta(microseconds=draw(st.integers(0, 999_999)))
    return name, start, focus


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, datetime, Spec]:
    name, start, focus = draw(zone_and_start())
    return name, start, draw(specs(focus))


SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


# --- properties ------------------------------------------------------------------------------------


def round_trips(at: datetime, zone: ZoneInfo) -> bool:
    here = at.astimezone(zone)
    again = here.replace(tzinfo=None).replace(tzinfo=zone, fold=here.fold).astimezone(UTC)
    return again == at


@SETTINGS
@given(cases())
def test_fire_times__strictly_increasing_real_instants(case: tuple[str, datetime, Spec]) -> None:
    name, start, spec = case
    zone = ZoneInfo(name)
    schedule = Schedule.parse(cron=spec.text, timezone=name)
    fires = schedule.fire_times(start, 60)
    assert fires, spec.text  # every generated expression fires eventually
    previous = start
    for fire in fires:
        assert fire.at.tzinfo is UTC
        assert fire.at > previous
        assert schedule.next_fire_after(previous) == fire.at
        assert round_trips(fire.at, zone)
        wall = fire.at.astimezone(zone).replace(tzinfo=None)
        if fire.dst == "gap":  # fired at the first instant after a forward jump
            assert offset_at(zone, fire.at - timedelta(seconds=1)) < offset_at(zone, fire.at)
        else:
            assert spec.minute_matches(wall) and wall.second in spec.seconds, (spec.text, fire)
        previous = fire.at


@SETTINGS
@given(cases())
def test_fire_times__agree_with_brute_force_oracle(case: tuple[str, datetime, Spec]) -> None:
    name, start, spec = case
    end = start + WINDOW
    expected = oracle(spec, ZoneInfo(name), start, end)
    assert product(spec, name, start, end) == expected, spec.text
    event(f"fires in window: {'none' if not expected else 'some'}")
    for flag in sorted({str(f.dst) for f in expected}):
        event(f"window has a {flag} fire")


def jumps(forward: bool) -> Iterator[tuple[str, Transition]]:
    for name in ZONES:
        for transition in transitions(name, *YEARS):
            if (transition.after > transition.before) == forward:
                yield name, transition


GAPS = list(jumps(forward=True))
OVERLAPS = list(jumps(forward=False))


def daily_at(wall: datetime) -> str:
    return f"{wall.minute} {wall.hour} * * *"


def fires_near(expr: str, name: str, around: datetime) -> list[FireTime]:
    schedule = Schedule.parse(cron=expr, timezone=name)
    return [
        f
        for f in schedule.fire_times(around - timedelta(hours=20), 10)
        if f.at < around + timedelta(hours=20)
    ]


@settings(max_examples=100, deadline=None, database=None)
@given(st.sampled_from(GAPS), st.data())
def test_gap__nonexistent_local_time_fires_once_just_after_the_gap(
    gap: tuple[str, Transition], data: st.DataObject
) -> None:
    name, transition = gap
    zone = ZoneInfo(name)
    jump = transition.after - transition.before
    gap_start = (transition.at - MINUTE).astimezone(zone).replace(tzinfo=None) + MINUTE
    missing = gap_start + data.draw(st.integers(0, jump // MINUTE - 1)) * MINUTE
    assert (
        missing.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        != missing
    )
    got = fires_near(daily_at(missing), name, transition.at)
    assert got == [FireTime(transition.at.astimezone(UTC), "gap")]


@settings(max_examples=100, deadline=None, database=None)
@given(st.sampled_from(OVERLAPS), st.data())
def test_overlap__ambiguous_local_time_fires_exactly_once(
    overlap: tuple[str, Transition], data: st.DataObject
) -> None:
    name, transition = overlap
    zone = ZoneInfo(name)
    back = transition.before - transition.after
    second_pass = transition.at + data.draw(st.integers(0, back // MINUTE - 1)) * MINUTE
    repeated = second_pass.astimezone(zone)
    assert repeated.fold == 1
    wall = repeated.replace(tzinfo=None, fold=0)
    first_pass = wall.replace(tzinfo=zone).astimezone(UTC)
    assert first_pass == second_pass - back

    got = fires_near(daily_at(wall), name, transition.at)
    assert got == [FireTime(first_pass, "overlap")]

    # an hourly expression fires in both passes: they are distinct instants
    hourly = Schedule.parse(cron=f"{wall.minute} * * * *", timezone=name)
    at_that_minute = [
        f
        for f in hourly.fire_times(first_pass - timedelta(seconds=1), 4)
        if f.at.astimezone(zone).replace(tzinfo=None) == wall
    ]
    assert at_that_minute == [
        FireTime(first_pass, "overlap"),
        FireTime(second_pass.astimezone(UTC), "overlap"),
    ]


def test_zones__cover_what_the_policy_needs() -> None:
    """The zone list really has what RELIABILITY.md asks for, between 2020 and 2035."""
    spans: dict[str, set[timedelta]] = {}
    for name in ZONES:
        spans[name] = {abs(t.after - t.before) for t in transitions(name, *YEARS)}
    assert len(ZONES) >= 12
    assert timedelta(minutes=30) in spans["Australia/Lord_Howe"]
    assert timedelta(hours=2) in spans["Antarctica/Troll"]
    assert not spans["Asia/Kolkata"] and not spans["Asia/Tokyo"] and not spans["UTC"]
    southern = transitions("Australia/Sydney", *YEARS)[0]
    assert southern.at.month == 4 and southern.after < southern.before  # April: fall back

    def midnight(t: Transition, name: str) -> bool:
        zone = ZoneInfo(name)
        return (t.at - MINUTE).astimezone(zone).hour == 23 or t.at.astimezone(zone).hour == 0

    for name in ("America/Santiago", "America/Havana", "Asia/Beirut"):
        assert any(midnight(t, name) for t in transitions(name, *YEARS)), name
    skipped = transitions("Pacific/Apia", 2011, 2012)
    assert any(t.after - t.before == timedelta(hours=24) for t in skipped)
