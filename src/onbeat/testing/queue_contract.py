"""The ``DelayQueue`` contract suite: every backend must pass it unchanged.

Use it by subclassing in a test module that provides two fixtures: ``clock`` (a ``FakeClock``)
and ``delay_queue`` (a fresh, empty queue driven by that clock, closed afterwards)::

    @pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.external_service)])
    async def delay_queue(request, clock): ...

    class TestDelayQueue(DelayQueueContract):
        pass

The class name does not start with ``Test`` so pytest collects it only through such a subclass.
Time only moves by ``clock.advance()``; the real-time timeouts below are safety nets against a
hang, never part of what is asserted.

What the suite pins down where ``base.DelayQueue`` is silent: an item is due when
``due_at <= clock.now()`` (inclusive); ``due_at`` must be timezone-aware, otherwise the batch is
refused with ``ValueError`` and nothing is stored; ``claim_due(0)`` returns ``[]`` and a negative
limit raises ``ValueError``; ``claim_due(n, ahead=a)`` takes what is due by ``clock.now() + a``
(inclusive too, in the same order) and ``wait(t, ahead=a)`` returns ``a`` seconds before the
earliest due time, while a negative or NaN ``ahead`` raises ``ValidationError`` naming ``ahead``
and takes nothing; re-enqueue is last-write-wins (the newest due_at and priority, even
if later or lower); ``close()`` is idempotent and releases waiters. Order among items with equal
priority and ``due_at`` is left to the backend. Items carry a ``shard``: ``claim_due``,
``missing`` and ``remove`` span every shard and priority is honoured across shards, but due-time
order is only required within a shard (a backend may spread a claim over the shards of a tier).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onbeat.errors import ValidationError
from onbeat.queue.base import DelayQueue, QueueItem
from onbeat.testing.clock import FakeClock

__all__ = ["DelayQueueContract"]

SAFETY_TIMEOUT = 30.0
"""Real seconds before a test that should already have finished is declared hung. The tests
never advance the clock to finish, so a longer bound weakens nothing; 10 s failed once in CI
(test_wait__many_waiters_all_wake[sqlite]: five waiters and one enqueue through SQLite's
worker threads), where 65 local runs under CPU and fsync load each took under 1 s."""


async def _settle(rounds: int = 20) -> None:
    """Let every ready task run (no real time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def _asleep(clock: FakeClock) -> None:
    """Until a waiter sleeps on the clock: it has read the queue and registered its deadline.
    ``_settle()`` alone can leave a backend that reads in a thread or over the network still
    reading, so a clock advanced next lands before the sleep is registered and is never seen
    (a CI hang on SQLite)."""
    await asyncio.wait_for(clock.until_sleeping(), SAFETY_TIMEOUT)


def _at(clock: FakeClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


async def _claim_all(queue: DelayQueue, batch: int = 1000) -> list[str]:
    claimed: list[str] = []
    while chunk := await queue.claim_due(batch):
        claimed.extend(chunk)
    return claimed


def _assert_released_in_order(claimed: Sequence[str], by_id: dict[str, QueueItem]) -> None:
    keys = [(-by_id[eid].priority, by_id[eid].due_at) for eid in claimed]
    assert keys == sorted(keys), "due items must come out highest priority first, then by due_at"


# -- operations for the model-based property test ----------------------------------------------

_ID_POOL = 6


@dataclass(frozen=True)
class _Enqueue:
    items: tuple[tuple[int, int, int], ...]  # (id index, due offset in s from now, priority)


@dataclass(frozen=True)
class _Claim:
    limit: int
    ahead: float = 0.0


@dataclass(frozen=True)
class _Remove:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class _Advance:
    seconds: float


_Op = _Enqueue | _Claim | _Remove | _Advance

_ops = st.lists(
    st.one_of(
        st.builds(
            _Enqueue,
            st.lists(
                st.tuples(st.integers(0, _ID_POOL - 1), st.integers(-3, 6), st.integers(0, 2)),
                min_size=1,
                max_size=4,
            ).map(tuple),
        ),
        st.builds(_Claim, st.integers(0, 4), st.sampled_from([0.0, 0.0, 1.0, 2.5])),
        st.builds(_Remove, st.lists(st.integers(0, _ID_POOL - 1), max_size=3).map(tuple)),
        st.builds(_Advance, st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0])),
    ),
    max_size=40,
)


