"""What is kept of a task's return value: bounded, so one task cannot bloat every read of its
executions."""

from __future__ import annotations

import json
from typing import Any

from onbeat.validation import MAX_PARAMS_BYTES

__all__ = ["MAX_RESULT_BYTES", "RESULT_PREVIEW_CHARS", "stored_result"]

MAX_RESULT_BYTES = MAX_PARAMS_BYTES
"""A return value whose JSON is larger is stored as a truncated preview (see ``stored_result``)."""
RESULT_PREVIEW_CHARS = 1024


def stored_result(value: Any) -> Any:
    """A task's return value as stored: itself if JSON can hold it, else its repr; and if that
    is larger than ``MAX_RESULT_BYTES`` of JSON, ``{"truncated": true, "bytes": <its JSON size>,
    "preview": <its first RESULT_PREVIEW_CHARS characters>}`` instead, so one task cannot bloat
    every read of its executions."""
    if value is None:  # most tasks return nothing
        return None
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        value = repr(value)
        text = json.dumps(value)
    if len(text) <= MAX_RESULT_BYTES:  # json.dumps escapes to ASCII: characters are bytes
        return value
    preview = value if isinstance(value, str) else text
    return {"truncated": True, "bytes": len(text), "preview": preview[:RESULT_PREVIEW_CHARS]}
