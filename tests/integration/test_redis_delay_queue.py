"""The Redis delay queue where the contract suite cannot look: several queue objects (as in
several processes) on one Redis, lost data, a stale index, the key layout, an unreachable
server. Needs the Redis that .ci/run starts; fails (never skips) without it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from onbeat.errors import QueueUnavailableError
from onbeat.queue import QueueItem, open_queue
from onbeat.queue.redis import RedisDelayQueue
from onbeat.queue.redis_scripts import Call
from onbeat.testing.clock import FakeClock
from onbeat.testing.redis_queue import REDIS_TEST_URL, drop_prefix, fresh_queue_url

pytestmark = pytest.mark.external_service

SAFETY_TIMEOUT = 10.0
"""Real seconds before a test that should already have finished is declared hung."""
FLUSH_DB = 15
"""The Redis DB ``test_flushdb__...`` empties: reserved for it, so other tests and other
users of the machine's Redis (DB 0 with their own prefixes) keep their keys."""

QueueFactory = Callable[..., RedisDelayQueue]


def _at(clock: FakeClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


async def _settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_TEST_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def open_queues(clock: FakeClock) -> AsyncIterator[QueueFactory]:
    """Opens queue objects on one fresh prefix (each with its own connections, as separate
    processes would have); closes them and drops the prefix afterwards."""
    url, prefix = fresh_queue_url()
    opened: list[RedisDelayQueue] = []

    def open_one(**options: Any) -> RedisDelayQueue:
        full = url + "".join(f"&{key}={value}" for key, value in options.items())
        queue = open_queue(full, clock)
        assert isinstance(queue, RedisDelayQueue)
        opened.append(queue)
        return queue

    yield open_one
    for queue in opened:
        await queue.close()
    await drop_prefix(prefix)


async def _keys_of(client: aioredis.Redis, queue: RedisDelayQueue) -> list[str]:
    return [key async for key in client.scan_iter(match=f"{queue._keys.prefix}:*")]


# -- several processes on one Redis ---------------------------------------------------------


async def test_wait__wakes_on_enqueue_by_another_queue_object(
    open_queues: QueueFactory, clock: FakeClock
) -> None:
    scheduler, worker = open_queues(), open_queues()
    waiter = asyncio.create_task(worker.wait(600))
    await asyncio.wait_for(worker._listener.subscribed.wait(), SAFETY_TIMEOUT)
    await _settle()
    assert not waiter.done()
    await scheduler.enqueue([QueueItem("e1", _at(clock, 0), shard=5)])
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)  # the fake clock never moved: pub/sub woke it
    assert await worker.claim_due(10) == ["e1"]
    assert await scheduler.claim_due(10) == []


async def test_wait__not_woken_by_arrivals_due_after_its_target(
    open_queues: QueueFactory, clock: FakeClock
) -> None:
    scheduler, worker = open_queues(), open_queues()
    await scheduler.enqueue([QueueItem("soon", _at(clock, 10))])
    waiter = asyncio.create_task(worker.wait(600))
    await asyncio.wait_for(worker._listener.subscribed.wait(), SAFETY_TIMEOUT)
    await clock.until_sleeping()  # it planned: sleeps until "soon" is due
    await scheduler.enqueue([QueueItem("later", _at(clock, 3600))])
    await asyncio.sleep(0.2)  # real time for a publish that should not wake it
    assert not waiter.done()
    clock.advance(10)
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
    assert await worker.claim_due(10) == ["soon"]


async def test_wait__wakes_again_after_its_subscription_is_killed(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    scheduler, worker = open_queues(), open_queues()
    await asyncio.wait_for(worker.wait(0), SAFETY_TIMEOUT)  # subscribes
    name = f"onbeat-wake-{worker._instance}"
    ids = [c["id"] for c in await redis_client.client_list() if c["name"] == name]
    assert len(ids) == 1
    waiter = asyncio.create_task(worker.wait(600))
    await _settle()
    await redis_client.client_kill_filter(_id=ids[0])
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)  # a lost subscription wakes its waiters
    waiter = asyncio.create_task(worker.wait(600))
    await asyncio.wait_for(worker._listener.subscribed.wait(), SAFETY_TIMEOUT)
    await _settle()
    assert not waiter.done()
    await scheduler.enqueue([QueueItem("e1", _at(clock, 0))])
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)


