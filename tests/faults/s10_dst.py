"""S10, the DST oracle (no infrastructure): onbeat's cron engine against a brute-force reference
(``dst_reference``) at every UTC-offset transition of a set of zones, 2020-2035 (2011-2035 for
Pacific/Apia, which skipped 2011-12-30), plus ordinary windows of every zone, and the DST policy
asserted directly from each transition:

* a nonexistent local time fires once, at the first valid instant after the gap;
* an ambiguous local time fires once, at its first occurrence;
* an hourly expression fires at both physical occurrences of a repeated wall time.

Exhaustive and deterministic: the seed is recorded, nothing is drawn from it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from onbeat.schedule import MAX_PREVIEW, Schedule
from tests.faults.checker import Report
from tests.faults.dst_reference import (
    ALL_HOURS,
    MINUTE,
    CronSpec,
    Fire,
    Transition,
    daily_at,
    reference_fires,
    transitions,
    walk,
)

YEARS = (2020, 2036)
"""[first, end) of the years swept."""
ZONES: dict[str, str] = {
    "Europe/Berlin": "north, 1 h at 02:00/03:00",
    "America/New_York": "north, 1 h at 02:00",
    "Europe/Dublin": "north, 'negative DST' in the tz database",
    "Australia/Sydney": "south, 1 h",
    "America/Santiago": "south, transitions at midnight",
    "Asia/Beirut": "transitions at midnight",
    "America/Havana": "transitions at midnight",
    "Australia/Lord_Howe": "south, a 30-minute shift",
    "Antarctica/Troll": "a 2-hour shift",
    "America/St_Johns": "-03:30, not a whole hour, with DST",
    "Pacific/Chatham": "+12:45/+13:45, not a whole hour, with DST, south",
    "Africa/Casablanca": "DST suspended each Ramadan",
    "Pacific/Apia": "skipped 2011-12-30 (24 h jump); DST until 2021",
    "Asia/Kolkata": "+05:30, no DST",
    "Asia/Kathmandu": "+05:45, no DST",
    "Asia/Tokyo": "no DST",
    "UTC": "no offset at all",
}
FIRST_YEAR = {"Pacific/Apia": 2011}
MARGIN = timedelta(minutes=90)
"""A transition's window reaches this far beyond the wall times it skips or repeats."""
ORDINARY_MONTHS = (1, 7)
"""A window at noon UTC on the 15th of one of these months (alternating) in every zone and year:
behaviour away from transitions, in winter and summer."""
_M = frozenset(range(60))
EXPRESSIONS = [
    CronSpec("* * * * *", _M),
    CronSpec("*/7 * * * *", frozenset(range(0, 60, 7))),
    CronSpec("0 * * * *", frozenset({0})),
    CronSpec("30 * * * *", frozenset({30})),
    CronSpec("15,45 * * * *", frozenset({15, 45})),
    CronSpec("0 */2 * * *", frozenset({0}), frozenset(range(0, 24, 2))),
    CronSpec("*/10 0-3 * * *", frozenset(range(0, 60, 10)), frozenset(range(4))),
    CronSpec("30 1 * * *", frozenset({30}), frozenset({1})),
    CronSpec("30 2 * * *", frozenset({30}), frozenset({2})),
    CronSpec("0 3 * * *", frozenset({0}), frozenset({3})),
    CronSpec("0 0 * * *", frozenset({0}), frozenset({0})),
    CronSpec("30 0 * * *", frozenset({30}), frozenset({0})),
    CronSpec("59 23 * * *", frozenset({59}), frozenset({23})),
    CronSpec("0 2 * * 0", frozenset({0}), frozenset({2}), weekdays=frozenset({0})),
    CronSpec(
        "0 1 1,15 * SUN",
        frozenset({0}),
        frozenset({1}),
        days=frozenset({1, 15}),
        weekdays=frozenset({0}),
        either_day=True,
    ),
    CronSpec("0,30 */15 * * * *", frozenset({0, 15, 30, 45}), seconds=frozenset({0, 30})),
]
"""Every minute, hourly-style, daily at 01:30/02:30/midnight, weekday and either-day forms, and
a seconds field; each transition adds daily and hourly expressions at the wall times it skips or
repeats."""


