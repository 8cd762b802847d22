"""Loads named SQL statements from ``.sql`` files shipped in onbeat's packages.

Each statement starts with ``-- name: <name>``; keeping SQL in .sql files keeps it reviewable.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import LiteralString, cast

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def load_named_sql(package: str, resource: str) -> dict[str, LiteralString]:
    """The statements of ``resource`` (a path inside ``package``), by name. Typed LiteralString:
    the text ships with onbeat, so it counts as literal SQL, never as data."""
    text = resources.files(package).joinpath(resource).read_text()
    parts = _NAME.split(text)
    return {
        name: cast(LiteralString, body.strip())
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def load_queries(backend: str) -> dict[str, str]:
    """The store's statements for ``backend``, from ``sql/<backend>/queries.sql``."""
    return dict(load_named_sql("onbeat.store", f"sql/{backend}/queries.sql"))


def migrations(backend: str) -> list[tuple[int, str]]:
    """(version, script) pairs from ``sql/<backend>/migrations/NNNN_name.sql``, in order."""
    folder = resources.files("onbeat.store").joinpath(f"sql/{backend}/migrations")
    found = []
    for entry in folder.iterdir():
        name = Path(entry.name)
        if name.suffix == ".sql":
            found.append((int(name.stem.split("_", 1)[0]), entry.read_text()))
    return sorted(found)
