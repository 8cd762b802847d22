"""FailoverDelayQueue: what happens when its primary goes down and comes back.

The DelayQueue contract runs over it with Redis up and with Redis down throughout
(tests/contract/test_delay_queue.py). Here the primary is switched off and on mid-test (an
in-process queue that refuses every call while "down"), and the fallback is the PostgreSQL
table queue whose reads are counted, to show an idle queue does not poll it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from onbeat import App
from onbeat.errors import QueueUnavailableError
from onbeat.node import Node
from onbeat.queue import failover
from onbeat.queue.base import QueueItem
from onbeat.queue.failover import (
    FALLBACK_RECHECK,
    PRIMARY_RETRY,
    PROBE_INTERVAL,
    FailoverDelayQueue,
)
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.queue.table import TableDelayQueue, open_table_queue
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import fresh_schema
from tests.integration.test_metrics import value
from tests.queue_backends import fresh_queue_url

pytestmark = pytest.mark.external_service


class SwitchableQueue(MemoryDelayQueue):
    """An in-process primary that refuses every call while ``down``, as a dead Redis does."""

    down = False

    def _refuse(self) -> None:
        if self.down:
            raise QueueUnavailableError("primary is down (test)")

    async def enqueue(self, items: Sequence[QueueItem]) -> None:
        self._refuse()
        await super().enqueue(items)

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        self._refuse()
        return await super().claim_due(limit, ahead)

    async def missing(self, execution_ids: Sequence[str]) -> list[str]:
        self._refuse()
        return await super().missing(execution_ids)

    async def next_due_at(self) -> datetime | None:
        self._refuse()
        return await super().next_due_at()

    async def wait(self, timeout: float, ahead: float = 0.0) -> None:
        self._refuse()
        await super().wait(timeout, ahead)


class CountingTable(TableDelayQueue):
    """Counts the statements the failover sends the fallback."""

    reads = 0

    async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
        self.reads += 1
        return await super().claim_due(limit, ahead)

    async def next_due_at(self) -> datetime | None:
        self.reads += 1
        return await super().next_due_at()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def parts(
    clock: FakeClock, tmp_path: Path
) -> AsyncIterator[tuple[FailoverDelayQueue, SwitchableQueue, CountingTable]]:
    async with fresh_queue_url("postgres", tmp_path) as url:
        table = open_table_queue(url, clock)
        fallback = CountingTable(table._driver, clock)
        primary = SwitchableQueue(clock)
        queue = FailoverDelayQueue(primary, fallback, clock, primary_url="switchable://")
        queue.fallback_url = url  # type: ignore[attr-defined]  # for the "other process"
        try:
            yield queue, primary, fallback
        finally:
            await queue.close()


def _at(clock: FakeClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


async def test_failover__runs_enqueued_while_down_are_claimed_from_the_fallback(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    queue, primary, fallback = parts
    changes: list[bool] = []
    queue.on_primary_change(changes.append)
    await queue.enqueue([QueueItem("before", _at(clock, 0))])
    primary.down = True
    await queue.enqueue([QueueItem("during", _at(clock, 0))])
    assert changes == [False]
    assert await fallback.size() == 1
    # Claims while down: the fallback's run, and no error (the primary is skipped).
    assert await queue.claim_due(10) == ["during"]
    assert await queue.claim_due(10) == []
    primary.down = False
    clock.advance(PRIMARY_RETRY)
    await queue.enqueue([QueueItem("after", _at(clock, 0))])
    assert changes == [False, True]
    assert sorted(await queue.claim_due(10)) == ["after", "before"]


async def test_failover__a_retry_of_a_frozen_primary_gives_up_sooner_than_the_first_call(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen primary (Redis under ``kill -STOP``) never answers. The first call waits
    ``PRIMARY_TIMEOUT`` for it; each retry, every ``PRIMARY_RETRY`` while it stays frozen, only
    ``RETRY_TIMEOUT``, so the claims behind it reach the fallback's runs sooner."""
    monkeypatch.setattr(failover, "PRIMARY_TIMEOUT", 0.6)
    monkeypatch.setattr(failover, "RETRY_TIMEOUT", 0.05)
    queue, primary, fallback = parts
    frozen = asyncio.Event()

    async def never_answers(limit: int, ahead: float = 0.0) -> list[str]:
        await frozen.wait()
        return []

    primary.claim_due = never_answers  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await queue.claim_due(10) == []
    first = loop.time() - began
    await fallback.enqueue([QueueItem("during", _at(clock, 0))])
    queue._heard(None)  # what the fallback's LISTEN connection reports
    clock.advance(PRIMARY_RETRY)
    began = loop.time()
    assert await queue.claim_due(10) == ["during"]
    retried = loop.time() - began
    assert first >= 0.6 and retried < 0.4, (first, retried)
    assert not queue.primary_up


