"""The job form (create and edit): reading it, and turning it into ``App`` arguments. Values are
checked by the App, exactly as for the REST API; this only translates what a browser sends."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl
from zoneinfo import ZoneInfo

from starlette.requests import Request

from onbeat.dashboard.render import pretty_json
from onbeat.errors import ValidationError
from onbeat.model import Job
from onbeat.schedule import Schedule

KINDS = ("now", "once", "cron")


@dataclass(frozen=True, slots=True)
class ScheduleArgs:
    cron: str | None = None
    at: str | None = None
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class JobForm:
    """What the create or edit form holds (shown again, with the error, when it is refused)."""

    task: str = ""
    params: str = "{}"
    kind: str = "now"
    expression: str = ""
    at: str = ""
    timezone: str = "UTC"
    error: str | None = None

    @classmethod
    def of(cls, form: dict[str, str]) -> JobForm:
        return cls(
            task=form.get("task", "").strip(),
            params=form.get("params", "").strip() or "{}",
            kind=form.get("kind", "now") if form.get("kind") in KINDS else "now",
            expression=form.get("expression", "").strip(),
            at=form.get("at", "").strip(),
            timezone=form.get("timezone", "").strip() or "UTC",
        )

    @classmethod
    def of_job(cls, job: Job) -> JobForm:
        schedule = job.schedule
        return cls(
            task=job.task,
            params=pretty_json(job.params),
            kind=schedule.kind.value,
            expression=schedule.expression or "",
            at=schedule.at.isoformat() if schedule.at else "",
            timezone=schedule.timezone,
        )

    def params_value(self) -> dict[str, Any]:
        """The params as a JSON object; ValidationError naming ``params`` if they are not one."""
        try:
            value = json.loads(self.params)
        except ValueError as exc:
            raise ValidationError("params", f"is not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ValidationError("params", 'must be a JSON object, e.g. {} or {"to": "me"}')
        return value

    def schedule_args(self) -> ScheduleArgs:
        """``cron``, ``at`` and ``timezone`` for ``App.schedule`` / ``App.update_job``."""
        if self.kind == "cron":
            return ScheduleArgs(cron=self.expression, timezone=self.timezone)
        if self.kind == "once":
            return ScheduleArgs(at=at_in_zone(self.at, self.timezone), timezone=self.timezone)
        return ScheduleArgs(timezone=self.timezone)

    def schedule(self) -> Schedule:
        args = self.schedule_args()
        return Schedule.parse(cron=args.cron, at=args.at, timezone=args.timezone)

    def with_error(self, error: ValidationError) -> JobForm:
        return dataclasses.replace(self, error=f"{error.field}: {error.message}")


def at_in_zone(text: str, timezone: str) -> str:
    """An ``at`` time as ISO-8601 with an offset: one typed without an offset is read as wall
    time in ``timezone`` (the earlier instant, if that time occurs twice)."""
    text = text.strip()
    if not text:
        raise ValidationError("at", "is required for a once schedule")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError("at", "is not a date and time (YYYY-MM-DDTHH:MM)") from None
    if moment.tzinfo is None:
        Schedule.parse(timezone=timezone)  # the schedule's own check of the zone's name
        moment = moment.replace(tzinfo=ZoneInfo(timezone))
    return moment.isoformat()


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the only kind the dashboard's forms send)
    as a dict; a field sent twice keeps its last value."""
    body = (await request.body()).decode("utf-8", errors="replace")
    try:
        return dict(parse_qsl(body, keep_blank_values=True, max_num_fields=64))
    except ValueError:  # too many fields: no form of ours; its CSRF check fails
        return {}