@dataclass
class Tally:
    transitions: int = 0
    gaps: int = 0
    folds: int = 0
    windows: int = 0
    comparisons: int = 0
    fires_compared: int = 0
    policy_checks: int = 0
    mismatches: list[str] = field(default_factory=list)
    policy_failures: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def onbeat_fires(text: str, zone: str, start: datetime, end: datetime) -> list[Fire]:
    """onbeat's fire times in (start, end] and their DST flags, by its preview API (the same
    ``next_after`` as the scheduler's ``next_fire_after``)."""
    schedule = Schedule.parse(cron=text, timezone=zone)
    out: list[Fire] = []
    cursor, page = start, 8  # pages grow: a daily expression needs few, a minutely one many
    while True:
        batch = schedule.fire_times(cursor, page)
        for fire in batch:
            if fire.at > end:
                return out
            out.append((fire.at, fire.dst))
        if len(batch) < page:
            return out
        cursor, page = batch[-1].at, min(2 * page, MAX_PREVIEW)


def compare(tally: Tally, zone: str, specs: list[CronSpec], start: datetime, end: datetime) -> None:
    """Every spec's fires in (start, end]: reference against onbeat, and ``next_fire_after``
    from the window's start against the first of them."""
    steps = walk(ZoneInfo(zone), start, end)
    tally.windows += 1
    for spec in specs:
        expected = reference_fires(spec, steps, start, end)
        got = onbeat_fires(spec.text, zone, start, end)
        tally.comparisons += 1
        tally.fires_compared += len(expected)
        first = Schedule.parse(cron=spec.text, timezone=zone).next_fire_after(start)
        if got != expected or (expected and first != expected[0][0]):
            extra = sorted(set(got) - set(expected))[:3]
            missing = sorted(set(expected) - set(got))[:3]
            tally.mismatches.append(
                f"{zone} {spec.text!r} ({start:%Y-%m-%d %H:%M}Z..{end:%H:%M}Z):"
                f" onbeat extra {extra}, missing {missing}, next_fire_after {first}"
            )