async def test_failover__missing_while_down_counts_only_the_fallback(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    queue, primary, _ = parts
    await queue.enqueue([QueueItem("in-primary", _at(clock, 5))])
    primary.down = True
    await queue.enqueue([QueueItem("in-fallback", _at(clock, 5))])
    # The sweep moves what the dead primary held into the fallback, and only that.
    assert await queue.missing(["in-primary", "in-fallback"]) == ["in-primary"]
    primary.down = False
    clock.advance(PRIMARY_RETRY)
    assert await queue.missing(["in-primary", "in-fallback", "gone"]) == ["gone"]


async def test_failover__both_down_raises_so_the_worker_backs_off(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    queue, primary, fallback = parts
    primary.down = True
    await queue.claim_due(1)  # learns the primary is down

    async def refused(limit: int, ahead: float = 0.0) -> list[str]:
        raise QueueUnavailableError("fallback is down (test)")

    fallback.claim_due = refused  # type: ignore[method-assign]
    queue._heard(None)  # what the fallback's lost LISTEN connection reports
    clock.advance(PRIMARY_RETRY)
    with pytest.raises(QueueUnavailableError):
        await queue.claim_due(10)


async def test_failover__idle_claims_and_waits_do_not_read_the_fallback(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    queue, _, fallback = parts
    await queue.claim_due(10)  # learns the fallback is empty
    reads = fallback.reads
    for _ in range(50):
        assert await queue.claim_due(10) == []
        clock.advance(0.2)
    assert fallback.reads == reads


async def test_failover__a_queue_that_only_waits_sleeps_after_the_fallbacks_recheck(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    """A worker claims through its claim thread's queue and waits on its event loop's
    (worker/claim_thread.py), so that queue never claims. Once ``FALLBACK_RECHECK`` had passed
    since its last read of the fallback, its wait returned at once without reading it again,
    every call: an idle worker spun at 80 % of a core. Now the wait reads the fallback once and
    sleeps."""
    queue, _, fallback = parts
    await queue.wait(0)  # learns the fallback is empty
    clock.advance(FALLBACK_RECHECK + 1)
    reads = fallback.reads
    for _ in range(3):
        waiting = asyncio.ensure_future(queue.wait(0.5))
        sleeping = asyncio.ensure_future(clock.until_sleeping())
        await asyncio.wait_for(
            asyncio.wait([waiting, sleeping], return_when=asyncio.FIRST_COMPLETED), 10
        )
        sleeping.cancel()
        assert not waiting.done(), "returned at once, with nothing due"
        clock.advance(0.5)
        await asyncio.wait_for(waiting, 10)
    assert fallback.reads == reads + 1


async def test_failover__another_process_enqueueing_to_the_fallback_is_heard(
    parts: tuple[FailoverDelayQueue, SwitchableQueue, CountingTable], clock: FakeClock
) -> None:
    queue, _, _ = parts
    await queue.claim_due(10)  # learns the fallback is empty
    # Another process's failover queue, on the same table, while its Redis is down.
    other = open_table_queue(queue.fallback_url, clock)  # type: ignore[attr-defined]
    try:
        await other.enqueue([QueueItem("elsewhere", _at(clock, 0))])
        await asyncio.wait_for(
            queue.wait(5), 10
        )  # woken by the NOTIFY, not by the timeout (the clock stands still)
        assert await queue.claim_due(10) == ["elsewhere"]
    finally:
        await other.close()


class ForgetfulQueue(SwitchableQueue):
    """A primary that says it lost its data while up, as Redis after a FLUSHALL."""

    forgot = False

    def forget(self) -> None:
        self.forgot = True

    async def lost_data(self) -> bool:
        self._refuse()
        forgot, self.forgot = self.forgot, False
        return forgot


async def test_failover__a_primary_that_lost_its_data_while_up_is_told_to_listeners(
    clock: FakeClock, tmp_path: Path
) -> None:
    """Regression: a flushed Redis stays up, so the listeners (the scheduler's recheck) were
    never called and its queued runs came back only after the sweep's ``sweep_overdue``."""
    async with fresh_queue_url("postgres", tmp_path) as url:
        fallback = open_table_queue(url, clock)
        primary = ForgetfulQueue(clock)
        queue = FailoverDelayQueue(primary, fallback, clock, primary_url="forgetful://")
        heard: list[bool] = []
        queue.on_primary_change(heard.append)
        try:
            await queue.enqueue([QueueItem("r1", _at(clock, 5))])  # starts the probe
            await clock.until_sleeping()
            clock.advance(PROBE_INTERVAL)
            await asyncio.sleep(0.05)
            assert heard == []
            primary.forget()
            await clock.until_sleeping()
            clock.advance(PROBE_INTERVAL)
            for _ in range(100):
                if heard:
                    break
                await asyncio.sleep(0.01)
            assert heard == [True]
            assert queue.primary_up
        finally:
            await queue.close()


async def test_failover__a_fleet_node_uses_it_and_counts_failovers(clock: FakeClock) -> None:
    """Redis URL + PostgreSQL store: the node's queue fails over (Redis here is a dead port),
    its metrics say so, and its scheduler is asked to check its queued runs at once."""
    with fresh_schema() as database_url:
        app = App(database_url, "redis://127.0.0.1:18748/0", clock=clock)
        try:
            node = Node(app, worker=False)
            assert isinstance(node.queue, FailoverDelayQueue)
            await node.queue.enqueue([QueueItem("r1", _at(clock, 0))])
            assert value(node.metrics, "onbeat_queue_on_fallback") == 1
            assert value(node.metrics, "onbeat_queue_failovers_total") == 1
            assert node.scheduler._sweep_wake.is_set()
            assert await node.queue.claim_due(10) == ["r1"]
            await node.queue.close()
        finally:
            app.close()
        off = App(database_url, "redis://127.0.0.1:18748/0", clock=clock, queue_failover=False)
        try:
            assert not isinstance(Node(off, worker=False).queue, FailoverDelayQueue)
        finally:
            off.close()
