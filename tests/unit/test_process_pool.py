"""ProcessExecutor with real child processes: results, errors, timeouts, crashes, cancellation,
close(), the memory cap, and a worker killed with -9 (its children must die with it)."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from onbeat.errors import TaskCrashed, TaskTimeout
from onbeat.task import Task, TaskContext, TaskFunction, TaskRegistry
from onbeat.testing import FakeClock
from onbeat.worker import processes
from onbeat.worker.processes import ChildTaskError, ProcessExecutor
from tests.unit import pool_tasks
from tests.unit.pool_children import pool_processes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc"),
]

ROOT = Path(__file__).resolve().parents[2]
CTX = TaskContext(
    execution_id="ex-1",
    job_id="job-1",
    attempt=2,
    fencing_token=7,
    scheduled_for=datetime(2026, 1, 5, 12, 0, tzinfo=UTC),
    logger=logging.getLogger("onbeat.task.echo"),
)

Pools = Callable[..., ProcessExecutor]


@pytest.fixture
async def pools(clock: FakeClock) -> AsyncIterator[Pools]:
    """Makes ProcessExecutors on the test's FakeClock and closes them all afterwards."""
    made: list[ProcessExecutor] = []

    def make(size: int, **kwargs: Any) -> ProcessExecutor:
        made.append(ProcessExecutor(size, clock, **kwargs))
        return made[-1]

    yield make
    for pool in made:
        await pool.close()


def task(fn: TaskFunction) -> Task:
    return TaskRegistry().register(fn, max_attempts=1)


async def run(
    pool: ProcessExecutor, fn: TaskFunction, timeout: float | None = None, **params: Any
) -> Any:
    return await pool.run(task(fn), CTX, params, timeout)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a container's PID 1 may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def test_returns_the_value_and_the_child_sees_the_params_and_context(pools: Pools) -> None:
    pool = pools(1)
    seen = await run(pool, pool_tasks.echo, n=3, tags=["a", "b"])
    assert seen == {
        "params": {"n": 3, "tags": ["a", "b"]},
        "execution_id": "ex-1",
        "job_id": "job-1",
        "attempt": 2,
        "fencing_token": 7,
        "scheduled_for": CTX.scheduled_for,
        "logger": "onbeat.task.echo",
    }
    assert await run(pool, pool_tasks.pid) != os.getpid()


async def test_children_are_long_lived_and_runs_wait_for_a_free_one(pools: Pools) -> None:
    pool = pools(2)
    spans = await asyncio.gather(
        *(run(pool, pool_tasks.nap_then_pid, seconds=0.1) for _ in range(4))
    )
    assert len({child for child, _, _ in spans}) == 2
    starts = sorted(start for _, start, _ in spans)
    busiest = max(sum(s <= start < e for _, s, e in spans) for start in starts)
    assert busiest == 2


async def test_an_async_task_runs_to_completion_in_the_child(pools: Pools) -> None:
    assert await run(pools(1), pool_tasks.async_double, n=21) == 42


async def test_the_tasks_exception_comes_back_with_its_type_message_and_traceback(
    pools: Pools,
) -> None:
    pool = pools(1)
    child = await run(pool, pool_tasks.pid)
    with pytest.raises(ChildTaskError, match=r"^ValueError: bad$") as raised:
        await run(pool, pool_tasks.fail, message="bad")
    assert raised.value.type_name == "ValueError"
    assert "raise ValueError(message)\nValueError: bad" in raised.value.traceback
    assert await run(pool, pool_tasks.pid) == child  # an exception does not cost the child


async def test_an_unpicklable_return_value_fails_the_run_but_not_the_child(pools: Pools) -> None:
    pool = pools(1)
    child = await run(pool, pool_tasks.pid)
    with pytest.raises(ChildTaskError, match="cannot be sent back from the worker process"):
        await run(pool, pool_tasks.unpicklable_result)
    assert await run(pool, pool_tasks.pid) == child


