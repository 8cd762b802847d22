"""What task code can do to the worker: raise anything, hang past its timeout, return too much.
None of it may stop, starve or bloat the node."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, cast

import pytest

from onbeat import AttemptOutcome, ExecutionStatus, TaskContext
from onbeat.errors import ValidationError
from onbeat.model import Execution
from onbeat.queue.base import DelayQueue, QueueItem
from onbeat.store.base import ClaimResult
from onbeat.worker import Worker
from onbeat.worker.results import MAX_RESULT_BYTES, RESULT_PREVIEW_CHARS
from tests.integration.conftest import Node
from tests.unit import pool_tasks
from tests.unit.pool_children import pool_processes

ABORTS: list[Callable[[], BaseException]] = [
    lambda: SystemExit(3),
    lambda: KeyboardInterrupt(),
    lambda: GeneratorExit(),
    lambda: asyncio.CancelledError("task code's own"),
]


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["no-timeout", "timeout"])
@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize(
    "abort", ABORTS, ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit", "CancelledError"]
)
async def test_worker__task_raising_a_base_exception_is_a_failed_attempt(
    node: Node, abort: Callable[[], BaseException], is_async: bool, timeout: float | None
) -> None:
    """SystemExit & co. from task code neither stop the node nor loop forever: each is a failed
    attempt, and the last one dead-letters the run."""
    if is_async:

        async def raises(ctx: TaskContext) -> None:
            raise abort()

        node.app.task(name="abort")(raises)
    else:

        def raises_sync(ctx: TaskContext) -> None:
            raise abort()

        node.app.task(name="abort")(raises_sync)
    job = node.app.schedule("abort", max_attempts=2, backoff=0, timeout=timeout)
    await node.step()
    await node.step()
    execution = node.execution(job.id)
    expected = type(abort()).__name__
    assert execution.status is ExecutionStatus.FAILED
    assert [a.outcome for a in execution.attempts] == [AttemptOutcome.FAILED] * 2
    assert execution.last_error is not None
    assert execution.last_error.startswith(expected)
    assert "task code cannot stop the worker" in execution.last_error
    [dead] = node.app.list_dead_letters()
    assert dead.execution_id == execution.id


@pytest.fixture
def hang_release() -> Iterator[threading.Event]:
    """Set at the end of the test, so hung task threads finish."""
    release = threading.Event()
    yield release
    release.set()


async def test_worker__sync_task_past_its_timeout_does_not_hold_a_thread_others_wait_for(
    node: Node, hang_release: threading.Event
) -> None:
    """Two sync runs hang past their timeout with concurrency 2: both time out, their threads are
    abandoned (counted), and the next run starts at once instead of waiting for a thread."""
    node.app.settings.concurrency = 2
    started = threading.Semaphore(0)

    @node.app.task(name="hang", max_attempts=1, timeout=1)
    def hang(ctx: TaskContext) -> None:
        started.release()
        hang_release.wait()

    hung = [node.app.schedule("hang") for _ in range(2)]
    await node.dispatch()
    worker = node.new_worker()
    assert await worker.claim_once() == 2
    for _ in hung:
        assert await asyncio.to_thread(started.acquire, True, 5)
    await asyncio.wait_for(node.clock.until_sleeping(2), 5)  # both timeouts are ticking
    node.clock.advance(1)
    await asyncio.wait_for(worker.run_until_idle(), 5)
    for job in hung:
        execution = node.execution(job.id)
        assert execution.status is ExecutionStatus.FAILED
        assert [a.outcome for a in execution.attempts] == [AttemptOutcome.TIMED_OUT]

    after = node.app.schedule("record", {"after": "timeouts"})
    await node.scheduler.dispatch()
    await asyncio.wait_for(worker.run_until_idle(), 5)
    assert node.execution(after.id).status is ExecutionStatus.SUCCEEDED
    assert worker.stats.threads_abandoned == 2
    assert not hang_release.is_set()  # the hung threads were still running all along


async def test_worker__sync_tasks_run_in_daemon_threads(node: Node) -> None:
    """Process exit must never wait for task code (Ctrl-C with a hung sync task)."""
    seen: list[tuple[str, bool]] = []

    @node.app.task(name="where")
    def where(ctx: TaskContext) -> None:
        thread = threading.current_thread()
        seen.append((thread.name, thread.daemon))

    job = node.app.schedule("where")
    await node.step()
    execution = node.execution(job.id)
    assert seen == [(f"onbeat-run-{execution.id}", True)]


@pytest.mark.parametrize(
    "value",
    [
        "x" * (MAX_RESULT_BYTES + 1),
        {"rows": list(range(MAX_RESULT_BYTES))},
        {b"not json"} | {bytes(MAX_RESULT_BYTES)},
    ],
    ids=["string", "json", "repr"],
)
async def test_worker__oversized_return_value_is_stored_truncated(node: Node, value: Any) -> None:
    @node.app.task(name="big")
    def big(ctx: TaskContext) -> Any:
        return value

    job = node.app.schedule("big")
    await node.step()
    execution = node.execution(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    result = execution.result
    assert isinstance(result, dict)
    assert result["truncated"] is True
    assert result["bytes"] > MAX_RESULT_BYTES
    assert len(result["preview"]) == RESULT_PREVIEW_CHARS
    assert set(result) == {"truncated", "bytes", "preview"}


async def test_worker__return_value_under_the_cap_is_stored_as_is(node: Node) -> None:
    value = {"rows": ["y" * 100] * 100}

    @node.app.task(name="fits")
    def fits(ctx: TaskContext) -> Any:
        return value

    job = node.app.schedule("fits")
    await node.step()
    assert node.execution(job.id).result == value


async def test_worker__watchdog_names_the_run_that_blocks_the_event_loop(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """An async task that blocks the loop is named in a warning (and counted) while it blocks."""
    node.app.settings.loop_stall_warning = 0.2
    blocked, answered = threading.Event(), threading.Event()

    class Signals(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("event loop blocked"):
                blocked.set()
            elif message.startswith("event loop answered again"):
                answered.set()

    @node.app.task(name="hog")
    async def hog(ctx: TaskContext) -> None:
        blocked.wait(5)  # blocks the event loop until the watchdog has named this run

    signals = Signals()
    logging.getLogger("onbeat.worker").addHandler(signals)
    worker = node.new_worker()
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        job = node.app.schedule("hog")
        await node.dispatch()
        assert await asyncio.to_thread(answered.wait, 5)
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
        logging.getLogger("onbeat.worker").removeHandler(signals)
    execution = node.execution(job.id)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert f"event loop blocked for over 0.2s by run {execution.id} (task hog)" in caplog.text
    assert f"blocked by run {execution.id} (task hog)" in caplog.text
    assert worker.stats.loop_stalls == 1


async def test_worker__runs_claimed_behind_a_task_that_blocks_the_loop_are_handed_back(
    node: Node,
) -> None:
    """An async task that blocks the loop does not hold the runs claimed with it until it lets
    go: the watchdog's thread releases the ones the loop has not begun (due again at once, the
    attempt not counted), so another worker can start them meanwhile; the loop, once free,
    does not run them too. The hand-back does not wait for the stall warning: task code seen
    holding the loop is handed back for a quarter second into the block."""
    node.app.settings.loop_stall_warning = 60.0
    handed_back, let_go = threading.Event(), threading.Event()
    ran: list[str] = []

    class Signals(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "handed back" in record.getMessage():
                handed_back.set()

    @node.app.task(name="hog")
    async def hog(ctx: TaskContext) -> None:
        let_go.wait(10)  # blocks the event loop

    node.app.task(name="noop")(lambda ctx: ran.append(ctx.execution_id))
    now = node.clock.now()
    hog_job = node.app.schedule("hog", at=now - timedelta(seconds=2))  # claimed, begun first
    noop_job = node.app.schedule("noop", at=now - timedelta(seconds=1))
    await node.dispatch()
    signals = Signals()
    logging.getLogger("onbeat.worker").addHandler(signals)
    worker = node.new_worker()
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))

    def while_the_loop_is_blocked() -> Execution:
        assert handed_back.wait(5), "the unstarted run was not handed back"
        try:
            return node.execution(noop_job.id)
        finally:
            let_go.set()

    try:
        released = await asyncio.to_thread(while_the_loop_is_blocked)
    finally:
        let_go.set()
        stop.set()
        await asyncio.wait_for(running, 5)
        logging.getLogger("onbeat.worker").removeHandler(signals)
    assert released.status is ExecutionStatus.SCHEDULED
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]
    assert (worker.stats.handed_back, worker.stats.started) == (1, 1)  # started: the hog only
    assert worker.stats.loop_stalls == 0  # handed back long before a warning
    assert ran == []  # the freed loop skipped it
    await node.step()  # another worker (the node's) starts it
    done = node.execution(noop_job.id)
    assert (done.status, done.attempt) == (ExecutionStatus.SUCCEEDED, 1)
    assert ran == [done.id]
    assert node.execution(hog_job.id).status is ExecutionStatus.SUCCEEDED


async def test_worker__ids_handed_out_before_a_task_blocks_the_loop_are_requeued(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue hands a claim its ids, then a task blocks the loop before the claim reaches
    the store (the fault suite's S2 saw 40 runs wait 3 s for the sweep so): the watchdog
    requeues them in the store, the next dispatch queues them for any worker, and the loop,
    once free, does not claim them."""
    ran: list[str] = []
    node.app.task(name="noop")(lambda ctx: ran.append(ctx.execution_id))
    job = node.app.schedule("noop")
    await node.dispatch()
    worker = node.worker
    real_claim_due = worker.queue.claim_due

    async def claim_due(limit: int, ahead: float = 0.0) -> list[str]:
        if ahead:  # a claim's second look (due soon): the first one's ids are in hand
            worker._hand_back_unstarted()  # what the watchdog's thread does while a task blocks
            return []
        return await real_claim_due(limit, ahead)

    monkeypatch.setattr(worker.queue, "claim_due", claim_due)
    assert (await worker._claim())[:2] == (1, 0)  # left the queue, not started here
    requeued = node.execution(job.id)
    assert (requeued.status, requeued.attempts) == (ExecutionStatus.SCHEDULED, ())
    assert worker.stats.handed_back == 1
    monkeypatch.undo()
    await node.step()
    done = node.execution(job.id)
    assert (done.status, done.attempt) == (ExecutionStatus.SUCCEEDED, 1)
    assert ran == [done.id]


