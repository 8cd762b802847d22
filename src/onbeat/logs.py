"""Structured logs: one JSON object a line when stderr is not a terminal (for collectors), readable
text when it is (for people).

A state-change line of a run carries the run's identity as fields, passed with ``extra=``:
``execution_id``, ``job_id``, ``attempt``, ``fencing_token`` (and ``task``) wherever they are known
(see ``run_fields``). API keys are never passed to a logger: the API logs no
request headers, and ``onbeat up`` logs no configuration values but the store and queue URLs.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from onbeat.model import Execution

FIELDS = ("execution_id", "job_id", "attempt", "fencing_token", "task")
"""The record attributes (set with ``extra=``) that become fields of a log line."""


def run_fields(execution: Execution, **more: Any) -> dict[str, Any]:
    """The fields every state-change log line of a run carries."""
    return {
        "execution_id": execution.id,
        "job_id": execution.job_id,
        "attempt": execution.attempt,
        "fencing_token": execution.fencing_token,
        **more,
    }


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in FIELDS if hasattr(record, name)}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the run's fields,
    and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message  key=value ...`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # fields before any traceback
        return f"{head}  {fields}{newline}{rest}"


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr), as JSON lines unless
    it is a terminal. Replaces the root logger's handlers, so calling it again reconfigures."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter() if out.isatty() else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
