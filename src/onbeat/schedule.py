"""When a job fires: ``now``, ``once`` at an instant, or a recurring ``cron`` expression.

Pure: no I/O, no clock. The engine passes instants in and gets aware UTC datetimes back.

Cron expressions, their daylight-saving policy and time zones are ``onbeat.cron``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from onbeat.cron import (
    MAX_CRON_LENGTH,
    DstFlag,
    FireTime,
    compile_cron,
    cron_fire_times,
    time_zone,
)
from onbeat.errors import ValidationError, shown

__all__ = [
    "MAX_CRON_LENGTH",
    "MAX_PREVIEW",
    "DstFlag",
    "FireTime",
    "Schedule",
    "ScheduleKind",
]

MAX_PREVIEW = 1000
"""Most fire times ``Schedule.fire_times`` returns."""
_MAX_AT_LENGTH = 64


class ScheduleKind(StrEnum):
    NOW = "now"
    ONCE = "once"
    CRON = "cron"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated schedule. Build it with :meth:`parse` (user input) or directly (stored rows);
    both validate, and raise :class:`onbeat.errors.ValidationError` naming the bad field."""

    kind: ScheduleKind
    expression: str | None = None
    """Cron only: the expression as the user gave it, stripped."""
    at: datetime | None = None
    """Once only: an aware datetime, normalised to UTC."""
    timezone: str = "UTC"
    """IANA time zone name; cron expressions are evaluated in it."""

    def __post_init__(self) -> None:
        try:
            kind = ScheduleKind(self.kind)
        except ValueError:
            raise ValidationError(
                "schedule", f"unknown schedule kind {shown(self.kind)}: use now, once or cron"
            ) from None
        object.__setattr__(self, "kind", kind)
        time_zone(self.timezone)
        if kind is ScheduleKind.CRON:
            if self.at is not None:
                raise ValidationError("schedule", "a cron schedule takes no 'at' time")
            if self.expression is None:
                raise ValidationError("cron", "a cron schedule needs an expression")
            if not isinstance(self.expression, str):
                raise ValidationError(
                    "cron", f"expression must be a string, got {type(self.expression).__name__}"
                )
            expression = self.expression.strip()
            compile_cron(expression, self.timezone)
            object.__setattr__(self, "expression", expression)
            return
        if self.expression is not None:
            raise ValidationError("schedule", f"a {kind} schedule takes no cron expression")
        if kind is ScheduleKind.ONCE:
            if self.at is None:
                raise ValidationError("at", "a once schedule needs an 'at' time")
            object.__setattr__(self, "at", _coerce_at(self.at))
        elif self.at is not None:
            raise ValidationError("schedule", "a now schedule takes no 'at' time")

    @classmethod
    def parse(
        cls,
        *,
        cron: str | None = None,
        at: datetime | str | None = None,
        timezone: str = "UTC",
    ) -> Schedule:
        """Validate user input. Neither ``cron`` nor ``at`` gives NOW; ``at`` gives ONCE (an
        ISO-8601 string or datetime *with* a UTC offset); ``cron`` gives CRON; both is an error."""
        if cron is not None and at is not None:
            raise ValidationError(
                "schedule", "give either a cron expression or an 'at' time, not both"
            )
        if cron is not None:
            if not isinstance(cron, str):
                raise ValidationError(
                    "cron", f"expression must be a string, got {type(cron).__name__}"
                )
            return cls(ScheduleKind.CRON, expression=cron.strip(), timezone=timezone)
        if at is not None:
            return cls(ScheduleKind.ONCE, at=_coerce_at(at), timezone=timezone)
        return cls(ScheduleKind.NOW, timezone=timezone)

    def first_fire(self, now: datetime) -> datetime | None:
        """The first fire time of a new job: NOW gives ``now``; ONCE gives ``at`` even if it is in
        the past (the misfire policy decides); CRON gives the first fire strictly after ``now``."""
        _require_aware(now, "now")
        if self.kind is ScheduleKind.NOW:
            return now.astimezone(UTC)
        if self.kind is ScheduleKind.ONCE:
            return self.at
        return self.next_fire_after(now)

    def next_fire_after(self, after: datetime) -> datetime | None:
        """The next fire time strictly after ``after`` (aware), as an aware UTC datetime; ``None``
        for NOW and ONCE (they fire once) and for a cron expression past year 9999."""
        _require_aware(after, "after")
        if self.kind is not ScheduleKind.CRON:
            return None
        assert self.expression is not None
        found = cron_fire_times(self.expression, self.timezone, after.astimezone(UTC), 1)
        return found[0].at if found else None

    def fire_times(self, after: datetime, count: int) -> list[FireTime]:
        """Up to ``count`` (at most ``MAX_PREVIEW``) fire times strictly after ``after``, for
        previews. ONCE gives its ``at`` if it is after ``after``; NOW has no fixed time: []."""
        _require_aware(after, "after")
        count = min(count, MAX_PREVIEW)
        if count <= 0 or self.kind is ScheduleKind.NOW:
            return []
        if self.kind is ScheduleKind.ONCE:
            assert self.at is not None
            return [FireTime(self.at)] if self.at > after else []
        assert self.expression is not None
        return list(cron_fire_times(self.expression, self.timezone, after.astimezone(UTC), count))


# --------------------------------------------------------------------------------------------------
# Input validation


def _require_aware(value: datetime, name: str) -> None:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")


def _coerce_at(value: object) -> datetime:
    if isinstance(value, str):
        text = value.strip()
        if len(text) > _MAX_AT_LENGTH:
            raise ValidationError(
                "at", f"timestamp is {len(text)} characters long; at most {_MAX_AT_LENGTH} allowed"
            )
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValidationError(
                "at",
                f"{shown(text)} is not an ISO-8601 timestamp "
                "(expected e.g. '2026-03-29T02:30:00+02:00')",
            ) from None
    elif isinstance(value, datetime):
        parsed = value
    else:
        raise ValidationError(
            "at", f"must be an ISO-8601 string or an aware datetime, got {type(value).__name__}"
        )
    if parsed.utcoffset() is None:
        raise ValidationError(
            "at",
            f"{shown(str(parsed) if isinstance(value, datetime) else value)} has no UTC offset; "
            "add one (e.g. '+02:00' or 'Z') so the instant is unambiguous",
        )
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValidationError("at", f"{shown(str(parsed))} is out of range") from None
