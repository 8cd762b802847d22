"""Backoff between attempts: capped exponential with full jitter (AWS architecture blog's "full jitter").

Full jitter spreads the retries of a burst of failures evenly instead of in synchronized waves.
"""

from __future__ import annotations

import random

from onbeat.model import RetryPolicy


def backoff_delay(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based): uniform in [0, min(cap, base * 2**(attempt-1))]."""
    ceiling = min(policy.backoff_cap, policy.backoff_base * 2 ** min(max(attempt - 1, 0), 62))
    return (rng or random).uniform(0.0, ceiling)
