"""The table delay queue across processes' worth of connections, on PostgreSQL and SQLite.

Two queue objects on one table stand for two processes: they share nothing but the database.
The clock is a FakeClock that these tests never move unless they say so, so a ``wait(10)`` that
returns was woken by the other queue's enqueue (NOTIFY, or SQLite's poll), never by its timeout.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from onbeat import App, ExecutionStatus, TaskContext
from onbeat.errors import QueueUnavailableError, ValidationError
from onbeat.queue import open_queue
from onbeat.queue.base import QueueItem
from onbeat.queue.table import TableDelayQueue, from_micros, open_table_queue, to_micros
from onbeat.queue.table_postgres import PostgresQueueDriver
from onbeat.queue.table_sqlite import SQLiteQueueDriver
from onbeat.scheduler import Scheduler
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import fresh_schema
from onbeat.worker import Worker
from tests.queue_backends import POSTGRES_URL, fresh_queue_url

SAFETY_TIMEOUT = 10.0
"""Real seconds before a test that should already have finished is declared hung."""

OpenQueue = Callable[[], TableDelayQueue]

drivers = pytest.mark.parametrize(
    "driver",
    [
        pytest.param("postgres", marks=pytest.mark.external_service),
        pytest.param("sqlite"),
    ],
)


@pytest.fixture
async def table_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    async with fresh_queue_url(request.node.callspec.params["driver"], tmp_path) as url:
        yield url


@pytest.fixture
async def open_table(table_url: str, clock: FakeClock) -> AsyncIterator[OpenQueue]:
    """Opens queue objects on the test's table; all are closed at the end."""
    async with AsyncExitStack() as stack:

        def open_one() -> TableDelayQueue:
            queue = open_queue(table_url, clock)
            assert isinstance(queue, TableDelayQueue)
            stack.push_async_callback(queue.close)
            return queue

        yield open_one


@drivers
async def test_wait__woken_by_another_queue_objects_enqueue(
    driver: str, open_table: OpenQueue, clock: FakeClock
) -> None:
    waiting, enqueuing = open_table(), open_table()
    await enqueuing.open()
    waiter = asyncio.create_task(waiting.wait(10))
    await asyncio.wait_for(clock.until_sleeping(1), SAFETY_TIMEOUT)  # it read an empty table
    started = clock.monotonic()

    await enqueuing.enqueue([QueueItem("e1", clock.now())])
    await asyncio.wait_for(waiter, SAFETY_TIMEOUT)

    assert clock.monotonic() == started, "woken by the enqueue, not by its timeout"
    assert await waiting.claim_due(10) == ["e1"]
    assert await enqueuing.size() == 0


@drivers
async def test_claim_due__two_claimers_race_disjoint_and_complete(
    driver: str, open_table: OpenQueue, clock: FakeClock
) -> None:
    first, second = open_table(), open_table()
    ids = [f"e{i:04d}" for i in range(1000)]
    await first.enqueue(
        [
            QueueItem(eid, clock.now() - timedelta(seconds=i % 13), i % 3)
            for i, eid in enumerate(ids)
        ]
    )
    await second.open()
    start = asyncio.Event()

    async def drain(queue: TableDelayQueue) -> list[str]:
        await start.wait()
        got: list[str] = []
        while batch := await queue.claim_due(7):
            got.extend(batch)
        return got

    racers = asyncio.gather(drain(first), drain(second))
    start.set()
    by_first, by_second = await asyncio.wait_for(racers, SAFETY_TIMEOUT * 3)

    assert not set(by_first) & set(by_second)
    assert sorted(by_first + by_second) == ids
    assert len(by_first) == len(set(by_first)) and len(by_second) == len(set(by_second))
    assert await first.size() == 0


@drivers
async def test_engine__scheduler_and_two_workers_share_the_table(
    driver: str, open_table: OpenQueue, clock: FakeClock, tmp_path: Path
) -> None:
    """The scheduler enqueues through one queue object, two workers claim through their own."""
    app = App(f"sqlite:///{tmp_path / 'onbeat.db'}", clock=clock, shards=4)
    ran: list[str] = []

    @app.task(name="record")
    def record(ctx: TaskContext) -> None:
        ran.append(ctx.execution_id)

    try:
        scheduler = Scheduler(app.store, open_table(), app.settings, clock)
        workers = [
            Worker(app.store, open_table(), app.registry, app.settings, clock) for _ in range(2)
        ]
        jobs = [app.schedule("record") for _ in range(60)]
        await scheduler.renew_shards()
        await scheduler.dispatch()
        await asyncio.wait_for(
            asyncio.gather(*(worker.run_until_idle() for worker in workers)), SAFETY_TIMEOUT
        )
        executions = [e for job in jobs for e in app.list_executions(job.id)]
        assert sorted(ran) == sorted(e.id for e in executions)
        assert {e.status for e in executions} == {ExecutionStatus.SUCCEEDED}
        assert sum(worker.stats.started for worker in workers) == len(jobs)
    finally:
        app.close()


