"""The JSON parameter of a batched statement: the ids, tokens and rows (str, int, float, None)
that one statement reads with ``jsonb_array_elements`` (PostgreSQL) or ``json_each`` (SQLite).

orjson writes these 8x faster than ``json.dumps`` (64 finished runs: 19 against 159 us), which
was a tenth of a worker's CPU in W1 (bench/README.md, "Where the time goes (Python)"). Users'
values (params, results) keep ``json``: orjson refuses integers past 64 bits and writes NaN as
null, and a value must come back as it went in.
"""

from __future__ import annotations

import orjson

__all__ = ["batch_json"]


def batch_json(value: object) -> str:
    return orjson.dumps(value).decode()
