"""The run audit: did every fire time a job's schedule produced get an execution record?

It replays the job's history (created, paused, resumed, rescheduled, cancelled) to know which fire
times were *expected* in a range — fire times while the job was active, under the schedule then in
force — and compares them with the execution records. A fire time without a record is listed as
missing; an empty ``missing`` list is onbeat's promise, with proof.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from onbeat.errors import ValidationError
from onbeat.model import ExecutionStatus, JobEvent, JobEventKind
from onbeat.schedule import ScheduleKind

MAX_AUDITED_FIRES = 100_000
"""Most fire times one audit walks; a wider range is refused (narrow it)."""

_JUST_BEFORE = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class AuditReport:
    since: datetime
    until: datetime
    expected: int
    missing: list[datetime]
    records: dict[str, int]
    """Records of fire times in the range, counted by execution status."""


def expected_fire_times(
    events: Sequence[JobEvent], since: datetime, until: datetime
) -> list[datetime]:
    """Fire times in [since, until] that the job's history says should have happened.

    A cron fire counts while the job was active (created or resumed, not paused or cancelled),
    under the schedule then in force, strictly after the event that began the interval — as the
    engine plans them. A one-shot's single fire counts whatever happens later: a pause holds it,
    a cancellation records it as cancelled.
    """
    fires: set[datetime] = set()
    active = False
    for i, event in enumerate(events):
        if event.kind in (JobEventKind.CREATED, JobEventKind.RESUMED):
            active = True
        elif event.kind in (JobEventKind.PAUSED, JobEventKind.CANCELLED):
            active = False
        schedule = event.schedule
        if schedule.kind is not ScheduleKind.CRON:
            if event.kind in (JobEventKind.CREATED, JobEventKind.RESCHEDULED):
                fire = schedule.first_fire(event.at)
                if fire is not None and since <= fire <= until:
                    fires.add(fire)
            continue
        if not active:
            continue
        end = min(events[i + 1].at if i + 1 < len(events) else until, until)
        start = event.at if since <= event.at else since - _JUST_BEFORE  # fires at `since` count
        fire = schedule.next_fire_after(start)
        while fire is not None and fire <= end:
            fires.add(fire)
            if len(fires) > MAX_AUDITED_FIRES:
                raise ValidationError(
                    "since", f"the range holds over {MAX_AUDITED_FIRES} fire times; narrow it"
                )
            fire = schedule.next_fire_after(fire)
    return sorted(fires)


def audit(
    events: Sequence[JobEvent],
    records: Sequence[tuple[datetime, ExecutionStatus]],
    since: datetime,
    until: datetime,
) -> AuditReport:
    expected = expected_fire_times(events, since, until)
    recorded = {fire for fire, _ in records}
    return AuditReport(
        since=since,
        until=until,
        expected=len(expected),
        missing=[fire for fire in expected if fire not in recorded],
        records=dict(Counter(status.value for _, status in records)),
    )
