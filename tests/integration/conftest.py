"""An in-process node (App + Scheduler + Worker over SQLite and the memory queue) on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from onbeat import App, TaskContext
from onbeat.model import Execution
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.testing import FakeClock
from onbeat.worker import Worker


@dataclass
class Calls:
    """What the test tasks saw, in order."""

    seen: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Node:
    app: App
    scheduler: Scheduler
    worker: Worker
    queue: MemoryDelayQueue
    clock: FakeClock
    calls: Calls

    async def step(self, advance: float = 0.0) -> None:
        """Move time, then do one scheduler pass and run every run that is due."""
        self.clock.advance(advance)
        await self.scheduler.renew_shards()
        await self.scheduler.reap()
        await self.scheduler.dispatch()
        await self.worker.run_until_idle()

    async def dispatch(self) -> None:
        """One scheduler pass that queues what is due, without running it."""
        await self.scheduler.renew_shards()
        await self.scheduler.dispatch()

    def execution(self, job_id: str) -> Execution:
        """The job's only execution."""
        [execution] = self.app.list_executions(job_id)
        return execution

    def new_worker(self, store: Any = None, queue: Any = None) -> Worker:
        """Another worker on this node's store and queue (or stand-ins for them)."""
        return Worker(
            store or self.app.store,
            queue or self.queue,
            self.app.registry,
            self.app.settings,
            self.clock,
        )


@asynccontextmanager
async def running_worker(worker: Worker) -> AsyncIterator[Worker]:
    """``worker`` runs its loops while the block runs, then stops (its shutdown included)."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def node(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Node]:
    app = App(
        f"sqlite:///{tmp_path / 'onbeat.db'}",
        clock=clock,
        shards=4,
        lease_ttl=10,
        heartbeat_interval=3,
        window=5,
        misfire_grace=60,
    )
    calls = Calls()

    @app.task(name="record")
    def record(ctx: TaskContext, **params: Any) -> dict[str, Any]:
        calls.seen.append((ctx.execution_id, params, ctx.attempt))
        return {"echo": params}

    @app.task(name="arecord")
    async def arecord(ctx: TaskContext, **params: Any) -> str:
        calls.seen.append((ctx.execution_id, params, ctx.attempt))
        return "async"

    @app.task(name="fail", max_attempts=3, backoff=2, backoff_max=10)
    def fail(ctx: TaskContext) -> None:
        calls.seen.append((ctx.execution_id, {}, ctx.attempt))
        raise RuntimeError(f"boom {ctx.attempt}")

    @app.task(name="block")
    async def block(ctx: TaskContext) -> str:
        calls.seen.append((ctx.execution_id, {}, ctx.attempt))
        calls.started.set()
        await calls.release.wait()
        return "released"

    @app.task(name="slow", timeout=1)
    async def slow(ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    queue = MemoryDelayQueue(clock)
    scheduler = Scheduler(app.store, queue, app.settings, clock)
    worker = Worker(app.store, queue, app.registry, app.settings, clock)
    yield Node(app, scheduler, worker, queue, clock, calls)
    app.close()