@drivers
async def test_enqueue__any_string_id_round_trips(
    driver: str, open_table: OpenQueue, clock: FakeClock
) -> None:
    ids = ['quote"d', "back\\slash", "com,ma", "{braces}", " spaced ", "NULL", "", "ünïcödé", "'"]
    queue = open_table()
    await queue.enqueue([QueueItem(eid, clock.now()) for eid in ids])
    assert await queue.missing([*ids, "absent"]) == ["absent"]
    await queue.remove([ids[0]])
    assert sorted(await queue.claim_due(100)) == sorted(ids[1:])


@drivers
async def test_enqueue__stores_shard_and_microseconds(
    driver: str, table_url: str, open_table: OpenQueue, clock: FakeClock
) -> None:
    due = clock.now() + timedelta(microseconds=123_457)
    queue = open_table()
    await queue.enqueue([QueueItem("e1", due, priority=4, shard=1017)])
    table = table_url.rsplit("table=", 1)[1]
    if driver == "postgres":
        query = sql.SQL("SELECT execution_id, shard, priority, due_at FROM {}")
        async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
            cur = await conn.execute(query.format(sql.Identifier(table)))
            rows: list[tuple[object, ...]] = await cur.fetchall()
    else:
        path = table_url.removeprefix("sqlite:///").split("?")[0]
        lite = sqlite3.connect(path)
        try:
            rows = lite.execute(
                f"SELECT execution_id, shard, priority, due_at FROM {table}"
            ).fetchall()
        finally:
            lite.close()
    assert rows == [("e1", 1017, 4, to_micros(due))]
    assert from_micros(to_micros(due)) == due


async def test_listen__lost_connection_wakes_waiters_and_comes_back(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with fresh_queue_url("postgres", tmp_path) as url:
        waiting, enqueuing = open_queue(url, clock), open_queue(url, clock)
        try:
            await enqueuing.enqueue([QueueItem("far", clock.now() + timedelta(hours=1))])
            first = asyncio.create_task(waiting.wait(60))
            await asyncio.wait_for(clock.until_sleeping(1), SAFETY_TIMEOUT)
            await _terminate_backends(url, "LISTEN%")
            # Notifications may have been missed: every waiter looks at the table again.
            await asyncio.wait_for(first, SAFETY_TIMEOUT)

            again = asyncio.create_task(waiting.wait(60))
            # The listener's retry pause and the waiter both sleep on the clock.
            await asyncio.wait_for(clock.until_sleeping(2), SAFETY_TIMEOUT)
            clock.advance(0.05)  # the first retry: listening again wakes everyone once more
            await asyncio.wait_for(again, SAFETY_TIMEOUT)

            last = asyncio.create_task(waiting.wait(60))
            await asyncio.wait_for(clock.until_sleeping(1), SAFETY_TIMEOUT)
            await enqueuing.enqueue([QueueItem("now", clock.now())])
            await asyncio.wait_for(last, SAFETY_TIMEOUT)  # by NOTIFY on the new connection
            assert not last.cancelled()
        finally:
            await waiting.close()
            await enqueuing.close()


async def test_pool__dropped_connections_cost_no_call_but_a_claim(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Regression (fault suite N1): the server closed the pool's idle connections (here
    ``pg_terminate_backend``; a restart alike) and each sweep pass failed on one of them, backing
    the sweep off. Every call that may run twice now checks the pool and goes through; a claim
    (not run twice: it hands ids out) may fail once, in one line."""
    async with fresh_queue_url("postgres", tmp_path) as url:
        queue = open_queue(url, clock)
        try:
            await queue.enqueue([QueueItem("e1", clock.now()), QueueItem("e2", clock.now())])
            busy = [asyncio.create_task(queue.size()) for _ in range(4)]  # several pooled
            await asyncio.gather(*busy)
            for call in (
                queue.size, lambda: queue.missing(["e1", "gone"]), queue.next_due_at,
                lambda: queue.enqueue([QueueItem("e3", clock.now())]), lambda: queue.remove(["e3"]),
            ):  # fmt: skip
                await _terminate_backends(url, "%")
                await call()
            assert await queue.missing(["e1", "e3"]) == ["e3"]
            await _terminate_backends(url, "%")
            try:
                claimed = await queue.claim_due(10)
            except QueueUnavailableError as exc:
                assert "\n" not in str(exc)
                claimed = await queue.claim_due(10)
            assert sorted(claimed) == ["e1", "e2"]
        finally:
            await queue.close()


async def test_open__unreachable_postgres_is_one_clear_line(clock: FakeClock) -> None:
    queue = open_table_queue("postgresql://onbeat:secret@127.0.0.1:1/nowhere?table=q", clock)
    with pytest.raises(QueueUnavailableError) as caught:
        await queue.open()
    message = str(caught.value)
    assert message.startswith("queue postgresql://onbeat:***@127.0.0.1:1/nowhere?table=q: ")
    assert "refused" in message
    assert "\n" not in message and "secret" not in message
    await queue.close()


async def test_open__libpq_parameters_reach_the_server_as_written(clock: FakeClock) -> None:
    """``options`` with two settings, space-separated (as ``onbeat.testing.postgres`` writes
    them): the queue's table lands in the search_path's schema. Re-encoding the query once made
    the space a "+", which libpq keeps, so the search_path named no schema."""
    with fresh_schema() as url:
        queue = open_queue(f"{url}&table=q", clock)
        try:
            await queue.enqueue([QueueItem("e1", clock.now())])
            assert await queue.claim_due(1) == ["e1"]
        finally:
            await queue.close()
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT to_regclass('q') IS NOT NULL, to_regclass('public.q')"
            ).fetchone()
        assert row == (True, None)


async def test_open__unopenable_sqlite_file_is_one_clear_line(
    tmp_path: Path, clock: FakeClock
) -> None:
    queue = open_queue(f"sqlite:///{tmp_path}/no/such/dir/queue.db", clock)
    with pytest.raises(QueueUnavailableError, match=r"^queue sqlite:///.*: cannot open: "):
        await queue.wait(1)
    await queue.close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://h/db?table=Bad-Name", "table 'Bad-Name'"),
        ("sqlite:///q.db?table=x;drop", "table 'x;drop'"),
        ("sqlite:///q.db?poll=1", "unknown parameters"),
        ("sqlite://relative-without-third-slash.db", "unsupported URL"),
    ],
)
def test_open_table_queue__refuses_bad_urls(url: str, problem: str, clock: FakeClock) -> None:
    with pytest.raises(ValidationError, match="queue_url") as caught:
        open_table_queue(url, clock)
    assert problem in str(caught.value)


async def test_close__then_calls_refused_and_wait_returns(tmp_path: Path, clock: FakeClock) -> None:
    queue = open_queue(f"sqlite:///{tmp_path}/q.db", clock)
    await queue.enqueue([QueueItem("e1", clock.now())])
    await queue.close()
    await queue.wait(60)  # returns at once, the clock never moved
    with pytest.raises(RuntimeError, match="closed"):
        await queue.claim_due(1)


async def _terminate_backends(url: str, query_like: str) -> None:
    """Kill the server side of the queue's connections whose current query matches."""
    table = url.rsplit("table=", 1)[1]
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND query LIKE %s",
            [f"onbeat-queue:{table}", query_like],
        )
        row = await cur.fetchone()
    assert row is not None and row[0] >= 1, "no connection of the queue to terminate"


