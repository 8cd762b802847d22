"""Rendering: the Jinja2 environment (autoescaped), the filters pages format values with, and the
headers every dashboard response carries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.responses import HTMLResponse

SECURITY_HEADERS = {
    # Scripts and styles come from /static only: nothing inline, nothing from another origin.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def when(moment: datetime | None) -> str:
    """An instant as UTC wall time, to the second."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def local(moment: datetime, zone: str) -> str:
    """An instant as wall time in ``zone``, with its UTC offset."""
    return moment.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %z")


def duration(seconds: float | timedelta | None) -> str:
    """A duration for people: ``350 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h``, ``1 d 6 h``."""
    if seconds is None:
        return "-"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f}".removesuffix(".0") + " s"
    if seconds < 3600:
        return _two_units(seconds, 60, "min", 1, "s")
    if seconds < 86400:
        return _two_units(seconds, 3600, "h", 60, "min")
    return _two_units(seconds, 86400, "d", 3600, "h")


def _two_units(seconds: float, size: int, unit: str, part_size: int, part: str) -> str:
    whole, rest = int(seconds // size), int(seconds % size // part_size)
    return f"{whole} {unit}" + (f" {rest} {part}" if rest else "")


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 5 s`` / ``3 min 2 s ago``."""
    if moment is None:
        return ""
    delta = (moment - now).total_seconds()
    if abs(delta) < 1:
        return "just now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def short_id(value: str) -> str:
    """Ids share their leading timestamp digits with their neighbours: show both ends."""
    return value if len(value) <= 16 else f"{value[:8]}…{value[-6:]}"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def number(value: int) -> str:
    return f"{value:,}"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("onbeat.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=when,
        local=local,
        duration=duration,
        relative=relative,
        short_id=short_id,
        pretty_json=pretty_json,
        number=number,
    )
    return env


ENVIRONMENT = _environment()


def render(template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    html = ENVIRONMENT.get_template(template).render(**context)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