async def test_a_timeout_kills_the_child_and_the_next_run_starts_at_once(
    pools: Pools, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "At once": not after the pool's real-time waits for a child to exit or be reaped, made
    far longer than the bound here (a loaded box may take seconds to start a child)."""
    monkeypatch.setattr(processes, "EXIT_GRACE", 600.0)
    monkeypatch.setattr(processes, "REAP_TIMEOUT", 600.0)
    pool = pools(1)
    hung_child = await run(pool, pool_tasks.pid)
    hung = asyncio.create_task(run(pool, pool_tasks.hang, timeout=5.0))
    await clock.until_sleeping()
    clock.advance(5.0)
    with pytest.raises(TaskTimeout, match=r"timed out after 5\.0s"):
        await hung
    replacement = await asyncio.wait_for(run(pool, pool_tasks.pid), timeout=60)
    assert replacement != hung_child
    assert gone(hung_child)


@pytest.mark.parametrize(
    ("crash", "message"),
    [
        (pool_tasks.exit_hard, "worker process died: exit code 137"),
        (pool_tasks.segfault, "worker process died: killed by SIGSEGV"),
        (pool_tasks.system_exit, "worker process died: exit code 3"),
    ],
)
async def test_a_crashing_child_fails_only_its_run(
    pools: Pools, crash: TaskFunction, message: str
) -> None:
    pool = pools(2)
    outcomes: tuple[Any, ...] = await asyncio.gather(
        run(pool, crash),
        run(pool, pool_tasks.nap_then_pid, seconds=0.2),
        return_exceptions=True,
    )
    crashed, parallel = outcomes
    assert isinstance(crashed, TaskCrashed)
    assert str(crashed) == message
    assert isinstance(parallel, tuple)
    assert await run(pool, pool_tasks.noop) is None  # the dead child was replaced


async def test_a_child_killed_while_idle_is_replaced_before_the_next_run(pools: Pools) -> None:
    pool = pools(1)
    killed = await run(pool, pool_tasks.pid)
    os.kill(killed, signal.SIGKILL)
    # Until reaped (not just a zombie: its main thread may be, while another still holds the pipe).
    while Path(f"/proc/{killed}").exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.01)  # an outside process: no event to wait on
    assert await run(pool, pool_tasks.pid) != killed  # not a TaskCrashed for a run never started


async def test_warm_starts_the_child_the_first_run_takes(pools: Pools) -> None:
    pool = pools(2)
    await pool.warm()
    (warmed,) = pool_processes()
    assert await run(pool, pool_tasks.pid) == warmed
    await pool.warm()  # a pool with a child already: nothing more
    assert pool_processes() == {warmed}


async def test_warm_beside_runs_filling_the_pool_never_exceeds_its_size(pools: Pools) -> None:
    pool = pools(2)
    spans = await asyncio.gather(
        pool.warm(), *(run(pool, pool_tasks.nap_then_pid, seconds=0.1) for _ in range(3))
    )
    assert len({child for child, _, _ in spans[1:]}) <= 2
    assert len(pool_processes()) <= 2


async def test_close_during_warm_leaves_no_process(pools: Pools) -> None:
    pool = pools(1)
    warming = asyncio.create_task(pool.warm())
    await asyncio.sleep(0)  # the child is starting in a thread
    await pool.close()
    await warming  # ends without raising: a closed pool is nothing to warm
    assert pool_processes() == set()


async def test_a_task_a_child_cannot_import_fails_with_a_clear_error(pools: Pools) -> None:
    def local(ctx: TaskContext) -> None:
        return None

    pool = pools(1)
    for fn in (lambda ctx: None, local):
        with pytest.raises(
            TypeError,
            match=r"^task 'reports\.nightly' cannot run in a worker process: .*module level$",
        ):
            await pool.run(TaskRegistry().register(fn, name="reports.nightly"), CTX, {}, None)


async def test_cancelling_the_run_kills_its_child(pools: Pools, clock: FakeClock) -> None:
    pool = pools(1)
    hung_child = await run(pool, pool_tasks.pid)
    hung = asyncio.create_task(run(pool, pool_tasks.hang, timeout=60.0))
    await clock.until_sleeping()  # the request is in the child
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    assert await run(pool, pool_tasks.pid) != hung_child
    assert gone(hung_child)


async def test_close_kills_busy_and_idle_children_promptly_and_leaves_no_process(
    pools: Pools, clock: FakeClock
) -> None:
    pool = pools(2)
    hung = asyncio.create_task(run(pool, pool_tasks.hang, timeout=60.0))
    await clock.until_sleeping()
    idle_child = await run(pool, pool_tasks.pid)
    assert len(pool_processes()) == 2
    started = time.monotonic()
    await pool.close()
    assert time.monotonic() - started < 1.0
    with pytest.raises(TaskCrashed, match="the process pool was closed"):
        await hung
    assert pool_processes() == set()
    assert gone(idle_child)
    with pytest.raises(RuntimeError, match="closed"):
        await run(pool, pool_tasks.noop)


async def test_children_run_at_the_niceness_added_to_the_workers(pools: Pools) -> None:
    """A CPU-bound run yields to the worker's loop (heartbeats, claims) when they compete."""
    assert await run(pools(1, nice=7), pool_tasks.niceness) == os.nice(0) + 7
    assert await run(pools(1), pool_tasks.niceness) == os.nice(0)


async def test_a_memory_balloon_under_max_memory_fails_its_run_not_the_parent(
    pools: Pools,
) -> None:
    limit = 256 * 2**20
    pool = pools(1, max_memory=limit)
    with pytest.raises(ChildTaskError, match=r"^MemoryError"):
        await run(pool, pool_tasks.balloon, size=4 * limit)
    assert await run(pool, pool_tasks.balloon, size=2**20) == 2**20
    assert resource.getrlimit(resource.RLIMIT_AS)[0] != limit


WORKER = """
import asyncio, logging
from datetime import UTC, datetime
from onbeat.clock import SystemClock
from onbeat.task import TaskContext, TaskRegistry
from onbeat.worker.processes import ProcessExecutor
from tests.unit import pool_tasks
from tests.unit.pool_children import pool_processes

ctx = TaskContext("ex", "job", 1, 1, datetime.now(UTC), logging.getLogger("t"))
task = TaskRegistry().register(pool_tasks.announce_then_hang)
asyncio.run(ProcessExecutor(1, SystemClock()).run(task, ctx, {}, None))
"""


def test_children_die_with_a_worker_killed_by_sigkill() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", WORKER], cwd=ROOT, stdout=subprocess.PIPE
    ) as worker:
        try:
            assert worker.stdout is not None
            child = int(worker.stdout.readline())
            assert not gone(child)
        finally:
            worker.kill()
    deadline = time.monotonic() + 3.0
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.01)  # an outside process: no event to wait on
    assert gone(child)
