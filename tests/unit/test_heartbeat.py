"""The heartbeat's renewal schedule, over any history of grants and late looks: every lease is
renewed before ``interval`` has passed since its grant or last renewal (plus the lateness of the
look that renews it, as when every beat renewed every lease), and none is renewed while it is
fresh, so a burst confirmed at one instant is not renewed again moments later."""

from __future__ import annotations

from itertools import pairwise
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from onbeat.store.base import Store
from onbeat.testing import FakeClock
from onbeat.worker.heartbeat import LOOKS_PER_INTERVAL, Heartbeat, HeldLeases

INTERVAL = 10.0
LOOK_EVERY = INTERVAL / LOOKS_PER_INTERVAL


class RenewingStore:
    """``execution_heartbeat`` that renews every lease it is sent and records each call."""

    def __init__(self) -> None:
        self.sent: list[HeldLeases] = []

    def execution_heartbeat(self, owner: str, held: HeldLeases, lease_ttl: float) -> HeldLeases:
        self.sent.append(dict(held))
        return dict(held)


class Leases:
    """What a worker holds: id -> when its lease was granted or last renewed."""

    def __init__(self) -> None:
        self.renewed_at: dict[str, float] = {}
        self.renewals: dict[str, list[float]] = {}

    def grant(self, eid: str, at: float) -> None:
        self.renewed_at[eid] = at
        self.renewals[eid] = [at]

    def due(self, renewed_before: float) -> HeldLeases:
        return {eid: 1 for eid, at in self.renewed_at.items() if at <= renewed_before}

    def renewed(self, kept: HeldLeases, at: float) -> None:
        for eid in kept:
            self.renewed_at[eid] = at
            self.renewals[eid].append(at)


def _heartbeat(clock: FakeClock, store: RenewingStore, leases: Leases) -> Heartbeat:
    return Heartbeat(
        cast(Store, store),
        "w",
        60.0,
        INTERVAL,
        clock,
        leases.due,
        lambda lost: None,
        leases.renewed,
    )


# A history: before each look, some leases are granted; the look comes late by 0-2 s.
HISTORY = st.lists(
    st.tuples(st.integers(0, 3), st.floats(0, 2, allow_nan=False)), min_size=1, max_size=60
)


@settings(max_examples=200, deadline=None)
@given(history=HISTORY)
def test_heartbeat__renews_each_lease_before_an_interval_passes_and_never_while_fresh(
    history: list[tuple[int, float]],
) -> None:
    clock, store, leases = FakeClock(), RenewingStore(), Leases()
    heartbeat = _heartbeat(clock, store, leases)
    longest_gap = 0.0
    for step, (grants, late) in enumerate(history):
        looked = clock.monotonic()
        for k in range(grants):  # granted somewhere between the last look and this one
            leases.grant(f"{step}-{k}", clock.monotonic())
            clock.advance(LOOK_EVERY / 8)
        clock.advance(LOOK_EVERY + late)
        gap = clock.monotonic() - looked  # LOOK_EVERY, or more when the look came late
        longest_gap = max(longest_gap, gap)
        now = clock.monotonic()
        before = dict(leases.renewed_at)
        calls = len(store.sent)
        assert heartbeat.beat() == {}
        sent = store.sent[-1] if len(store.sent) > calls else {}
        for eid, at in before.items():
            age = now - at
            if eid in sent:  # renewed only once the next look would be too late
                assert age >= INTERVAL - LOOK_EVERY
                # at the previous look it was not due: an interval less one look, plus this gap
                assert age < INTERVAL - LOOK_EVERY + gap + 1e-9
            else:
                assert age < INTERVAL - LOOK_EVERY
    for times in leases.renewals.values():
        for earlier, later in pairwise(times):
            assert later - earlier < INTERVAL - LOOK_EVERY + longest_gap + 1e-9


def test_heartbeat__looks_on_time_renew_a_lease_every_seven_eighths_of_the_interval() -> None:
    """The steady-state cost: one lease, looks on time, renewed every 7 looks."""
    clock, store, leases = FakeClock(), RenewingStore(), Leases()
    heartbeat = _heartbeat(clock, store, leases)
    leases.grant("a", clock.monotonic())
    for _ in range(LOOKS_PER_INTERVAL * 7):
        clock.advance(LOOK_EVERY)
        heartbeat.beat()
    gaps = [b - a for a, b in pairwise(leases.renewals["a"])]
    assert len(gaps) == LOOKS_PER_INTERVAL and all(
        abs(gap - (INTERVAL - LOOK_EVERY)) < 1e-9 for gap in gaps
    )
