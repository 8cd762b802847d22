"""Put first on ``PYTHONPATH`` of the processes S7 runs under libfaketime with
``FAKETIME_DONT_FAKE_MONOTONIC=1``: libfaketime 0.9.10 (Debian 12's) turns Python >= 3.11's
``time.sleep`` (``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``) into EINVAL
(wolfcw/libfaketime#426). Where ``time.sleep`` fails so, it is replaced by a sleep on
``select`` (the same real, monotonic seconds); with a fixed libfaketime nothing is replaced.
The clocks themselves are libfaketime's: the wall clock skewed, the monotonic one real.

With ``ONBEAT_TEST_CLOCK_PROBE`` set, a thread writes the process's two clocks down every
0.2 s (``_probe_clock``)."""

from __future__ import annotations

import json
import os
import select
import sys
import threading
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


def _probe_clock(prefix: str) -> None:
    """Every ``PROBE_INTERVAL`` s, a line of this process's wall and monotonic clocks to
    ``<prefix>-<pid>.jsonl``: S7's proof that the skew reached the process whatever work it got."""
    path = f"{prefix}-{os.getpid()}.jsonl"
    while True:
        line = json.dumps(
            {"pid": os.getpid(), "wall_ns": time.time_ns(), "mono_ns": time.monotonic_ns()}
        )
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        time.sleep(PROBE_INTERVAL)


PROBE_INTERVAL = 0.2
if probe := os.environ.get("ONBEAT_TEST_CLOCK_PROBE"):
    threading.Thread(target=_probe_clock, args=(probe,), name="clock-probe", daemon=True).start()
