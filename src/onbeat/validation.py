"""What a caller may submit, decided in one place for every surface.

The Python API (``App.schedule``, ``App.update_job``, ``@app.task``) and the REST API (whose
request models call these same functions, see ``onbeat.api.schemas``) refuse the same values with
the same :class:`ValidationError`: same field name (the REST body says ``schedule.expression``
where Python says ``cron``), same message. Types are checked as JSON has them, so a value refused
over HTTP is refused in Python too: an integer is an ``int`` (not a bool, not ``2.0``), seconds are
an ``int`` or ``float`` (not a bool, not a string, finite), text is a ``str`` of valid Unicode.

Jobs read back from a store pass :func:`check_job`, the same rules, so a row written behind
onbeat's back is reported as unreadable instead of breaking every listing that includes it.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from onbeat.errors import ValidationError, shown
from onbeat.model import Job, MisfirePolicy, OverlapPolicy, RetryPolicy
from onbeat.schedule import MAX_CRON_LENGTH, Schedule

MAX_ATTEMPTS = 1000
MAX_SECONDS = 366 * 24 * 3600
"""Upper bound of every duration (timeout, backoff, jitter, catch-up window): a year."""
MIN_PRIORITY, MAX_PRIORITY = -100, 100
MAX_PARAMS_BYTES = 64 * 1024
"""Largest params accepted, as UTF-8 JSON."""
MAX_PARAMS_DEPTH = 64
"""Deepest nesting of params accepted (the params object itself is level 1)."""
MAX_TASK_NAME = 200
MAX_TENANT = 128
MAX_IDEMPOTENCY_KEY = 255
MAX_AT = 64
"""Longest ``at`` timestamp, in characters."""
MAX_TIMEZONE = 64
"""Longest time zone name, in characters."""

E = TypeVar("E", bound=StrEnum)


def integer(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(field, f"must be an integer from {low} to {high}")
    return value


def seconds(field: str, value: object, *, positive: bool = False) -> float:
    """A duration: an int or float, finite, not negative (``positive``: above 0), at most a year."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value > 0 if positive else value >= 0)
        or not value <= MAX_SECONDS  # also refuses NaN
    ):
        bounds = f"above 0 and at most {MAX_SECONDS}" if positive else f"from 0 to {MAX_SECONDS}"
        raise ValidationError(field, f"must be a number of seconds {bounds}")
    return float(value)


# One check per argument of App.schedule / App.update_job, named after it.
def max_attempts(value: object) -> int:
    return integer("max_attempts", value, 1, MAX_ATTEMPTS)


def priority(value: object) -> int:
    return integer("priority", value, MIN_PRIORITY, MAX_PRIORITY)


def timeout(value: object) -> float | None:
    """Seconds a run may take; None: no limit."""
    return None if value is None else seconds("timeout", value, positive=True)


def backoff(value: object) -> float:
    return seconds("backoff", value)


def backoff_max(value: object) -> float:
    return seconds("backoff_max", value)


def catchup_window(value: object) -> float:
    return seconds("catchup_window", value)


def jitter(value: object) -> float:
    return seconds("jitter", value)


def overlap(value: object) -> OverlapPolicy:
    return choice(OverlapPolicy, value, "overlap")


def misfire(value: object) -> MisfirePolicy:
    return choice(MisfirePolicy, value, "misfire")


def retry(attempts: object, base: object, cap: object) -> RetryPolicy:
    """A retry policy; a cap below the base is raised to it."""
    count, base_seconds, cap_seconds = max_attempts(attempts), backoff(base), backoff_max(cap)
    return RetryPolicy(count, base_seconds, max(cap_seconds, base_seconds))


