"""Opaque keyset cursors: ``next_cursor`` of one page, ``cursor`` of the request for the next.

A cursor is the URL-safe base64 (unpadded) of ``<list>:<id of the last item shown>``. The list
name makes a cursor from one list useless in another; anything this API did not issue is a 400.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from onbeat.api.problems import FieldError, ProblemError

MAX_CURSOR_LENGTH = 200
_ID = re.compile(r"[0-9A-Za-z_-]{1,100}")


T = TypeVar("T")


def page_of(
    listing: str, fetched: Sequence[T], limit: int, id_of: Callable[[T], str]
) -> tuple[list[T], str | None]:
    """From ``limit + 1`` fetched items: the page, and the cursor of the next page (None when
    this is the last: the extra item shows whether there is more)."""
    page = list(fetched[:limit])
    more = len(fetched) > limit
    return page, encode_cursor(listing, id_of(page[-1])) if more else None


def encode_cursor(listing: str, last_id: str) -> str:
    return base64.urlsafe_b64encode(f"{listing}:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(listing: str, cursor: str | None) -> str | None:
    """The id a page continues from, or None for the first page (no cursor, or an empty one);
    ProblemError(400) if ``cursor`` was not issued by this API for ``listing``."""
    if not cursor:
        return None
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        prefix, sep, last_id = raw.decode("ascii").partition(":")
    except (binascii.Error, ValueError):
        prefix, sep, last_id = "", "", ""
    if prefix != listing or not sep or not _ID.fullmatch(last_id):
        raise invalid_cursor()
    return last_id


def invalid_cursor() -> ProblemError:
    message = "is not a cursor this list issued; pass the next_cursor of a previous page"
    return ProblemError(
        400, "invalid-cursor", f"cursor {message}", [FieldError(field="cursor", message=message)]
    )
