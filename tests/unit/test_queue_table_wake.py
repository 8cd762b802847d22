"""When ``TableDelayQueue.wait`` wakes: the rules that keep it from missing an enqueue made by
another process while it reads the table, without waking for batches it has already seen.

A scripted driver stands in for the database, so the test decides exactly when the waiter's
read happens relative to each notification.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from datetime import timedelta

import pytest

from onbeat.queue.base import QueueItem
from onbeat.queue.table import QueueRow, TableDelayQueue, to_micros
from onbeat.testing.clock import FakeClock

SAFETY_TIMEOUT = 10.0


class ScriptedDriver:
    """Rows in a dict; ``earliest()`` blocks while ``gate`` is clear; ``notes`` feeds listen()."""

    notifies = True

    def __init__(self) -> None:
        self.rows: dict[str, QueueRow] = {}
        self.gate = asyncio.Event()
        self.gate.set()
        self.reading = asyncio.Event()
        self.notes: asyncio.Queue[int | None] = asyncio.Queue()

    async def open(self) -> None:
        pass

    async def enqueue(self, rows: Sequence[QueueRow], earliest: int) -> None:
        self.rows.update((row.execution_id, row) for row in rows)

    async def claim(self, now: int, limit: int) -> list[str]:
        due = sorted((r for r in self.rows.values() if r.due_at <= now), key=lambda r: r.due_at)
        for row in due[:limit]:
            del self.rows[row.execution_id]
        return [row.execution_id for row in due[:limit]]

    async def remove(self, ids: Sequence[str]) -> None:
        for eid in ids:
            self.rows.pop(eid, None)

    async def missing(self, ids: Sequence[str]) -> list[str]:
        return [eid for eid in ids if eid not in self.rows]

    async def earliest(self) -> int | None:
        self.reading.set()
        await self.gate.wait()
        return min((row.due_at for row in self.rows.values()), default=None)

    async def size(self) -> int:
        return len(self.rows)

    async def listen(self) -> AsyncGenerator[int | None, None]:
        return self._notes()

    async def _notes(self) -> AsyncGenerator[int | None, None]:
        while True:
            due = await self.notes.get()
            yield due
            self.notes.task_done()  # the queue has handled it

    async def close(self) -> None:
        pass

    async def notify(self, due: int | None) -> None:
        """Another process enqueued a batch due at ``due``; returns once the queue handled it."""
        self.notes.put_nowait(due)
        await asyncio.wait_for(self.notes.join(), SAFETY_TIMEOUT)


@pytest.fixture
async def driver_and_queue(
    clock: FakeClock,
) -> tuple[ScriptedDriver, TableDelayQueue]:
    driver = ScriptedDriver()
    return driver, TableDelayQueue(driver, clock)


def _in(clock: FakeClock, seconds: float) -> int:
    return to_micros(clock.now() + timedelta(seconds=seconds))


async def _start_waiting_during_read(
    driver: ScriptedDriver, queue: TableDelayQueue, timeout: float
) -> asyncio.Task[None]:
    """A waiter held inside its read of the table."""
    await queue.wait(0)  # opens and starts listening, so the read below is the waiter's own
    driver.gate.clear()
    driver.reading.clear()
    waiter = asyncio.create_task(queue.wait(timeout))
    await asyncio.wait_for(driver.reading.wait(), SAFETY_TIMEOUT)
    return waiter


async def test_wait__remote_batch_already_in_its_read_does_not_wake_it(
    driver_and_queue: tuple[ScriptedDriver, TableDelayQueue], clock: FakeClock
) -> None:
    driver, queue = driver_and_queue
    waiter = await _start_waiting_during_read(driver, queue, 60)
    # Committed before the read: the read sees it, the notification lags behind.
    driver.rows["e1"] = QueueRow("e1", 0, 0, _in(clock, 5))
    await driver.notify(_in(clock, 5))
    driver.gate.set()
    await asyncio.wait_for(clock.until_sleeping(1), SAFETY_TIMEOUT)
    assert not waiter.done()
    clock.advance(5)
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)


async def test_wait__remote_batch_missed_by_its_read_wakes_it(
    driver_and_queue: tuple[ScriptedDriver, TableDelayQueue], clock: FakeClock
) -> None:
    driver, queue = driver_and_queue
    driver.rows["far"] = QueueRow("far", 0, 0, _in(clock, 30))
    waiter = await _start_waiting_during_read(driver, queue, 60)
    await driver.notify(_in(clock, 5))  # committed after the read's snapshot: not in it
    driver.gate.set()
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
    assert clock.monotonic() == 0


async def test_wait__local_enqueue_during_its_read_wakes_it(
    driver_and_queue: tuple[ScriptedDriver, TableDelayQueue], clock: FakeClock
) -> None:
    # As MemoryDelayQueue: anything this object enqueues after wait() began wakes the waiter.
    driver, queue = driver_and_queue
    waiter = await _start_waiting_during_read(driver, queue, 60)
    await queue.enqueue([QueueItem("e1", clock.now() + timedelta(seconds=30))])
    driver.gate.set()
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
    assert clock.monotonic() == 0


@pytest.mark.parametrize(("due_in", "wakes"), [(4.999, True), (5, False), (30, False)])
async def test_wait__remote_batch_while_asleep_wakes_only_if_due_sooner(
    driver_and_queue: tuple[ScriptedDriver, TableDelayQueue],
    clock: FakeClock,
    due_in: float,
    wakes: bool,
) -> None:
    driver, queue = driver_and_queue
    driver.rows["e1"] = QueueRow("e1", 0, 0, _in(clock, 5))
    waiter = asyncio.create_task(queue.wait(60))
    await asyncio.wait_for(clock.until_sleeping(1), SAFETY_TIMEOUT)
    await driver.notify(_in(clock, due_in))
    if wakes:
        await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
        assert clock.monotonic() == 0
        return
    for _ in range(20):  # let every ready task run; no time passes
        await asyncio.sleep(0)
    assert not waiter.done()
    clock.advance(5)
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)


async def test_wait__unknown_notification_wakes_everyone(
    driver_and_queue: tuple[ScriptedDriver, TableDelayQueue], clock: FakeClock
) -> None:
    driver, queue = driver_and_queue
    driver.rows["e1"] = QueueRow("e1", 0, 0, _in(clock, 5))
    waiters = [asyncio.create_task(queue.wait(60)) for _ in range(3)]
    await asyncio.wait_for(clock.until_sleeping(3), SAFETY_TIMEOUT)
    await driver.notify(None)
    await asyncio.wait_for(asyncio.gather(*waiters), SAFETY_TIMEOUT)
    assert clock.monotonic() == 0
    await queue.close()
