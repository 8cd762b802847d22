"""The worker's claim thread: work runs on its own loop, to its end even when the caller stops
waiting, and ``stop`` waits for it before closing the queue."""

from __future__ import annotations

import asyncio
import threading
from typing import cast

from onbeat.queue.base import DelayQueue
from onbeat.worker.claim_thread import ClaimThread


class Queue:
    def __init__(self) -> None:
        self.opened_on = threading.get_ident()
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_claim_thread__runs_work_on_its_own_thread_with_one_queue() -> None:
    opened: list[Queue] = []

    def open_queue() -> DelayQueue:
        opened.append(Queue())
        return cast(DelayQueue, opened[-1])

    claims = ClaimThread(open_queue)
    claims.start()

    async def where(queue: DelayQueue) -> tuple[int, DelayQueue]:
        return threading.get_ident(), queue

    first, second = await claims.run(where), await claims.run(where)
    await claims.stop()
    assert first[0] == second[0] != threading.get_ident()
    assert len(opened) == 1 and first[1] is second[1] and cast(object, first[1]) is opened[0]
    assert opened[0].opened_on == first[0]  # made on the claim thread's loop
    assert opened[0].closed


async def test_claim_thread__work_outlives_a_cancelled_caller_and_stop_waits_for_it() -> None:
    """The worker stopping cancels its claim; what the claim took from the queue must still
    reach the worker's hand before the worker requeues what is in hand."""
    queue = Queue()
    claims = ClaimThread(lambda: cast(DelayQueue, queue))
    claims.start()
    entered, let_go = threading.Event(), threading.Event()
    in_hand: list[str] = []
    closed_before_done: list[bool] = []

    async def claim(_: DelayQueue) -> list[str]:
        entered.set()
        await asyncio.to_thread(let_go.wait, 10)
        in_hand.append("e1")
        closed_before_done.append(queue.closed)
        return in_hand

    caller = asyncio.create_task(claims.run(claim))
    assert await asyncio.to_thread(entered.wait, 10)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    assert in_hand == []  # still under way on the claim thread
    stopping = asyncio.create_task(claims.stop())
    await asyncio.sleep(0)  # stop begins
    let_go.set()
    await asyncio.wait_for(stopping, 10)
    assert in_hand == ["e1"]
    assert closed_before_done == [False]  # stop waited for the claim, then closed the queue
    assert queue.closed
