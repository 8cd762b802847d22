"""Loads a backend's named SQL statements from ``sql/<backend>/queries.sql``.

Each statement starts with ``-- name: <name>``; keeping SQL in .sql files keeps it reviewable.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_queries(backend: str) -> dict[str, str]:
    text = resources.files("onbeat.store").joinpath(f"sql/{backend}/queries.sql").read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def migrations(backend: str) -> list[tuple[int, str]]:
    """(version, script) pairs from ``sql/<backend>/migrations/NNNN_name.sql``, in order."""
    folder = resources.files("onbeat.store").joinpath(f"sql/{backend}/migrations")
    found = []
    for entry in folder.iterdir():
        name = Path(entry.name)
        if name.suffix == ".sql":
            found.append((int(name.stem.split("_", 1)[0]), entry.read_text()))
    return sorted(found)