async def test_worker__a_claims_answer_due_while_a_task_blocks_the_loop_is_requeued(
    node: Node,
) -> None:
    """The queue answers a claim while a task blocks the loop (the fault suite's S2 saw runs
    wait 3.3-3.8 s for the sweep so, their ids unread in the blocked worker's socket): the
    claim thread reads the answer and puts the ids in hand, and the watchdog requeues them in
    the store while the block lasts, for any worker to start. The loop, once free, skips them."""
    ran: list[str] = []
    seen_while_blocked: list[ExecutionStatus] = []
    blocked = threading.Event()

    @node.app.task(name="hog")
    async def hog(ctx: TaskContext) -> None:
        blocked.set()
        deadline = time.monotonic() + 10
        status = node.execution(noop_job.id).status
        while status is ExecutionStatus.QUEUED and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251 -- blocks the loop while it watches the store
            status = node.execution(noop_job.id).status
        seen_while_blocked.append(status)

    node.app.task(name="noop")(lambda ctx: ran.append(ctx.execution_id))
    now = node.clock.now()
    hog_job = node.app.schedule("hog", at=now - timedelta(seconds=2))
    noop_job = node.app.schedule("noop", at=now - timedelta(seconds=1))
    await node.dispatch()
    hog_id, noop_id = node.execution(hog_job.id).id, node.execution(noop_job.id).id

    class AnswersOnceTheLoopIsBlocked:
        """The queue the claim thread claims from: the hog's run first, then the noop's, once
        the hog blocks the worker's loop."""

        def __init__(self) -> None:
            self.handed_out: list[str] = []

        async def claim_due(self, limit: int, ahead: float = 0.0) -> list[str]:
            if ahead or len(self.handed_out) == 2:
                return []
            if self.handed_out:
                await asyncio.to_thread(blocked.wait, 10)
            self.handed_out.append(noop_id if self.handed_out else hog_id)
            return self.handed_out[-1:]

        async def close(self) -> None:
            pass

    worker = Worker(
        node.app.store,
        node.queue,
        node.app.registry,
        node.app.settings,
        node.clock,
        claim_queue=lambda: cast(DelayQueue, AnswersOnceTheLoopIsBlocked()),
    )
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        while not seen_while_blocked:  # noqa: ASYNC110 -- the hog's own thread of control
            await asyncio.sleep(0.01)
    finally:
        blocked.set()
        stop.set()
        await asyncio.wait_for(running, 10)
    assert seen_while_blocked == [ExecutionStatus.SCHEDULED]  # requeued during the block
    assert (worker.stats.handed_back, worker.stats.started) == (1, 1)  # started: the hog only
    assert ran == []
    await node.step()  # another worker (the node's) starts it
    done = node.execution(noop_job.id)
    assert (done.status, done.attempt) == (ExecutionStatus.SUCCEEDED, 1)
    assert ran == [done.id]


