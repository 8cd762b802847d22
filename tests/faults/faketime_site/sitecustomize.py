"""Put first on ``PYTHONPATH`` of the processes S7 runs under libfaketime with
``FAKETIME_DONT_FAKE_MONOTONIC=1``: libfaketime 0.9.10 (Debian 12's) turns Python >= 3.11's
``time.sleep`` (``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``) into EINVAL
(wolfcw/libfaketime#426). Where ``time.sleep`` fails so, it is replaced by a sleep on
``select`` (the same real, monotonic seconds); with a fixed libfaketime nothing is replaced.
The clocks themselves are libfaketime's: the wall clock skewed, the monotonic one real."""

from __future__ import annotations

import select
import sys
import time
from typing import SupportsIndex


def _sleep(secs: float | SupportsIndex) -> None:
    seconds = float(secs)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


try:
    time.sleep(1e-6)
except OSError:
    time.sleep = _sleep
    print("faketime_site: time.sleep replaced (libfaketime#426)", file=sys.stderr, flush=True)