@drivers
async def test_claim__reads_the_due_rows_not_those_queued_ahead(
    driver: str, open_table: OpenQueue, clock: FakeClock
) -> None:
    """A claim costs the same with 2,000 or 20,000 rows queued ahead of their time (runs sit in
    the table for up to `window` before it). One scan of the claim index filtered on due_at read
    every future row whenever fewer rows than the limit were due (PostgreSQL: 39 -> 305 buffers
    here, 8 ms a claim at 100,000). The cost is PostgreSQL's buffers under EXPLAIN ANALYZE
    (rolled back) or SQLite's virtual machine steps. Due times a millisecond apart: equal keys
    are deduplicated in PostgreSQL's index, which hides the cost."""
    queue = open_table()
    due = [QueueItem(f"due-{i}", clock.now() - timedelta(seconds=i), priority=i) for i in range(3)]
    measure = _claim_buffers if driver == "postgres" else _claim_steps
    costs, queued = [], 0
    for size in (2_000, 20_000):
        ahead = [
            QueueItem(
                f"ahead-{i}", clock.now() + timedelta(seconds=1, milliseconds=i), priority=i % 2
            )
            for i in range(queued, size)
        ]
        await queue.enqueue([*ahead, *due])
        queued = size
        costs.append(await measure(queue, to_micros(clock.now())))
    assert costs[1] < 2 * costs[0], costs
    await queue.enqueue(due)  # SQLite's measure claimed them
    assert await queue.claim_due(100) == ["due-2", "due-1", "due-0"]
    assert await queue.size() == 20_000


async def _claim_buffers(queue: TableDelayQueue, now: int) -> int:
    """The buffers a claim of 100 touches, explained in a transaction rolled back."""
    driver = queue._driver
    assert isinstance(driver, PostgresQueueDriver)
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + driver._sql["claim"]
    connecting = psycopg.AsyncConnection.connect(POSTGRES_URL)
    async with await connecting as conn, conn.transaction(force_rollback=True):
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(driver._table)))
        row = await (await conn.execute(explain, {"now": now, "limit": 100})).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    assert plan["Actual Rows"] == 3
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def _claim_steps(queue: TableDelayQueue, now: int) -> int:
    """SQLite's virtual machine steps (in tens) of a claim of 100, which takes the due rows."""
    driver = queue._driver
    assert isinstance(driver, SQLiteQueueDriver) and driver._conn is not None
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    driver._conn.set_progress_handler(count, 10)
    try:
        claimed = await driver.claim(now, 100)
    finally:
        driver._conn.set_progress_handler(None, 10)
    assert claimed == ["due-2", "due-1", "due-0"]
    return steps