def affected_walls(zone: ZoneInfo, transition: Transition) -> list[datetime]:
    """The first, a middle and the last wall minute a transition skips (gap) or repeats (fold)."""
    span = abs(transition.shift) // MINUTE
    if transition.shift > timedelta(0):
        first = (transition.at - MINUTE).astimezone(zone).replace(tzinfo=None) + MINUTE
    else:
        first = transition.at.astimezone(zone).replace(tzinfo=None, fold=0)
    return sorted({first + n * MINUTE for n in (0, span // 2, span - 1)})


def fires_between(text: str, zone: str, low: datetime, high: datetime) -> list[Fire]:
    """onbeat's fires strictly between two instants."""
    return [f for f in onbeat_fires(text, zone, low, high) if f[0] < high]


def instant(wall: datetime, zone: ZoneInfo, fold: int = 0) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def check_policy(tally: Tally, name: str, transition: Transition) -> None:
    """The three policy assertions, from the transition alone (no reference involved)."""
    zone = ZoneInfo(name)
    for wall in affected_walls(zone, transition):
        daily = daily_at(wall).text
        # the same wall time a day before and after exists once: the fires between them
        # (a 24 h gap's first wall + 1 day is the gap's end: that fire is the merged one, kept)
        low = instant(wall - timedelta(days=1), zone)
        high = max(instant(wall + timedelta(days=1), zone), transition.at + MINUTE)
        got = fires_between(daily, name, low, high)
        if transition.shift > timedelta(0):
            want = [(transition.at, "gap")]
            what = "nonexistent local time fires once, first instant after the gap"
        else:
            want = [(instant(wall, zone, fold=0), "overlap")]
            what = "ambiguous local time fires once, at its first occurrence"
        tally.policy_checks += 1
        if got != want:
            tally.policy_failures.append(f"{name} {daily!r} at {wall}: {what}; got {got}")
        if transition.shift < timedelta(0):
            first, second = instant(wall, zone, fold=0), instant(wall, zone, fold=1)
            hourly = f"{wall.minute} * * * *"
            got = fires_between(hourly, name, first - MINUTE, second + MINUTE)
            tally.policy_checks += 1
            if (first, "overlap") not in got or (second, "overlap") not in got:
                tally.policy_failures.append(
                    f"{name} {hourly!r}: fires at both occurrences of {wall}; got {got}"
                )


def transition_specs(zone: ZoneInfo, transition: Transition) -> list[CronSpec]:
    """Daily and hourly expressions at the wall times the transition skips or repeats."""
    specs: list[CronSpec] = []
    for wall in affected_walls(zone, transition):
        specs.append(daily_at(wall))
        specs.append(CronSpec(f"{wall.minute} * * * *", frozenset({wall.minute}), ALL_HOURS))
    return specs


def check_zone(name: str) -> tuple[Tally, set[str], float]:
    """Every transition of one zone and its ordinary windows: the tally, the kinds of its
    transitions, and the CPU seconds it took (zones run in parallel, one per core)."""
    cpu = time.process_time()
    tally = Tally()
    zone = ZoneInfo(name)
    found = transitions(name, FIRST_YEAR.get(name, YEARS[0]), YEARS[1])
    for transition in found:
        tally.transitions += 1
        tally.gaps += transition.shift > timedelta(0)
        tally.folds += transition.shift < timedelta(0)
        reach = MARGIN + abs(transition.shift)
        specs = EXPRESSIONS + transition_specs(zone, transition)
        compare(tally, name, specs, transition.at - reach, transition.at + reach)
        check_policy(tally, name, transition)
    for year in range(*YEARS):
        month = ORDINARY_MONTHS[year % len(ORDINARY_MONTHS)]
        noon = datetime(year, month, 15, 12, tzinfo=UTC)
        if not any(abs(t.at - noon) < 2 * MARGIN for t in found):
            compare(tally, name, EXPRESSIONS, noon - MARGIN, noon + MARGIN)
    return tally, {_kind(t, zone) for t in found}, time.process_time() - cpu


def run(seed: int, artifacts: Path) -> Report:
    artifacts.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    tally, cpu = Tally(), 0.0
    kinds: dict[str, set[str]] = {}
    # Processes, not threads: the comparison is pure Python. Spawned, as the fleet's processes
    # are, so no state of the calling test is copied.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=spawn) as pool:
        for name, (zone_tally, zone_kinds, zone_cpu) in zip(
            ZONES, pool.map(check_zone, ZONES), strict=True
        ):
            tally.add(zone_tally)
            kinds[name] = zone_kinds
            cpu += zone_cpu
    seconds = time.monotonic() - began
    covered = set().union(*kinds.values())
    metrics: dict[str, object] = {
        "zones": len(ZONES),
        "zones_without_dst": sum(not k for k in kinds.values()),
        "transitions_checked": tally.transitions,
        "gaps": tally.gaps,
        "folds": tally.folds,
        "windows": tally.windows,
        "expressions_fixed": len(EXPRESSIONS),
        "comparisons": tally.comparisons,
        "fires_compared": tally.fires_compared,
        "mismatches": len(tally.mismatches),
        "policy_checks": tally.policy_checks,
        "policy_failures": len(tally.policy_failures),
        "zone_kinds_covered": ", ".join(sorted(covered)),
        "seconds": seconds,
        "cpu_seconds": cpu,
    }
    checks = {
        "zones": len(ZONES) >= 12,
        "zones_without_dst": metrics["zones_without_dst"] != 0,
        "zone_kinds_covered": covered >= REQUIRED_KINDS,
        "mismatches": not tally.mismatches,
        "policy_failures": not tally.policy_failures,
        "policy_checks": tally.policy_checks > 0,
    }
    report = Report("S10", seed, metrics, checks)
    report.config = {
        "what": "DST/cron oracle: onbeat's cron engine against a brute-force reference",
        "zones": ZONES,
        "years": [YEARS[0], YEARS[1] - 1],
        "details": {
            "mismatches": tally.mismatches[:20],
            "policy_failures": tally.policy_failures[:20],
        },
    }
    report.write(artifacts)
    return report


REQUIRED_KINDS = {"gap", "fold", "south", "not-1h", "midnight", "skipped-day"}
"""What RELIABILITY.md's zone list must include (the zones without DST are counted apart)."""


def _kind(transition: Transition, zone: ZoneInfo) -> str:
    """The most specific label of a transition, for the coverage check; 'south' for a southern
    fall-back in April, 'midnight' when the local clock crosses 00:00, 'not-1h' for a shift other
    than an hour, 'skipped-day' for a 24 h jump."""
    shift = abs(transition.shift)
    before = (transition.at - MINUTE).astimezone(zone)
    after = transition.at.astimezone(zone)
    if shift >= timedelta(hours=24):
        return "skipped-day"
    if shift != timedelta(hours=1):
        return "not-1h"
    if before.date() != after.date():
        return "midnight"
    if transition.shift < timedelta(0) and transition.at.month in (3, 4):
        return "south"
    return "gap" if transition.shift > timedelta(0) else "fold"
