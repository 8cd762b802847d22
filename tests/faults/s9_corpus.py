"""S9's table of invalid cron expressions and time zones: each must be refused at submission
with a clear error, quickly, whatever its size. Expressions that can never fire (February 30th,
November 31st) are refused too (RELIABILITY.md: "Time zones for the DST oracle")."""

from __future__ import annotations

CRON_CORPUS: list[object] = [
    "",
    "   ",
    "* * * *",  # four fields
    "* * * * * * *",  # seven
    "61 * * * *",
    "* 24 * * *",
    "* * 0 * *",
    "* * 32 * *",
    "* * * 13 *",
    "* * * 0 *",
    "* * * * 8",
    "60 * * * * *",  # seconds field out of range
    "-1 * * * *",
    "5-1 * * * *",  # reversed range
    "*/0 * * * *",
    "0/0 * * * *",
    "*/99999999999999999999 * * * *",
    "0-99999999999999999999 * * * *",
    "9" * 300 + " * * * *",
    "1," * 2000 + "1 * * * *",
    "* " * 200,
    "x" * 100_000,
    "1,2,,3 * * * *",
    "1-2-3 * * * *",
    "a-b * * * *",
    "JAN * * * *",  # a month name in the minute field
    "* * * FOO *",
    "* * * * MON-FOO",
    "0 0 L * *",
    "0 0 15W * *",
    "0 0 ? * *",
    "0 0 * * 1#2",
    "H * * * *",
    "@reboot",
    "@every 5m",
    "@fortnightly",
    "0 0 31 2 *",  # never fires
    "0 0 30 2 *",
    "0 0 30,31 2 *",
    "0 0 31 4,6,9,11 *",
    "0 0 31 11 *",
    "0\x000 * * * *",
    "\u0661 * * * *",  # an Arabic-Indic digit one
    "\u0660-\u0669 * * * *",
    "\ud800 * * * *",
    5,
    ["* * * * *"],
    {"minute": "*"},
]
"""Malformed, out of range, absurd, huge, non-standard, never firing, and not a string."""

TIMEZONE_CORPUS: list[object] = [
    "",
    " ",
    "Mars/Base",
    "x" * 65,
    "x" * 100_000,
    "../../etc/passwd",
    "/etc/localtime",
    "/usr/share/zoneinfo/UTC",
    "Europe/../Europe/Berlin",
    "Europe/",
    "Europe/Berlin\x00",
    "Etc/GMT+99",
    "UTC+5",
    "+05:30",
    "\ud800",
    5,
    ["UTC"],
]
"""Unknown, path-like, too long, offsets instead of zones, and not a string."""