def text(field: str, value: object, max_length: int) -> str:
    """A string of 1 to ``max_length`` characters, all valid Unicode (no lone surrogates) and no
    NUL, which PostgreSQL text cannot hold: refused here, named, rather than failing in the store."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_length:
        raise ValidationError(field, f"must be a string of 1 to {max_length} characters")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL (\\x00)")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValidationError(field, _LONE_SURROGATE) from None
    return value


def storable(value: str) -> bool:
    """Whether ``value`` could be stored as text on every backend: no NUL, valid UTF-8. An id or
    name that is not names nothing: a lookup by it finds nothing rather than failing."""
    return "\x00" not in value and _encodes(value)


def _encodes(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def filters(**values: str | None) -> None:
    """List filters and cursors: a value no stored text can be is refused, naming the filter."""
    for field, value in values.items():
        if value is not None and not storable(value):
            raise ValidationError(field, "must not contain NUL (\\x00) or a lone surrogate")


def task_name(value: object) -> str:
    return text("task", value, MAX_TASK_NAME)


def tenant(value: object) -> str:
    return text("tenant", value, MAX_TENANT)


def idempotency_key(value: object) -> str | None:
    return None if value is None else text("Idempotency-Key", value, MAX_IDEMPOTENCY_KEY)


def cron_text(value: object) -> str:
    return text("cron", value, MAX_CRON_LENGTH)


def at_text(value: object) -> str:
    return text("at", value, MAX_AT)


def timezone_name(value: object) -> str:
    return text("timezone", value, MAX_TIMEZONE)


def schedule(
    cron: str | None = None, at: datetime | str | None = None, timezone: str = "UTC"
) -> Schedule:
    """A schedule from user input: a ``cron`` expression, an ``at`` time (ISO-8601 text or an
    aware datetime) or neither (now); ``Schedule.parse`` judges what the texts mean."""
    return Schedule.parse(
        cron=None if cron is None else cron_text(cron),
        at=at if at is None or isinstance(at, datetime) else at_text(at),
        timezone=timezone_name(timezone),
    )


def choice(kind: type[E], value: object, field: str) -> E:
    """A member of the enum ``kind``, by member or value."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(m.value for m in kind)
    raise ValidationError(field, f"{shown(value)} is not one of: {allowed}")


_PARAMS_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
"""``json.dumps(value, ensure_ascii=False, allow_nan=False)``'s encoder, made once: dumps makes
one per call when given options (a quarter of the check's cost, twice per created job)."""


class CheckedParams(dict[str, Any]):
    """Params that passed :func:`params`, and their JSON (``text``), which the store writes as
    it is: a job created over REST is checked by the request's schema and again by
    ``App.prepare``, and was encoded by each check and once more for its row (a bulk create of
    1,000 jobs: 3,000 encodings and 2,000 checks). What is stored is what was checked, even if
    the dict is changed after the check."""

    __slots__ = ("text",)

    def __init__(self, value: dict[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text


def params(value: object) -> dict[str, Any]:
    """A JSON object that survives a round trip exactly (string keys, JSON values only, no NaN or
    Infinity, no lone surrogates), nested at most 64 levels and at most 64 KiB, so every reader
    of the job (the REST API, a worker in another process) can decode it. None is ``{}``.
    Returns it as ``CheckedParams`` (checked already: returned as it is)."""
    if type(value) is CheckedParams:
        return value
    if value is None:
        return CheckedParams({}, "{}")
    if not isinstance(value, dict):
        raise ValidationError("params", "must be a JSON object")
    _check_json_value(value)
    try:
        text = _PARAMS_JSON.encode(value)
        size = len(text.encode())
    except UnicodeEncodeError:
        raise ValidationError("params", _LONE_SURROGATE) from None
    except ValueError as exc:  # an integer too long to print
        raise ValidationError("params", f"is not strict JSON ({exc})") from None
    if size > MAX_PARAMS_BYTES:
        raise ValidationError("params", f"is {size} bytes of JSON; the limit is {MAX_PARAMS_BYTES}")
    return CheckedParams(value, text)


def check_job(job: Job) -> None:
    """Raise ValidationError if a job read back from a store holds a value no submission could
    have (a row written behind onbeat's back), so it is reported instead of served."""
    task_name(job.task)
    tenant(job.tenant)
    params(job.params)
    retry(job.retry.max_attempts, job.retry.backoff_base, job.retry.backoff_cap)
    timeout(job.timeout)
    catchup_window(job.catchup_window)
    priority(job.priority)
    jitter(job.jitter)


_LONE_SURROGATE = "contains a lone surrogate (\\ud800-\\udfff), which is not text"


def _check_json_value(value: dict[str, Any]) -> None:
    """Depth, key and value types of params, without recursion (a deep value cannot overflow)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list) and level > MAX_PARAMS_DEPTH:
            raise ValidationError("params", f"is nested deeper than {MAX_PARAMS_DEPTH} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValidationError("params", f"has a key {shown(key)} that is not a string")
                stack.append((child, level + 1))
        elif isinstance(item, list):
            stack.extend((child, level + 1) for child in item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValidationError("params", "contains NaN or Infinity, which JSON does not allow")
        elif not isinstance(item, str | int | float | bool | None):
            raise ValidationError(
                "params", f"contains {shown(item)}, a {type(item).__name__}, not a JSON value"
            )
