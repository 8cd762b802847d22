"""How fast this box runs Python today, so figures taken on different days can be compared.

The 2-core VMs this project is measured on are not all alike: on 2026-12-02 the same commit's W1
used 1,016-1,037 us of fleet CPU per run where it had used 494 us on 2026-11-30, and a short
pure-Python loop took 2-3x as long as on a common desktop. Every benchmark and every fault
scenario records ``python_loop_us`` beside its figures."""

from __future__ import annotations

import timeit

LOOP = "sum(range(1000))"


def python_loop_us() -> float:
    """Microseconds per ``sum(range(1000))``, the best of 5 rounds of 2,000 (about 0.1 s)."""
    rounds = timeit.repeat(LOOP, repeat=5, number=2000)
    return round(min(rounds) / 2000 * 1e6, 2)
