"""Cron expressions: strict parsing with precise errors, fire times in an IANA time zone.

Pure: no I/O, no clock.

Cron expressions
----------------
Five fields ``minute hour day-of-month month day-of-week``, or six with a *leading* seconds
field ``second minute hour day-of-month month day-of-week``. Each field is a list (``,``) of
items; an item is ``*``, a value, or a range ``a-b``, optionally followed by a step ``/n``
(``a/n`` means ``a-max/n``). Month and day-of-week take names (``JAN``..``DEC``,
``SUN``..``SAT``, any case); day-of-week 0 and 7 are both Sunday. Macros: ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``, ``@hourly``. As in Vixie
cron, when both day-of-month and day-of-week are restricted (neither starts with ``*``) a day
matches if *either* does; otherwise both must. The non-standard ``L``, ``W``, ``#``, ``?`` and
``H`` forms are refused, and so are expressions that can never fire (``0 0 30 2 *``).

Calendar matching is done by `cronsim <https://github.com/cuu508/cronsim>`_ on the *local
wall clock* (naive datetimes: the library never sees a time zone); this module maps wall-clock
matches to instants with one explicit daylight-saving policy:

* **Gap** (spring forward): a matched local time that does not exist fires once, at the first
  instant after the gap (Europe/Berlin 2026-03-29 ``30 2 * * *`` fires at 03:00 CEST = 01:00Z).
  Several nonexistent times of one gap, and a real time at that same instant, are one fire.
* **Overlap** (fall back): a matched local time that occurs twice fires once, at its first
  occurrence -- unless the hour field covers all 24 hours (``0 * * * *``, ``*/5 * * * *``,
  ``* * * * *``, ``0 0-23 * * *``): such an expression is about elapsed time, so it fires at
  every matching instant, in both passes of the repeated hour (America/New_York 2026-11-01
  ``0 * * * *`` fires at 05:00Z and at 06:00Z).

Fire times are strictly increasing aware UTC datetimes. ``Schedule.first_fire`` and
``Schedule.next_fire_after`` are on the scheduler's hot path: the parsed expression is cached
per (expression, time zone).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from onbeat.errors import ValidationError, shown

MAX_CRON_LENGTH = 256
"""Longest cron expression accepted, in characters."""
_MAX_TIMEZONE_LENGTH = 64

DstFlag = Literal["gap", "overlap"] | None


@dataclass(frozen=True, slots=True)
class FireTime:
    """One fire time of a schedule.

    ``dst`` is ``"gap"`` when a local time the expression names did not exist (spring forward) and
    this fire, at the first instant after the gap, stands for it; ``"overlap"`` when the local time
    occurred twice (fall back) and this is its one fire, at the first occurrence (or, for an
    expression whose hour field covers every hour, a fire inside the repeated hour); ``None``
    otherwise.
    """

    at: datetime
    dst: DstFlag = None


# --------------------------------------------------------------------------------------------------
# Time zones

_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
# Files in the zoneinfo database that are not zones (or not IANA names for them).
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


def time_zone(name: object) -> ZoneInfo:
    """The ZoneInfo for an IANA name; ValidationError("timezone", ...) otherwise."""
    if not isinstance(name, str):
        raise ValidationError(
            "timezone", f"must be an IANA name like 'Europe/Berlin', got {type(name).__name__}"
        )
    return _load_zone(name)


@functools.lru_cache(maxsize=1024)
def _load_zone(name: str) -> ZoneInfo:
    if not name:
        raise ValidationError("timezone", "is empty; give an IANA name like 'Europe/Berlin'")
    if len(name) > _MAX_TIMEZONE_LENGTH:
        raise ValidationError(
            "timezone",
            f"name is {len(name)} characters long; at most {_MAX_TIMEZONE_LENGTH} allowed",
        )
    if (
        not _ZONE_NAME.fullmatch(name)
        or name in _NOT_ZONES
        or name.startswith(("posix/", "right/"))
    ):
        raise ValidationError(
            "timezone", f"{shown(name)} is not an IANA time zone name like 'Europe/Berlin'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError(
            "timezone",
            f"unknown time zone {shown(name)} (expected an IANA name like 'Europe/Berlin')",
        ) from None


# --------------------------------------------------------------------------------------------------
# Cron expressions: strict syntax check (for precise messages), then cronsim


class _Field(NamedTuple):
    name: str
    low: int
    high: int
    names: Mapping[str, int]


_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DOM = _Field("day-of-month", 1, 31, {})
_MONTH = _Field("month", 1, 12, {n: i for i, n in enumerate(_MONTH_NAMES, start=1)})
_DOW = _Field("day-of-week", 0, 7, {n: i for i, n in enumerate(_DAY_NAMES)})
_FIVE = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)
_SIX = (_SECOND, *_FIVE)

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: leap years
_MONTH_FULL_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
# Where the existence check starts: any expression that passes the checks fires within 50 years.
_PROBE = datetime(2000, 1, 1)


class _BadField(Exception):
    pass


def _value(field: _Field, text: str) -> int:
    if text.isascii() and text.isdigit():
        if len(text) > 12:
            echoed = text[:12] + "..."
        elif not field.low <= (value := int(text)) <= field.high:
            echoed = str(value)
        else:
            return value
        raise _BadField(f"{field.name} value {echoed} out of range {field.low}-{field.high}")
    if text.upper() in field.names:
        return field.names[text.upper()]
    if not text:
        raise _BadField(f"{field.name} has an empty value")
    if field.names:
        first, last = next(iter(field.names)), list(field.names)[-1]
        expected = f"a number {field.low}-{field.high} or a name {first}..{last}"
    else:
        expected = f"a number {field.low}-{field.high}"
    hint = ""
    if any(ch in text.upper() for ch in "LW#?H"):
        hint = " (the non-standard L, W, #, ? and H forms are not supported)"
    raise _BadField(f"{field.name} value {shown(text, 30)} is not {expected}{hint}")


def _parse_field(field: _Field, text: str) -> tuple[frozenset[int], str]:
    """The values a field matches, and the field's text as cronsim should get it; _BadField with
    a precise message if it is malformed."""
    values: set[int] = set()
    items: list[str] = []
    for item in text.split(","):
        if not item:
            raise _BadField(f"{field.name} field {shown(text, 30)} has an empty list item")
        base, slash, step_text = item.partition("/")
        if base == "*":
            low, high = field.low, field.high
        elif "-" in base:
            start_text, _, end_text = base.partition("-")
            low, high = _value(field, start_text), _value(field, end_text)
            if low > high:
                raise _BadField(
                    f"{field.name} range {shown(base, 30)} is backwards: {low} comes after {high}"
                )
        else:
            low = _value(field, base)
            high = field.high if slash else low
        step = 1
        if slash:
            span = field.high - field.low + 1
            if not (step_text.isascii() and step_text.isdigit()):
                raise _BadField(f"{field.name} step {shown(step_text, 30)} is not a number")
            step = int(step_text) if len(step_text) <= 4 else 0
            if not 1 <= step <= span:
                echoed = step_text if len(step_text) <= 4 else step_text[:4] + "..."
                raise _BadField(f"{field.name} step {echoed} out of range 1-{span}")
        if slash and "-" in base and low == high:
            # cronsim 2.8 reads a one-value range with a step ("5-5/10") like "5/10" (5, 15,
            # 25...); it means just 5.
            item = str(low)
        items.append(item)
        values.update(range(low, high + 1, step))
    return frozenset(values), ",".join(items)


def _parse_cron(expression: str) -> tuple[str, list[frozenset[int]]]:
    """Check the syntax; return the text for cronsim and the value sets of the six fields
    (second minute hour day-of-month month day-of-week; day-of-week 7 folded into 0)."""
    if len(expression) > MAX_CRON_LENGTH:
        raise ValidationError(
            "cron",
            f"expression is {len(expression)} characters long; at most {MAX_CRON_LENGTH} allowed",
        )
    if not expression:
        raise ValidationError("cron", "expression is empty")

    def bad(detail: str) -> ValidationError:
        return ValidationError("cron", f"invalid expression {shown(expression)}: {detail}")

    text = expression
    if text.startswith("@"):
        macro = _MACROS.get(text.lower())
        if macro is None:
            raise bad(f"unknown macro; use one of {', '.join(_MACROS)}")
        text = macro
    parts = text.split()
    if len(parts) not in (5, 6):
        raise bad(
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading "
            f"seconds field, got {len(parts)}"
        )
    fields = _FIVE if len(parts) == 5 else _SIX
    try:
        parsed = [_parse_field(field, part) for field, part in zip(fields, parts, strict=True)]
    except _BadField as exc:
        raise bad(str(exc)) from None
    sets = [values for values, _ in parsed]
    if len(sets) == 5:
        sets.insert(0, frozenset({0}))
    sets[-1] = frozenset(day % 7 for day in sets[-1])
    dom_text, dow_text = parts[-3], parts[-1]
    days, months = sets[-3], sets[-2]
    if (dom_text.startswith("*") or dow_text.startswith("*")) and min(days) > max(
        _DAYS_IN_MONTH[m - 1] for m in months
    ):
        month_names = " or ".join(_MONTH_FULL_NAMES[m - 1] for m in sorted(months))
        raise bad(f"it can never fire: day-of-month {dom_text} never occurs in {month_names}")
    return " ".join(text for _, text in parsed), sets


@functools.lru_cache(maxsize=1024)
def compile_cron(expression: str, timezone: str) -> CompiledCron:
    """Validate and parse once; the engine then evaluates the cached result on its hot path."""
    zone = time_zone(timezone)
    text, sets = _parse_cron(expression)
    try:
        template = CronSim(text, _PROBE)
        next(restart(template, _PROBE))
    except CronSimError as exc:  # our checks are stricter; this is a safety net
        raise ValidationError("cron", f"invalid expression {shown(expression)}: {exc}") from None
    except StopIteration:
        raise ValidationError(
            "cron", f"invalid expression {shown(expression)}: it can never fire"
        ) from None
    theirs = [template.seconds, template.minutes, template.hours, template.days, template.months]
    weekdays = {day % 7 for day in template.weekdays if isinstance(day, int)}
    if [*theirs, weekdays] != sets:
        # A reading of the expression cronsim does not share: refuse rather than misfire.
        raise ValidationError(
            "cron", f"invalid expression {shown(expression)}: ambiguous field syntax"
        )
    every_hour = sets[2] == frozenset(range(24))
    fixed_offset = timezone in ("UTC", "Etc/UTC")
    return CompiledCron(template, None if fixed_offset else zone, every_hour)


@functools.lru_cache(maxsize=4096)
def cron_fire_times(
    expression: str, timezone: str, after: datetime, count: int
) -> tuple[FireTime, ...]:
    """:meth:`Schedule.fire_times` of a cron schedule (``count`` 1: ``next_fire_after``). Cached:
    every answer about a job lists its next fire times, jobs of one expression share them (a bulk
    create's jobs their first fire, a boundary's cron jobs their next), and a rare expression
    costs a day-by-day walk per fire (five fires of ``0 0 1 1 *`` took 0.5 ms, the most of a
    ``GET /jobs/{id}``)."""
    compiled = compile_cron(expression, timezone)
    cursor = after
    out: list[FireTime] = []
    while len(out) < count:
        found = compiled.next_after(cursor)
        if found is None:
            break
        cursor = found[0].replace(tzinfo=UTC)
        out.append(FireTime(cursor, found[1]))
    return tuple(out)


def restart(template: CronSim, start: datetime) -> CronSim:
    """A fresh iterator over the wall-clock times matching ``template`` strictly after ``start``
    (naive), without parsing the expression again. A CronSim's state is its attributes; only ``dt``
    and ``skip_initial_tick`` change while iterating (checked against cronsim 2.6-2.8, and by
    test_schedule.py against a freshly parsed CronSim)."""
    it: CronSim = CronSim.__new__(CronSim)
    it.__dict__.update(template.__dict__)
    it.dt = start.replace(microsecond=0)
    it.skip_initial_tick = False
    return it


# --------------------------------------------------------------------------------------------------
# Wall clock -> instants, with the DST policy

_SECOND_DELTA = timedelta(seconds=1)


class CompiledCron:
    """A parsed expression in a zone. Internally every instant is a *naive UTC* datetime."""

    __slots__ = ("_every_hour", "_template", "_zone")

    def __init__(self, template: CronSim, zone: ZoneInfo | None, every_hour: bool) -> None:
        self._template = template
        self._zone = zone  # None: UTC, wall clock == instant
        self._every_hour = every_hour

    def _matches_after(self, wall: datetime) -> CronSim:
        return restart(self._template, wall)

    def next_after(self, after: datetime) -> tuple[datetime, DstFlag] | None:
        """The next fire strictly after ``after`` (aware), as naive UTC, with its DST flag."""
        try:
            return self._next_after(after.astimezone(UTC).replace(tzinfo=None))
        except OverflowError:  # near datetime.max
            return None

    def _next_after(self, after: datetime) -> tuple[datetime, DstFlag] | None:
        zone = self._zone
        if zone is None:
            for wall in self._matches_after(after):
                return wall, None
            return None

        local = after.replace(tzinfo=UTC).astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        start = wall
        repeated: datetime | None = None
        before, later = self._offsets(wall)
        if before > later:
            # ``after`` is inside a repeated hour (fall back). Find that overlap's bounds.
            whole = wall.replace(microsecond=0)
            flip = self._transition(whole - before, whole - later)  # 2nd pass starts (UTC)
            if local.fold == 1:
                if not self._every_hour:
                    # Wall times left in this overlap already fired in the first pass.
                    start = flip + before - _SECOND_DELTA  # wall clock where the overlap ends
            elif self._every_hour:
                # In the first pass, wall times of the overlap up to ``wall`` still fire in the
                # second pass, later than ``after``: the earliest one that matches is a candidate.
                overlap_start = flip + later  # wall clock
                lower = max(wall - (before - later), overlap_start - _SECOND_DELTA)
                for match in self._matches_after(lower):
                    if match <= wall:
                        repeated = match - later
                    break

        found = self._scan(start, after)
        if repeated is not None and (found is None or repeated < found[0]):
            return repeated, "overlap"
        return found

    def _scan(self, start: datetime, after: datetime) -> tuple[datetime, DstFlag] | None:
        """The first fire after ``after`` among the wall times matching after ``start``.

        Instants grow with wall time, except that a repeated hour's second pass comes after the
        first pass's later wall times; the caller picks ``start`` (and handles that second pass
        when ``after`` is inside the first) so that the first candidate found is the earliest."""
        for wall in self._matches_after(start):
            before, later = self._offsets(wall)
            if before == later:
                first = wall - before
                if first > after:
                    return first, None
            elif before > later:  # occurs twice
                first = wall - before
                if first > after:
                    return first, "overlap"
                second = wall - later
                if self._every_hour and second > after:
                    return second, "overlap"
            else:  # does not exist: the first instant after the gap
                first = self._transition(wall - later, wall - before)
                if first > after:
                    return first, "gap"
        return None

    def _offsets(self, wall: datetime) -> tuple[timedelta, timedelta]:
        """UTC offsets of a wall time read as the earlier and as the later of two possible
        instants (``fold=0``/``fold=1``): equal if it exists once, ``before > later`` if it
        occurs twice, ``before < later`` if it falls in a gap."""
        zone = self._zone
        before = wall.replace(tzinfo=zone, fold=0).utcoffset()
        later = wall.replace(tzinfo=zone, fold=1).utcoffset()
        assert before is not None and later is not None
        return before, later

    def _offset_at(self, instant: datetime) -> timedelta | None:
        return instant.replace(tzinfo=UTC).astimezone(self._zone).utcoffset()

    def _transition(self, low: datetime, high: datetime) -> datetime:
        """The first whole-second instant in (low, high] whose UTC offset differs from low's
        (a bisection: one offset change lies between them)."""
        base = self._offset_at(low)
        lo, hi = 0, int((high - low).total_seconds())
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_at(low + timedelta(seconds=mid)) != base:
                hi = mid
            else:
                lo = mid
        return low + timedelta(seconds=hi)
