"""Backoff: capped exponential with full jitter."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from onbeat.model import RetryPolicy
from onbeat.retry import backoff_delay


@given(
    base=st.floats(min_value=0, max_value=3600),
    cap=st.floats(min_value=0, max_value=86_400),
    attempt=st.integers(min_value=1, max_value=10_000),
    seed=st.integers(),
)
def test_backoff_delay__within_zero_and_the_capped_exponential(
    base: float, cap: float, attempt: int, seed: int
) -> None:
    policy = RetryPolicy(max_attempts=attempt + 1, backoff_base=base, backoff_cap=cap)
    delay = backoff_delay(policy, attempt, random.Random(seed))
    assert 0 <= delay <= min(cap, base * 2 ** min(attempt - 1, 62))


def test_backoff_delay__full_jitter_spreads_retries_over_the_whole_interval() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=1.0, backoff_cap=300.0)
    rng = random.Random(7)
    delays = [backoff_delay(policy, 4, rng) for _ in range(2000)]  # ceiling 8 s
    assert max(delays) <= 8.0
    assert min(delays) < 0.5 and max(delays) > 7.5  # not clustered at the ceiling
    assert 3.5 < sum(delays) / len(delays) < 4.5  # uniform: mean half the ceiling


def test_backoff_delay__grows_until_the_cap() -> None:
    policy = RetryPolicy(max_attempts=20, backoff_base=2.0, backoff_cap=60.0)
    ceilings = [
        max(backoff_delay(policy, n, random.Random(s)) for s in range(300)) for n in (1, 3, 10)
    ]
    assert ceilings[0] <= 2.0 < ceilings[1] <= 8.0 < ceilings[2] <= 60.0