@pytest.mark.parametrize("shards", [1, 64])
async def test_claim_due__two_queue_objects_racing_get_disjoint_sets(
    open_queues: QueueFactory, clock: FakeClock, shards: int
) -> None:
    ids = [f"e{i:04d}" for i in range(1000)]
    first, second = open_queues(), open_queues()
    await first.enqueue(
        [QueueItem(eid, _at(clock, -(i % 7)), i % 2, i % shards) for i, eid in enumerate(ids)]
    )

    async def drain(queue: RedisDelayQueue) -> list[str]:
        got: list[str] = []
        while batch := await queue.claim_due(25):
            got += batch
        return got

    claimers = [drain(queue) for queue in (first, second) for _ in range(4)]
    results = await asyncio.wait_for(asyncio.gather(*claimers), SAFETY_TIMEOUT * 3)
    claimed = [eid for got in results for eid in got]
    assert len(claimed) == len(set(claimed)) == len(ids)
    assert set(claimed) == set(ids)
    assert all(results), "both queue objects must have claimed some"
    assert await first.size() == await second.size() == 0


async def test_claim_due__goes_on_to_more_shards_when_a_racing_claim_emptied_its_first(
    open_queues: QueueFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two queue objects read the same earliest shards from the index; the other one empties
    two of them between this claim's index read and its shard round. The claim still returns
    its full limit from the next due shards rather than coming back short."""
    mine, other = open_queues(), open_queues()
    await mine.enqueue(
        [QueueItem(f"e{i}", _at(clock, -(8 - i)), shard=i) for i in range(8)]  # e0 earliest
    )
    real_round = mine._claim_round
    raced: list[str] = []

    async def other_claims_first(*args: Any) -> Any:
        if not raced:
            raced.extend(await other.claim_due(2))
        return await real_round(*args)

    monkeypatch.setattr(mine, "_claim_round", other_claims_first)
    got = await mine.claim_due(4)
    assert sorted(raced) == ["e0", "e1"]
    assert sorted(got) == ["e2", "e3", "e4", "e5"]
    assert sorted(await other.claim_due(10)) == ["e6", "e7"]


# -- lost data and a stale index ------------------------------------------------------------


async def test_flushdb__missing_reports_everything_and_the_queue_works_on(
    clock: FakeClock,
) -> None:
    base = re.sub(r"/\d*$", f"/{FLUSH_DB}", REDIS_TEST_URL)
    url, prefix = fresh_queue_url(base)
    queue = open_queue(url, clock)
    client = aioredis.Redis.from_url(base)
    try:
        ids = [f"e{i}" for i in range(500)]
        await queue.enqueue(
            [QueueItem(eid, _at(clock, 5), shard=i % 16) for i, eid in enumerate(ids)]
        )
        assert await queue.missing(ids) == []
        await client.flushdb()  # what a restart without persistence or FLUSHALL leaves
        assert await queue.missing(ids) == ids  # so the sweep re-enqueues every one
        assert await queue.size() == 0
        assert await queue.next_due_at() is None
        assert await queue.claim_due(10) == []
        await queue.enqueue([QueueItem(eid, _at(clock, 5), shard=3) for eid in ids])  # the sweep
        clock.advance(5)
        assert sorted(await queue.claim_due(1000)) == sorted(ids)
    finally:
        await queue.close()
        await drop_prefix(prefix, base)
        await client.aclose()


async def test_lost_data__a_flush_is_told_once_to_every_queue_object(clock: FakeClock) -> None:
    """Regression: a FLUSHALL left Redis up and empty, so no failover listener heard of it and
    the queued runs it held waited for the sweep's ``sweep_overdue`` (S5 of the fault suite)."""
    base = re.sub(r"/\d*$", f"/{FLUSH_DB}", REDIS_TEST_URL)
    url, prefix = fresh_queue_url(base)
    first, second = open_queue(url, clock), open_queue(url, clock)
    assert isinstance(first, RedisDelayQueue) and isinstance(second, RedisDelayQueue)
    client = aioredis.Redis.from_url(base)
    try:
        assert not await first.lost_data()  # the first call takes note
        assert not await second.lost_data()
        await first.enqueue([QueueItem("e1", _at(clock, 5))])
        assert not await first.lost_data() and not await second.lost_data()
        await client.flushdb()
        assert await first.lost_data()  # found the generation gone, and set a new one
        assert await second.lost_data()  # sees the new one: a loss all the same
        assert not await first.lost_data() and not await second.lost_data()
    finally:
        await first.close()
        await second.close()
        await drop_prefix(prefix, base)
        await client.aclose()


async def test_scripts_lost__loaded_again_and_the_call_runs_once(
    open_queues: QueueFactory, clock: FakeClock
) -> None:
    queue = open_queues()
    await queue.enqueue([QueueItem(f"e{i}", _at(clock, -1), shard=i) for i in range(3)])
    for script in queue._scripts.values():  # as after a restart: Redis knows none of them
        script.sha = "0" * 40
    assert sorted(await queue.claim_due(10)) == ["e0", "e1", "e2"]
    assert await queue.claim_due(10) == []


async def test_repair__finds_shards_the_index_lost(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    queue = open_queues()
    await queue.enqueue([QueueItem(f"e{i}", _at(clock, -1), i % 2, shard=i) for i in range(6)])
    index = [key for key in await _keys_of(redis_client, queue) if "{index}" in key]
    await redis_client.delete(*[key for key in index if ":due:" in key or key.endswith("tiers")])
    assert await queue.claim_due(10) == []  # the index no longer points at them
    await queue.repair()
    assert await queue.claim_due(10) == ["e1", "e3", "e5", "e0", "e2", "e4"]  # tier 1 first
    assert await queue.size() == 0


async def test_repair__with_shards_option_reads_unregistered_shards(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    queue = open_queues(shards=8)
    await queue.enqueue([QueueItem("e1", _at(clock, -1), shard=6)])
    await redis_client.delete(*[k for k in await _keys_of(redis_client, queue) if "{index}" in k])
    assert await queue.claim_due(10) == []
    await queue.repair()
    assert await queue.claim_due(10) == ["e1"]


async def test_wait__repairs_on_its_interval(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    queue = open_queues()
    await asyncio.wait_for(queue.wait(0), SAFETY_TIMEOUT)  # the first wait repairs at once
    await queue.enqueue([QueueItem("e1", _at(clock, -1), shard=2)])
    await redis_client.delete(f"{queue._keys.prefix}:{{index}}:due:0")
    assert await queue.claim_due(10) == []
    clock.advance(10)  # REPAIR_INTERVAL
    await asyncio.wait_for(queue.wait(0), SAFETY_TIMEOUT)
    assert await queue.claim_due(10) == ["e1"]


async def test_index_early__a_claim_corrects_it_and_wait_sleeps_again(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    # A writer that died after lowering the index but before writing its ids leaves the
    # index early: waiters wake, the next claim finds the truth and corrects the index.
    queue = open_queues()
    await asyncio.wait_for(queue.wait(0), SAFETY_TIMEOUT)  # its first repair pass, done
    await queue.enqueue([QueueItem("e1", _at(clock, 60), shard=4)])
    await redis_client.zadd(f"{queue._keys.prefix}:{{index}}:due:0", {"4": 0})
    early = await queue.next_due_at()
    assert early is not None and early < clock.now()
    await asyncio.wait_for(queue.wait(600), SAFETY_TIMEOUT)  # returns at once: "due"
    assert await queue.claim_due(10) == []
    assert await queue.next_due_at() == _at(clock, 60)
    waiter = asyncio.create_task(queue.wait(600))
    await clock.until_sleeping()
    assert not waiter.done()
    clock.advance(60)
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)
    assert await queue.claim_due(10) == ["e1"]


async def test_claim_due__hands_out_what_it_claimed_when_redis_drops_after(
    open_queues: QueueFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = open_queues()
    await queue.enqueue([QueueItem("e1", _at(clock, -1), shard=1)])
    real_run = queue._scripts.run
    index_update = queue._scripts["index_update"]

    async def drop_before_index_update(calls: Sequence[Call]) -> list[Any]:
        if any(call.script is index_update for call in calls):
            raise RedisConnectionError("Connection reset by peer")
        return await real_run(calls)

    monkeypatch.setattr(queue._scripts, "run", drop_before_index_update)
    assert await queue.claim_due(10) == ["e1"]  # it left Redis: better run than swept later
    monkeypatch.undo()
    assert await queue.missing(["e1"]) == ["e1"]
    assert await queue.claim_due(10) == []  # the index was early: this claim corrects it
    assert await queue.next_due_at() is None
    # An enqueue that wrote its ids but not its index update says so (the caller retries; it
    # is idempotent) and leaves the index early, so the ids are found all the same.
    monkeypatch.setattr(queue._scripts, "run", drop_before_index_update)
    with pytest.raises(QueueUnavailableError):
        await queue.enqueue([QueueItem("e2", _at(clock, -1), shard=6)])
    monkeypatch.undo()
    assert await queue.claim_due(10) == ["e2"]


# -- layout ---------------------------------------------------------------------------------


async def test_keys__hash_tagged_so_each_script_stays_in_one_slot(
    open_queues: QueueFactory, clock: FakeClock, redis_client: aioredis.Redis
) -> None:
    queue = open_queues()
    shards = [0, 7, 1023]
    await queue.enqueue(
        [QueueItem(f"e{s}-{p}", _at(clock, 5), p, s) for s in shards for p in (0, 3)]
    )
    keys = await _keys_of(redis_client, queue)
    tag = re.compile(r"^[^{}]+:\{([^{}]+)\}:[^{}]+$")
    by_tag: dict[str, set[int]] = {}
    for key in keys:
        match = tag.match(key)
        assert match, f"{key} has no single hash tag"
        by_tag.setdefault(match.group(1), set()).add(key_slot(key.encode()))
    assert {t for t in by_tag if t.isdigit()} == {str(s) for s in shards}
    assert "index" in by_tag
    for name, slots in by_tag.items():
        assert slots == {key_slot(name.encode())}, f"keys tagged {{{name}}} span slots {slots}"
    for shard in shards:  # every per-tier sorted set sits with its shard's other keys
        assert f"{queue._keys.prefix}:{{{shard}}}:due:3" in keys


# -- unreachable ----------------------------------------------------------------------------


async def test_unreachable__one_line_error_naming_the_url_without_password(
    clock: FakeClock,
) -> None:
    queue = open_queue("redis://user:s3cret@127.0.0.1:1/0?prefix=nowhere", clock)
    try:
        for call in (
            queue.enqueue([QueueItem("e1", _at(clock, 0))]),
            queue.claim_due(10),
            queue.missing(["e1"]),
            queue.size(),
            queue.wait(1),
        ):
            with pytest.raises(QueueUnavailableError) as caught:
                await asyncio.wait_for(call, SAFETY_TIMEOUT)
            message = str(caught.value)
            assert message.startswith("cannot reach the delay queue at redis://127.0.0.1:1/0")
            assert "\n" not in message and "s3cret" not in message
    finally:
        await queue.close()


def test_open_queue__refuses_bad_options(clock: FakeClock) -> None:
    for url in (
        "redis://127.0.0.1:6379/0?shards=many",
        "redis://127.0.0.1:6379/0?shards=-1",
        "redis://127.0.0.1:6379/0?prefix=a{b}",
    ):
        with pytest.raises(ValueError, match="queue_url"):
            open_queue(url, clock)