class DelayQueueContract:
    """Behaviour every ``DelayQueue`` backend owes its callers; see the module docstring."""

    # -- release at the due time ---------------------------------------------------------------

    async def test_claim_due__not_released_before_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 10))])
        assert await delay_queue.claim_due(10) == []
        clock.advance(9.999)
        assert await delay_queue.claim_due(10) == []
        assert await delay_queue.size() == 1

    async def test_claim_due__released_at_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        due = _at(clock, 10)
        await delay_queue.enqueue([QueueItem("e1", due), QueueItem("e2", _at(clock, 20))])
        clock.set(due)  # exactly the due time: due_at <= now is due
        assert await delay_queue.claim_due(10) == ["e1"]
        clock.advance(30)
        assert await delay_queue.claim_due(10) == ["e2"]
        assert await delay_queue.size() == 0

    async def test_claim_due__past_due_released_at_once(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("late", _at(clock, -3600))])
        assert await delay_queue.claim_due(10) == ["late"]

    async def test_claim_due__priority_order_among_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("low", _at(clock, -30), priority=0),
                QueueItem("high", _at(clock, -1), priority=10),
                QueueItem("mid", _at(clock, -20), priority=5),
                QueueItem("negative", _at(clock, -40), priority=-5),
            ]
        )
        assert await delay_queue.claim_due(10) == ["high", "mid", "low", "negative"]

    async def test_claim_due__high_priority_not_due_does_not_block(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("future-high", _at(clock, 60), priority=100),
                QueueItem("due-low", _at(clock, -1), priority=0),
            ]
        )
        assert await delay_queue.claim_due(10) == ["due-low"]
        clock.advance(60)
        assert await delay_queue.claim_due(10) == ["future-high"]

    async def test_claim_due__earliest_due_first_within_tier(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("b", _at(clock, 2), priority=1),
                QueueItem("c", _at(clock, 3), priority=1),
                QueueItem("a", _at(clock, 1), priority=1),
            ]
        )
        clock.advance(5)
        assert await delay_queue.claim_due(10) == ["a", "b", "c"]

    async def test_claim_due__priority_beats_earlier_due_once_both_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # A worker that was busy must still take the urgent item first, not the oldest one.
        await delay_queue.enqueue(
            [QueueItem("old-low", _at(clock, 1)), QueueItem("new-high", _at(clock, 5), 9)]
        )
        clock.advance(10)
        assert await delay_queue.claim_due(1) == ["new-high"]
        assert await delay_queue.claim_due(1) == ["old-low"]

    # -- claiming ahead of the due time --------------------------------------------------------

    async def test_claim_due__ahead_takes_what_falls_due_within_it(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("in-3s", _at(clock, 3)),
                QueueItem("in-1s", _at(clock, 1)),
                QueueItem("in-2s", _at(clock, 2)),  # exactly now + ahead: inclusive, as at due
            ]
        )
        assert await delay_queue.claim_due(10) == []
        assert await delay_queue.claim_due(10, ahead=0.0) == []
        assert await delay_queue.claim_due(10, ahead=2.0) == ["in-1s", "in-2s"]
        assert await delay_queue.missing(["in-1s", "in-2s", "in-3s"]) == ["in-1s", "in-2s"]
        assert await delay_queue.claim_due(10, ahead=2.0) == []
        clock.advance(1)
        assert await delay_queue.claim_due(10, ahead=2.0) == ["in-3s"]
        assert await delay_queue.size() == 0

    async def test_claim_due__ahead_keeps_priority_then_due_order(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # What is due already and what falls due within the horizon are one pool, in the usual
        # order: a worker claiming ahead still takes the urgent run first, and no overdue run
        # of a tier waits behind a not-yet-due one of that tier.
        await delay_queue.enqueue(
            [
                QueueItem("soon-low", _at(clock, 1), priority=0),
                QueueItem("late-low", _at(clock, -5), priority=0),
                QueueItem("soon-high", _at(clock, 1.5), priority=7),
                QueueItem("far-high", _at(clock, 60), priority=9),
            ]
        )
        assert await delay_queue.claim_due(1, ahead=2.0) == ["soon-high"]
        assert await delay_queue.claim_due(10, ahead=2.0) == ["late-low", "soon-low"]
        assert await delay_queue.next_due_at() == _at(clock, 60)

    # -- idempotent enqueue --------------------------------------------------------------------

    async def test_enqueue__same_id_twice_claimed_once(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        item = QueueItem("e1", _at(clock, -1))
        await delay_queue.enqueue([item, item])
        await delay_queue.enqueue([item])
        assert await delay_queue.size() == 1
        assert await delay_queue.claim_due(10) == ["e1"]
        assert await delay_queue.claim_due(10) == []

    async def test_enqueue__later_due_at_moves_it(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 5))])
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 20))])
        assert await delay_queue.size() == 1
        assert await delay_queue.next_due_at() == _at(clock, 20)
        clock.advance(10)
        assert await delay_queue.claim_due(10) == []
        clock.advance(10)
        assert await delay_queue.claim_due(10) == ["e1"]
        clock.advance(10)
        assert await delay_queue.claim_due(10) == []

    async def test_enqueue__earlier_due_at_moves_it(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 60))])
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 1))])
        clock.advance(1)
        assert await delay_queue.claim_due(10) == ["e1"]
        clock.advance(60)
        assert await delay_queue.claim_due(10) == []

    async def test_enqueue__re_enqueue_after_due_takes_new_values(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # Already due (and possibly looked at by a claim that hit its limit) but not claimed.
        await delay_queue.enqueue([QueueItem("a", _at(clock, -2)), QueueItem("b", _at(clock, -1))])
        assert await delay_queue.claim_due(0) == []
        await delay_queue.enqueue([QueueItem("a", _at(clock, 30))])
        assert await delay_queue.claim_due(10) == ["b"]
        assert await delay_queue.next_due_at() == _at(clock, 30)

    async def test_enqueue__last_write_wins_within_a_batch(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [QueueItem("e1", _at(clock, -1)), QueueItem("e1", _at(clock, 30))]
        )
        assert await delay_queue.size() == 1
        assert await delay_queue.claim_due(10) == []
        assert await delay_queue.next_due_at() == _at(clock, 30)

    async def test_enqueue__new_priority_takes_effect(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [QueueItem("a", _at(clock, -2), priority=5), QueueItem("b", _at(clock, -1))]
        )
        await delay_queue.enqueue([QueueItem("a", _at(clock, -2), priority=0)])
        await delay_queue.enqueue([QueueItem("b", _at(clock, -1), priority=7)])
        assert await delay_queue.claim_due(10) == ["b", "a"]

    async def test_enqueue__heavy_churn_keeps_one_copy_each(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # The scheduler's sweep re-enqueues the same ids over and over; old copies must vanish
        # and the ids nobody touched again must survive whatever housekeeping that triggers.
        stable = [QueueItem(f"s{i}", _at(clock, 1 + i % 450), priority=i % 3) for i in range(300)]
        await delay_queue.enqueue(stable)
        latest = {item.execution_id: item for item in stable}
        for round_ in range(60):
            batch = [
                QueueItem(f"c{i}", _at(clock, 1 + (i * 31 + round_ * 17) % 500), priority=i % 2)
                for i in range(round_ % 3, 100, 1 + round_ % 2)
            ]
            await delay_queue.enqueue(batch)
            latest.update((item.execution_id, item) for item in batch)
            if round_ % 10 == 9:
                dropped = [f"c{i}" for i in range(round_ // 10, 100, 7)]
                await delay_queue.remove(dropped)
                for eid in dropped:
                    latest.pop(eid, None)
        assert await delay_queue.size() == len(latest)
        assert await delay_queue.next_due_at() == min(item.due_at for item in latest.values())
        clock.advance(501)
        claimed = await _claim_all(delay_queue, batch=7)
        assert sorted(claimed) == sorted(latest)
        _assert_released_in_order(claimed, latest)

    async def test_enqueue__empty_batch_is_noop(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([])
        assert await delay_queue.size() == 0
        assert await delay_queue.next_due_at() is None

    async def test_enqueue__naive_due_at_refused_whole_batch(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        naive = datetime(2026, 1, 5, 12, 0, 0)  # no tzinfo: the point of the test
        with pytest.raises(ValueError, match="due_at"):
            await delay_queue.enqueue([QueueItem("ok", _at(clock, 1)), QueueItem("bad", naive)])
        assert await delay_queue.size() == 0

    async def test_enqueue__any_timezone_compares_by_instant(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        plus_two = _at(clock, 5).astimezone(timezone(timedelta(hours=2)))
        await delay_queue.enqueue([QueueItem("e1", plus_two)])
        clock.advance(4)
        assert await delay_queue.claim_due(10) == []
        clock.advance(1)
        assert await delay_queue.claim_due(10) == ["e1"]

    # -- claim limits and exclusivity ----------------------------------------------------------

    async def test_claim_due__respects_limit(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem(f"e{i}", _at(clock, -i)) for i in range(10)])
        first = await delay_queue.claim_due(3)
        second = await delay_queue.claim_due(3)
        rest = await delay_queue.claim_due(100)
        assert (len(first), len(second), len(rest)) == (3, 3, 4)
        assert sorted(first + second + rest) == sorted(f"e{i}" for i in range(10))
        assert await delay_queue.claim_due(100) == []

    async def test_claim_due__zero_limit_claims_nothing(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        assert await delay_queue.claim_due(0) == []
        assert await delay_queue.size() == 1

    async def test_claim_due__negative_limit_refused(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        with pytest.raises(ValueError, match="limit"):
            await delay_queue.claim_due(-1)

    async def test_claim_due__negative_ahead_refused_and_takes_nothing(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        for bad in (-1.0, -1e-6, math.nan):
            with pytest.raises(ValidationError, match="ahead") as refused:
                await delay_queue.claim_due(10, ahead=bad)
            assert refused.value.field == "ahead"
        assert await delay_queue.size() == 1
        assert await delay_queue.claim_due(10) == ["e1"]

    async def test_wait__negative_ahead_refused(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 30))])
        for bad in (-2.0, math.nan):
            with pytest.raises(ValidationError, match="ahead") as refused:
                await asyncio.wait_for(delay_queue.wait(60, ahead=bad), SAFETY_TIMEOUT)
            assert refused.value.field == "ahead"

    async def test_claim_due__concurrent_claimers_never_share_an_id(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        ids = [f"e{i}" for i in range(1000)]
        await delay_queue.enqueue(
            [QueueItem(eid, _at(clock, -(i % 7))) for i, eid in enumerate(ids)]
        )
        batches = await asyncio.wait_for(
            asyncio.gather(*(delay_queue.claim_due(30) for _ in range(50))), SAFETY_TIMEOUT
        )
        claimed = [eid for batch in batches for eid in batch]
        assert len(claimed) == len(set(claimed)) == len(ids)
        assert set(claimed) == set(ids)
        assert all(len(batch) <= 30 for batch in batches)
        assert await delay_queue.size() == 0

    async def test_claim_due__claimed_id_never_returned_again(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        assert await delay_queue.claim_due(10) == ["e1"]
        clock.advance(3600)
        assert await delay_queue.claim_due(10) == []
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 0))])  # a retry re-enqueues it
        assert await delay_queue.claim_due(10) == ["e1"]

    # -- remove, next_due_at, size -------------------------------------------------------------

    async def test_remove__removed_id_never_released(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [QueueItem("keep", _at(clock, 1)), QueueItem("drop", _at(clock, 1))]
        )
        await delay_queue.remove(["drop"])
        assert await delay_queue.size() == 1
        clock.advance(5)
        assert await delay_queue.claim_due(10) == ["keep"]

    async def test_remove__unknown_and_claimed_ids_are_ignored(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("a", _at(clock, -1)), QueueItem("b", _at(clock, 9))])
        assert await delay_queue.claim_due(10) == ["a"]
        await delay_queue.remove(["a", "never-seen", "never-seen"])
        await delay_queue.remove([])
        assert await delay_queue.size() == 1

    async def test_remove__then_enqueue_again(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        await delay_queue.remove(["e1"])
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        assert await delay_queue.claim_due(10) == ["e1"]

    async def test_next_due_at__earliest_across_tiers(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        assert await delay_queue.next_due_at() is None
        await delay_queue.enqueue(
            [
                QueueItem("high", _at(clock, 30), priority=9),
                QueueItem("low", _at(clock, 10), priority=0),
                QueueItem("mid", _at(clock, 20), priority=5),
            ]
        )
        assert await delay_queue.next_due_at() == _at(clock, 10)
        await delay_queue.remove(["low"])
        assert await delay_queue.next_due_at() == _at(clock, 20)
        clock.advance(25)
        assert await delay_queue.claim_due(10) == ["mid"]
        assert await delay_queue.next_due_at() == _at(clock, 5)
        clock.advance(5)
        assert await delay_queue.claim_due(10) == ["high"]
        assert await delay_queue.next_due_at() is None

    async def test_next_due_at__includes_due_unclaimed_items(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        oldest = _at(clock, -50)
        await delay_queue.enqueue(
            [
                QueueItem("urgent", _at(clock, -1), priority=9),
                QueueItem("oldest", oldest, priority=0),
                QueueItem("later", _at(clock, 100), priority=0),
            ]
        )
        assert await delay_queue.claim_due(1) == ["urgent"]
        assert await delay_queue.next_due_at() == oldest
        assert await delay_queue.claim_due(1) == ["oldest"]
        assert await delay_queue.next_due_at() == _at(clock, 100)

    async def test_size__counts_due_and_not_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        assert await delay_queue.size() == 0
        await delay_queue.enqueue(
            [QueueItem("due", _at(clock, -1)), QueueItem("later", _at(clock, 60))]
        )
        await delay_queue.enqueue([QueueItem("later", _at(clock, 90))])
        assert await delay_queue.size() == 2
        await delay_queue.claim_due(10)
        assert await delay_queue.size() == 1
        await delay_queue.remove(["later"])
        assert await delay_queue.size() == 0

    # -- missing -------------------------------------------------------------------------------

    async def test_missing__names_ids_not_held_in_the_order_given(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("due", _at(clock, -1)),
                QueueItem("later", _at(clock, 60), priority=3),
                QueueItem("claimed", _at(clock, -2), priority=9),
                QueueItem("removed", _at(clock, 5)),
            ]
        )
        assert await delay_queue.claim_due(1) == ["claimed"]
        await delay_queue.remove(["removed"])
        asked = ["never", "due", "claimed", "later", "removed", "other"]
        assert await delay_queue.missing(asked) == ["never", "claimed", "removed", "other"]
        assert await delay_queue.missing(["due", "later"]) == []
        assert await delay_queue.missing([]) == []
        assert await delay_queue.size() == 2, "asking must not change what the queue holds"

    async def test_missing__re_enqueued_id_is_held_again(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1))])
        assert await delay_queue.claim_due(10) == ["e1"]
        assert await delay_queue.missing(["e1"]) == ["e1"]
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 3))])
        assert await delay_queue.missing(["e1"]) == []

    async def test_missing__100k_batch_of_which_some_were_lost(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        ids = [f"e{i:06d}" for i in range(100_000)]
        await delay_queue.enqueue([QueueItem(eid, _at(clock, 60)) for eid in ids])
        lost = ids[::997]
        await delay_queue.remove(lost)
        assert await delay_queue.missing(ids) == lost

    # -- shards --------------------------------------------------------------------------------

    async def test_shard__carried_through_claim_and_missing(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("s7", _at(clock, -1), shard=7),
                QueueItem("s0", _at(clock, -2)),
                QueueItem("s1023", _at(clock, 30), shard=1023),
                QueueItem("s7-later", _at(clock, 60), priority=2, shard=7),
            ]
        )
        assert await delay_queue.size() == 4
        assert await delay_queue.missing(["s7", "x", "s1023", "s0", "s7-later"]) == ["x"]
        assert sorted(await delay_queue.claim_due(10)) == ["s0", "s7"]
        assert await delay_queue.missing(["s7", "s1023", "s0"]) == ["s7", "s0"]
        assert await delay_queue.next_due_at() == _at(clock, 30)
        clock.advance(60)
        assert await delay_queue.claim_due(10) == ["s7-later", "s1023"]
        assert await delay_queue.size() == 0

    async def test_shard__priority_beats_shard_and_due_order(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [
                QueueItem("old-low", _at(clock, -50), priority=0, shard=3),
                QueueItem("new-high", _at(clock, -1), priority=9, shard=5),
                QueueItem("mid", _at(clock, -20), priority=4, shard=3),
            ]
        )
        assert await delay_queue.claim_due(1) == ["new-high"]
        assert await delay_queue.claim_due(10) == ["mid", "old-low"]

    async def test_shard__re_enqueue_under_another_shard_keeps_one_copy(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, -1), shard=3)])
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 5), priority=2, shard=7)])
        assert await delay_queue.size() == 1
        assert await delay_queue.claim_due(10) == []
        assert await delay_queue.next_due_at() == _at(clock, 5)
        clock.advance(5)
        assert await delay_queue.claim_due(10) == ["e1"]
        assert await delay_queue.claim_due(10) == []

    async def test_shard__remove_finds_every_shard(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue(
            [QueueItem(f"e{i}", _at(clock, -1), shard=i * 37 % 1024) for i in range(40)]
        )
        await delay_queue.remove([f"e{i}" for i in range(0, 40, 2)])
        assert await delay_queue.size() == 20
        assert sorted(await _claim_all(delay_queue)) == sorted(f"e{i}" for i in range(1, 40, 2))

    async def test_shard__many_shards_each_id_once_tiers_in_order(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # Order across the shards of one tier is the backend's; within a shard it is by due
        # time, and no claim hands out a lower tier while a higher one still holds due ids.
        items = [
            QueueItem(f"e{i:04d}", _at(clock, -(i * 7919 % 300)), priority=i % 3, shard=i % 97)
            for i in range(3000)
        ]
        await delay_queue.enqueue(items)
        by_id = {item.execution_id: item for item in items}
        claimed = await _claim_all(delay_queue, batch=101)
        assert sorted(claimed) == sorted(by_id)
        tiers = [by_id[eid].priority for eid in claimed]
        assert tiers == sorted(tiers, reverse=True)
        for shard in range(97):
            mine = [eid for eid in claimed if by_id[eid].shard == shard]
            _assert_released_in_order(mine, by_id)

    # -- wait ----------------------------------------------------------------------------------

    async def test_wait__returns_at_once_when_something_is_due(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 0))])
        await asyncio.wait_for(delay_queue.wait(60), SAFETY_TIMEOUT)

    async def test_wait__wakes_on_enqueue(self, delay_queue: DelayQueue, clock: FakeClock) -> None:
        waiter = asyncio.create_task(delay_queue.wait(60))
        await _settle()
        assert not waiter.done()
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 30))])  # the clock does not move
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    async def test_wait__wakes_on_enqueue_of_earlier_item(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("far", _at(clock, 3600))])
        waiter = asyncio.create_task(delay_queue.wait(600))
        await _settle()
        assert not waiter.done()
        await delay_queue.enqueue([QueueItem("near", _at(clock, 1))])
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    async def test_wait__wakes_when_earliest_due_time_passes(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 5)), QueueItem("e2", _at(clock, 8))])
        waiter = asyncio.create_task(delay_queue.wait(60))
        await _asleep(clock)
        clock.advance(4.5)
        await _settle()
        assert not waiter.done()
        clock.advance(0.5)
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
        assert await delay_queue.claim_due(10) == ["e1"]

    async def test_wait__ahead_wakes_that_long_before_the_earliest_due_time(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 5)), QueueItem("e2", _at(clock, 8))])
        waiter = asyncio.create_task(delay_queue.wait(60, ahead=2.0))
        await _asleep(clock)
        clock.advance(2.9)
        await _settle()
        assert not waiter.done()
        clock.advance(0.1)  # due time 5 s, less 2 s ahead
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
        assert await delay_queue.claim_due(10) == []
        assert await delay_queue.claim_due(10, ahead=2.0) == ["e1"]

    async def test_wait__ahead_returns_at_once_when_something_falls_due_within_it(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 2))])
        await asyncio.wait_for(delay_queue.wait(60, ahead=2.0), SAFETY_TIMEOUT)

    async def test_wait__ahead_wakes_on_enqueue_due_within_the_timeout_plus_ahead(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        # Due at 11 s, past the 10 s timeout, but claim_due(ahead=2) takes it at 9 s: a backend
        # that wakes only for arrivals due before it would wake anyway must count the horizon.
        await delay_queue.enqueue([QueueItem("far", _at(clock, 3600))])
        waiter = asyncio.create_task(delay_queue.wait(10, ahead=2.0))
        # Asleep, so it has chosen what may wake it: any arrival wakes a waiter still reading.
        await _asleep(clock)
        await _settle()
        assert not waiter.done()
        await delay_queue.enqueue([QueueItem("near", _at(clock, 11))])  # the clock does not move
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    async def test_wait__times_out(self, delay_queue: DelayQueue, clock: FakeClock) -> None:
        await delay_queue.enqueue([QueueItem("far", _at(clock, 3600))])
        waiter = asyncio.create_task(delay_queue.wait(10))
        await _asleep(clock)
        clock.advance(9.9)
        await _settle()
        assert not waiter.done()
        clock.advance(0.1)
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    async def test_wait__times_out_when_empty(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        waiter = asyncio.create_task(delay_queue.wait(2))
        await _asleep(clock)
        assert not waiter.done()
        clock.advance(2)
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    async def test_wait__many_waiters_all_wake(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        waiters = [asyncio.create_task(delay_queue.wait(60)) for _ in range(5)]
        await _settle()
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 30))])
        await asyncio.wait_for(asyncio.gather(*waiters), SAFETY_TIMEOUT)

    async def test_wait__cancelled_waiter_leaves_queue_usable(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        waiter = asyncio.create_task(delay_queue.wait(60))
        await _settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        again = asyncio.create_task(delay_queue.wait(60))
        await _settle()
        await delay_queue.enqueue([QueueItem("e1", _at(clock, 0))])
        await asyncio.wait_for(again, SAFETY_TIMEOUT)
        assert await delay_queue.claim_due(10) == ["e1"]

    async def test_close__releases_waiters_and_is_idempotent(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        waiter = asyncio.create_task(delay_queue.wait(60))
        await _settle()
        assert not waiter.done()
        await delay_queue.close()
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
        await delay_queue.close()

    # -- scale and model agreement -------------------------------------------------------------

    async def test_claim_due__100k_roundtrip_each_id_once_in_order(
        self, delay_queue: DelayQueue, clock: FakeClock
    ) -> None:
        n = 100_000
        items = [
            QueueItem(f"e{i:06d}", _at(clock, 1 + (i * 7919) % 600), priority=i % 3)
            for i in range(n)
        ]
        for start in range(0, n, 10_000):
            await delay_queue.enqueue(items[start : start + 10_000])
        assert await delay_queue.size() == n
        assert await delay_queue.claim_due(1000) == []
        clock.advance(601)
        claimed = await _claim_all(delay_queue, batch=997)
        assert len(claimed) == n
        assert len(set(claimed)) == n
        _assert_released_in_order(claimed, {item.execution_id: item for item in items})
        assert await delay_queue.size() == 0
        assert await delay_queue.next_due_at() is None

    @settings(
        deadline=None,
        max_examples=150,
        # One queue serves every example: each example uses fresh ids, removes them all at the
        # end, and checks it started from an empty queue, so no state leaks between examples.
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(ops=_ops)
    async def test_delay_queue__agrees_with_dict_model(
        self, delay_queue: DelayQueue, clock: FakeClock, ops: list[_Op]
    ) -> None:
        prefix = uuid.uuid4().hex[:8]
        pool = [f"{prefix}-{i}" for i in range(_ID_POOL)]
        model: dict[str, tuple[datetime, int]] = {}  # id -> (due_at, priority)
        assert await delay_queue.size() == 0
        try:
            for op in ops:
                await self._apply(delay_queue, clock, model, pool, op)
                assert await delay_queue.size() == len(model)
                expected_next = min((due for due, _ in model.values()), default=None)
                assert await delay_queue.next_due_at() == expected_next
                assert await delay_queue.missing(pool) == [i for i in pool if i not in model]
        finally:
            await delay_queue.remove(pool)

    @staticmethod
    async def _apply(
        queue: DelayQueue,
        clock: FakeClock,
        model: dict[str, tuple[datetime, int]],
        pool: list[str],
        op: _Op,
    ) -> None:
        if isinstance(op, _Enqueue):
            batch = [QueueItem(pool[i], _at(clock, offset), prio) for i, offset, prio in op.items]
            await queue.enqueue(batch)
            for item in batch:
                model[item.execution_id] = (item.due_at, item.priority)
        elif isinstance(op, _Claim):
            until = clock.now() + timedelta(seconds=op.ahead)
            due = {eid: (-prio, at) for eid, (at, prio) in model.items() if at <= until}
            got = await queue.claim_due(op.limit, ahead=op.ahead)
            assert len(got) == len(set(got)) == min(op.limit, len(due))
            assert set(got) <= set(due)
            keys = [due[eid] for eid in got]
            assert keys == sorted(keys)
            left = [key for eid, key in due.items() if eid not in got]
            if keys and left:  # nothing left behind may outrank what was handed out
                assert max(keys) <= min(left)
            for eid in got:
                del model[eid]
        elif isinstance(op, _Remove):
            ids = [pool[i] for i in op.ids]
            await queue.remove(ids)
            for eid in ids:
                model.pop(eid, None)
        else:
            clock.advance(op.seconds)
