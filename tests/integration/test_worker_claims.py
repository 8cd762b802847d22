"""How a worker sizes its claims: what the store and the queue pay per claim, a full worker
spreads over several runs instead of paying it for each slot that frees."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from onbeat import TaskContext
from onbeat.store.base import ClaimResult
from onbeat.worker import worker as worker_module
from tests.integration.conftest import Node, running_worker
from tests.integration.test_metrics import value

SAFETY_TIMEOUT = 10.0


def record_claims(node: Node, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of ids of each of the store's claims, in order, from now on."""
    claims: list[int] = []
    claim = node.app.store.execution_claim

    def recorded(ids: Sequence[str], *args: Any, **kwargs: Any) -> ClaimResult:
        claims.append(len(ids))
        return claim(ids, *args, **kwargs)

    monkeypatch.setattr(node.app.store, "execution_claim", recorded)
    return claims


@pytest.mark.parametrize(
    ("gather", "second_claim"),
    [(SAFETY_TIMEOUT, 2), (0.0, 1)],
    ids=["gathers-half-a-batch", "not-past-CLAIM_GATHER"],
)
async def test_worker__a_full_worker_claims_for_half_a_batch_of_slots_not_each_one(
    node: Node, monkeypatch: pytest.MonkeyPatch, gather: float, second_claim: int
) -> None:
    """Concurrency 4 (half a batch: 2 slots), 12 runs due now: the first claim takes 4; when
    one run ends and a second a moment later, the next claim takes both, unless
    ``CLAIM_GATHER`` ran out first (0 here), when it takes the one slot free."""
    monkeypatch.setattr(worker_module, "CLAIM_GATHER", gather)
    node.app.settings.concurrency = 4
    node.app.settings.claim_batch = 4
    node.app.settings.claim_prefetch = 0  # claims for the free slots alone
    gates = [asyncio.Event() for _ in range(12)]
    started: list[int] = []
    progress = asyncio.Event()

    @node.app.task(name="gated")
    async def gated(ctx: TaskContext, i: int) -> None:
        started.append(i)
        progress.set()
        await gates[i].wait()

    claims = record_claims(node, monkeypatch)
    node.app.submit_many([node.app.prepare("gated", {"i": i}) for i in range(12)])
    await node.dispatch()

    async def until_started(n: int) -> None:
        while len(started) < n:
            progress.clear()
            await asyncio.wait_for(progress.wait(), SAFETY_TIMEOUT)

    async with running_worker(node.worker):
        try:
            await until_started(4)
            assert claims == [4]
            first, second = started[0], started[1]
            gates[first].set()
            for _ in range(5):  # the first run ends and the claim loop sees its slot free
                await asyncio.sleep(0)
            gates[second].set()
            await until_started(4 + second_claim)
            assert claims[:2] == [4, second_claim]
        finally:
            for gate in gates:
                gate.set()
            await until_started(12)
    assert sorted(started) == list(range(12))
    assert value(node.worker.metrics, "onbeat_claim_size_runs_count") == len(claims)
    assert value(node.worker.metrics, "onbeat_claim_size_runs_sum") == sum(claims) == 12


