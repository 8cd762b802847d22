"""S10's brute-force reference for cron fire times across daylight-saving transitions.

It shares no code with onbeat's cron engine (``onbeat.schedule``, cronsim): an expression is
given together with the value sets it means (:class:`CronSpec`), so nothing is parsed here; the
reference walks every UTC minute of a window, reads the local wall clock with ``zoneinfo`` and
matches the sets. The DST policy it applies is the documented one (docs/ and
RELIABILITY.md), written out independently:

* **gap** (clocks jump forward): wall times the jump skipped that match fire once, at the first
  instant after the gap (several skipped matches, and a real match at that instant, are one fire);
* **fold** (clocks go back): a repeated wall time fires once, at its first occurrence, unless the
  hour field covers all 24 hours (an hourly or minutely expression is about elapsed time, so it
  fires in both passes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

MINUTE = timedelta(minutes=1)
ALL_HOURS = frozenset(range(24))
ALL_DAYS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_WEEKDAYS = frozenset(range(7))

Fire = tuple[datetime, str | None]
"""A fire instant (aware UTC) and its DST flag: ``"gap"``, ``"overlap"`` or None."""


@dataclass(frozen=True, slots=True)
class Transition:
    at: datetime
    """Aware UTC: the first instant with the new offset."""
    before: timedelta
    after: timedelta

    @property
    def shift(self) -> timedelta:
        """Positive: clocks jumped forward (a gap); negative: they went back (a fold)."""
        return self.after - self.before


def offset_at(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


@functools.cache
def transitions(name: str, first_year: int, end_year: int) -> tuple[Transition, ...]:
    """Every UTC-offset change of zone ``name`` in [first_year, end_year), to the minute: daily
    samples, then bisection (zones change offset at most once a day)."""
    zone = ZoneInfo(name)
    found: list[Transition] = []
    day = datetime(first_year, 1, 1, tzinfo=UTC)
    end = datetime(end_year, 1, 1, tzinfo=UTC)
    previous = offset_at(zone, day)
    while day < end:
        following = day + timedelta(days=1)
        offset = offset_at(zone, following)
        if offset != previous:
            low, high = day, following
            while high - low > MINUTE:
                middle = (low + (high - low) / 2).replace(second=0, microsecond=0)
                low, high = (middle, high) if offset_at(zone, middle) == previous else (low, middle)
            found.append(Transition(high, previous, offset))
        previous, day = offset, following
    return tuple(found)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A cron expression and what it means, written out by hand (never parsed here)."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int] = ALL_HOURS
    days: frozenset[int] = ALL_DAYS
    months: frozenset[int] = ALL_MONTHS
    weekdays: frozenset[int] = ALL_WEEKDAYS
    """0 = Sunday."""
    seconds: frozenset[int] = frozenset({0})
    either_day: bool = False
    """Both day fields restricted: a day matches if either does (Vixie cron)."""

    def matches(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        in_month = wall.day in self.days
        in_week = wall.isoweekday() % 7 in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    @property
    def every_hour(self) -> bool:
        return self.hours == ALL_HOURS


def daily_at(wall: datetime) -> CronSpec:
    """``M H * * *`` for the wall time of ``wall``."""
    return CronSpec(
        f"{wall.minute} {wall.hour} * * *", frozenset({wall.minute}), frozenset({wall.hour})
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One UTC minute of a walk, as the local wall clock shows it."""

    at: datetime
    wall: datetime
    """Naive local wall time (fold 0)."""
    skipped: tuple[datetime, ...]
    """Wall times a forward jump just before this minute skipped."""
    repeated: bool
    """This wall time occurs twice (a fold)."""
    second_pass: bool
    """... and this is its second occurrence."""


def walk(zone: ZoneInfo, start: datetime, end: datetime) -> list[Step]:
    """Every UTC minute from ``start`` (rounded down) to ``end``, read on ``zone``'s wall clock:
    computed once per window and matched against every expression."""
    steps: list[Step] = []
    minute = start.astimezone(UTC).replace(second=0, microsecond=0)
    previous = offset_at(zone, minute - MINUTE)
    while minute <= end:
        here = minute.astimezone(zone)
        offset = here.utcoffset()
        assert offset is not None
        wall = here.replace(tzinfo=None, fold=0)
        jump = offset - previous
        skipped = tuple(wall - jump + n * MINUTE for n in range(jump // MINUTE))
        repeated = here.replace(fold=1 - here.fold).utcoffset() != offset
        steps.append(Step(minute, wall, skipped, repeated, repeated and here.fold == 1))
        previous = offset
        minute += MINUTE
    return steps


def reference_fires(
    spec: CronSpec, steps: list[Step], start: datetime, end: datetime
) -> list[Fire]:
    """Fire times of ``spec`` in (start, end], brute force over the walk, with the DST policy."""
    fired: dict[datetime, str | None] = {}

    def fire(at: datetime, flag: str | None) -> None:
        if start < at <= end:
            fired[at] = "gap" if "gap" in (flag, fired.get(at)) else flag

    for step in steps:
        if any(spec.matches(wall) for wall in step.skipped):
            fire(step.at, "gap")
        if spec.matches(step.wall) and not (step.second_pass and not spec.every_hour):
            for second in sorted(spec.seconds):
                fire(step.at + timedelta(seconds=second), "overlap" if step.repeated else None)
    return sorted(fired.items())
