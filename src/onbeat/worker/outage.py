"""How a worker's loops ride out a store or queue outage: retry with backoff, and log the
outage once (with its traceback), then one line per retry, then its end."""

from __future__ import annotations

import logging

MAX_BACKOFF = 5.0
"""Longest wait between two tries while a call keeps failing (as the scheduler's passes)."""
FIRST_BACKOFF = 0.1


class FailureStreak:
    """The consecutive failures of one recurring call (``what``: "claiming", "recording
    outcomes"). ``failed`` logs and says how long to wait before the next try: 0.1 s, doubling up
    to ``MAX_BACKOFF``; ``succeeded`` ends the streak (logged if there was one)."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.count = 0
        self._log = log

    def failed(self, consequence: str) -> float:
        self.count += 1
        if self.count == 1:
            self._log.exception("%s failed; %s", self.what, consequence)
        else:
            self._log.warning("%s failed %d times in a row; %s", self.what, self.count, consequence)
        return self.backoff

    @property
    def backoff(self) -> float:
        """Seconds to wait before the next try (0 outside a streak)."""
        if not self.count:
            return 0.0
        return min(FIRST_BACKOFF * 2.0 ** (self.count - 1), MAX_BACKOFF)

    def succeeded(self) -> None:
        if self.count:
            self._log.warning("%s works again after %d failures", self.what, self.count)
        self.count = 0