async def test_worker__runs_arriving_in_a_stream_share_a_claim_one_alone_is_claimed_at_once(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that took 2 runs, all the queue had due, is a stream arriving: the next claim
    waits ``ARRIVAL_GATHER`` (long here), and 3 runs queued one by one meanwhile share it. A
    claim that took 1 run is not: the next run is claimed as soon as it is queued, long before
    that wait would have ended."""
    monkeypatch.setattr(worker_module, "ARRIVAL_GATHER", 2.0)
    claims = record_claims(node, monkeypatch)

    async def arrive(n: int) -> None:
        for i in range(n):
            node.app.schedule("arecord", {"i": i})
            await node.dispatch()
            await asyncio.sleep(0.02)

    async with running_worker(node.worker):
        await arrive(1)
        await until_succeeded(node, 1, SAFETY_TIMEOUT)
        await asyncio.sleep(0.05)  # the claim loop is waiting on the queue again
        await arrive(1)
        await until_succeeded(node, 2, 1.0)  # not after ARRIVAL_GATHER: one run is not a stream
        node.app.submit_many([node.app.prepare("arecord", {"i": i}) for i in range(2)])
        await node.dispatch()
        await until_succeeded(node, 4, SAFETY_TIMEOUT)
        await arrive(3)  # within the wait after the claim of 2
        await until_succeeded(node, 7, SAFETY_TIMEOUT)
    assert claims == [1, 1, 2, 3]


async def test_worker__a_backlog_is_claimed_as_slots_free_not_after_the_arrival_gather(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrency 4 and 12 runs due at once: each claim takes all it asks for (the free slots)
    while the queue holds more, so none is followed by ``ARRIVAL_GATHER`` (5 s here): all 12
    run within a second."""
    monkeypatch.setattr(worker_module, "ARRIVAL_GATHER", 5.0)
    node.app.settings.concurrency = 4
    node.app.settings.claim_prefetch = 0  # claims for the free slots alone
    claims = record_claims(node, monkeypatch)
    node.app.submit_many([node.app.prepare("arecord", {"i": i}) for i in range(12)])
    await node.dispatch()
    async with running_worker(node.worker):
        await until_succeeded(node, 12, 1.0)
    assert sum(claims) == 12 and len(claims) >= 3


@pytest.mark.parametrize(
    ("prefetch", "max_in_flight", "claims_beyond_slots"),
    [(SAFETY_TIMEOUT, None, True), (0.0, None, False), (SAFETY_TIMEOUT, 1_000, False)],
    ids=["prefetch", "off", "under-a-fleet-limit"],
)
async def test_worker__runs_ending_quickly_let_claims_take_more_than_the_free_slots(
    node: Node,
    monkeypatch: pytest.MonkeyPatch,
    prefetch: float,
    max_in_flight: int | None,
    claims_beyond_slots: bool,
) -> None:
    """Concurrency 4 and 40 short runs due at once. With ``claim_prefetch`` (long here, so
    every end so far counts), a claim after runs ended takes as many more as ended, up to
    ``claim_batch``: those wait in the worker for a slot, and never more than 4 run at once.
    With 0, or with a fleet limit in the worker's settings (never reached here: a run waiting
    in one worker would hold a place under the cap), no claim takes more than the free slots.
    Each run runs once either way."""
    node.app.settings.concurrency = 4
    node.app.settings.claim_batch = 16
    node.app.settings.claim_prefetch = prefetch
    node.app.settings.max_in_flight = max_in_flight
    node.worker = node.new_worker()  # its limits are read from the settings when it is made
    running, most_at_once, ran = 0, 0, []

    @node.app.task(name="short")
    async def short(ctx: TaskContext, i: int) -> None:
        nonlocal running, most_at_once
        running += 1
        most_at_once = max(most_at_once, running)
        await asyncio.sleep(0)
        ran.append(i)
        running -= 1

    claims = record_claims(node, monkeypatch)
    node.app.submit_many([node.app.prepare("short", {"i": i}) for i in range(40)])
    await node.dispatch()
    async with running_worker(node.worker):
        await until_succeeded(node, 40, SAFETY_TIMEOUT)
    assert sorted(ran) == list(range(40))
    assert most_at_once == 4
    assert claims[0] == 4 and max(claims) <= 16
    assert (max(claims) > 4) is claims_beyond_slots


async def test_worker__runs_claimed_beyond_the_free_slots_are_released_at_stop(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrency 2: the first two runs end together, so the next claim takes 4, two of which
    wait for the slots the next two (blocked) hold. A stop (no grace) releases all four (due
    again, their attempts not counted), and another worker runs each once."""
    node.app.settings.concurrency = 2
    node.app.settings.claim_prefetch = SAFETY_TIMEOUT
    node.app.settings.shutdown_grace = 0
    first_two, two_blocked, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
    starts, blocked, ran = 0, 0, []

    @node.app.task(name="held")
    async def held(ctx: TaskContext, i: int) -> None:
        nonlocal starts, blocked
        starts += 1
        if starts <= 2:  # the first two end in the same pass of the loop
            if starts == 2:
                first_two.set()
            await first_two.wait()
        elif not gate.is_set():
            blocked += 1
            if blocked == 2:
                two_blocked.set()
            await gate.wait()
        ran.append(i)

    claims = record_claims(node, monkeypatch)
    node.app.submit_many([node.app.prepare("held", {"i": i}) for i in range(6)])
    await node.dispatch()
    async with running_worker(node.worker):
        await asyncio.wait_for(two_blocked.wait(), SAFETY_TIMEOUT)
    assert claims == [2, 4]
    assert (node.worker.stats.succeeded, node.worker.stats.released) == (2, 4)
    assert len(ran) == 2
    gate.set()
    other = node.new_worker()
    await node.dispatch()
    await other.run_until_idle()
    assert sorted(ran) == list(range(6))
    assert other.stats.succeeded == 4


async def until_succeeded(node: Node, n: int, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while node.worker.stats.succeeded < n:  # noqa: ASYNC110 (the worker's own tasks)
            await asyncio.sleep(0.005)