async def test_worker__runs_given_back_not_due_are_requeued_if_the_loop_blocks_first(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's runs the store finds not due yet stay in hand until they are back in the
    queue: a task blocking the loop before that enqueue is sent gets them requeued in the
    store by the watchdog (for the dispatch to queue), not held for the length of the block;
    the enqueue then skips them."""
    node.app.task(name="noop")(lambda ctx: None)
    job = node.app.schedule("noop", at=node.clock.now() + timedelta(seconds=3))
    await node.dispatch()
    run = node.execution(job.id)
    assert run.status is ExecutionStatus.QUEUED
    await node.queue.enqueue([QueueItem(run.id, node.clock.now())])  # handed out early
    worker = node.worker
    real_claim, real_enqueue = worker._claim_leases, worker.queue.enqueue
    sent: list[list[str]] = []

    def claim_leases(ids: list[str], free: int, room: int) -> ClaimResult:
        claim = real_claim(ids, free, room)
        worker._hand_back_unstarted()  # the watchdog's thread, as a task blocks the loop
        return claim

    async def enqueue(items: Sequence[QueueItem]) -> None:
        sent.append([item.execution_id for item in items])
        await real_enqueue(items)

    monkeypatch.setattr(worker, "_claim_leases", claim_leases)
    monkeypatch.setattr(worker.queue, "enqueue", enqueue)
    assert (await worker._claim(ahead=False))[:2] == (0, 0)  # not due: back to the queue
    assert sent == []  # requeued in the store instead
    requeued = node.execution(job.id)
    assert (requeued.status, requeued.attempts) == (ExecutionStatus.SCHEDULED, ())
    assert worker.stats.handed_back == 1
    monkeypatch.undo()
    await node.step(advance=3)
    assert node.execution(job.id).status is ExecutionStatus.SUCCEEDED


async def test_worker__task_pool_processes_runs_in_a_child_whatever_the_worker_pool(
    node: Node,
) -> None:
    """A task that may hold the GIL, crash or balloon asks for a child process by itself; the
    worker's other sync tasks stay in its threads."""
    node.app.task(name="in_child", pool="processes")(pool_tasks.pid)
    node.app.task(name="in_thread")(pool_tasks.pid)
    in_child = node.app.schedule("in_child")
    in_thread = node.app.schedule("in_thread")
    try:
        await node.step()
    finally:
        await node.worker.shutdown()  # the pool's child must not outlive the test
    assert node.execution(in_thread.id).result == os.getpid()
    child = node.execution(in_child.id)
    assert child.status is ExecutionStatus.SUCCEEDED
    assert isinstance(child.result, int) and child.result != os.getpid()


async def test_worker__with_a_process_task_starts_its_first_child_as_it_starts(node: Node) -> None:
    """The fork server's boot (a few hundred ms, seconds on a loaded box) is paid when the worker
    starts, not by the first run in a process; shutdown leaves no child behind."""
    node.app.task(name="in_child", pool="processes")(pool_tasks.pid)
    stop = asyncio.Event()
    running = asyncio.create_task(node.worker.run(stop))
    deadline = time.monotonic() + 10
    while not pool_processes() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # an outside process starting: no event to wait on
    warmed = pool_processes()
    stop.set()
    await running
    assert len(warmed) == 1
    assert pool_processes() == set()


@pytest.mark.parametrize(
    ("pool", "fn", "error"),
    [
        ("processes", pool_tasks.async_double, "an async def task runs on the event loop"),
        ("greenlets", pool_tasks.pid, "must be 'threads' or 'processes'"),
    ],
)
def test_task_pool__refused_where_it_cannot_hold(
    node: Node, pool: Any, fn: Callable[..., Any], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        node.app.task(name="bad_pool", pool=pool)(fn)
    assert "bad_pool" not in node.app.registry


async def test_worker__runs_claimed_while_a_task_blocks_the_loop_keep_their_leases(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that commits while a task blocks the event loop (``time.sleep`` in an ``async
    def``): the heartbeat renews the new leases before the loop can start the runs, so they are
    not reaped and run twice elsewhere. (The fault suite's S2 found them expiring.)"""
    node.app.task(name="noop")(lambda ctx: None)
    job = node.app.schedule("noop")
    await node.dispatch()
    claim_began, committed = threading.Event(), threading.Event()
    real_claim = node.app.store.execution_claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        claim_began.set()
        result = real_claim(*args, **kwargs)
        committed.set()
        return result

    monkeypatch.setattr(node.app.store, "execution_claim", claim)
    claiming = asyncio.create_task(node.worker.claim_once())
    assert await asyncio.to_thread(claim_began.wait, 5)
    assert committed.wait(5)  # from here on the loop is blocked, as by a task's time.sleep
    [execution] = node.app.list_executions(job.id)
    deadline = time.monotonic() + 5
    while execution.id not in node.worker._leases_due(math.inf) and time.monotonic() < deadline:
        time.sleep(0.001)  # noqa: ASYNC251  (the loop stays blocked on purpose)
    node.clock.advance(8)  # lease_ttl is 10 s
    assert node.worker._heartbeat.beat() == {}  # what the heartbeat thread does meanwhile
    node.clock.advance(8)  # past the claim's own lease
    assert await node.scheduler.reap() == 0
    assert await claiming == 1  # the loop is free again: the run starts, under its first token
    await node.worker.run_until_idle()
    done = node.execution(job.id)
    assert (done.status, done.attempt) == (ExecutionStatus.SUCCEEDED, 1)
