"""The worker: claims due runs from the delay queue, runs them, heartbeats, records outcomes.

A run is started only after the store flips it from queued to running with a lease and a new
fencing token; every later write names that token, so a worker that lost its lease (stalled,
partitioned) cannot overwrite the outcome of the run's next attempt. Outcomes and heartbeats are
batched: one store call per batch, not per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onbeat.app import MAX_PARAMS_BYTES
from onbeat.clock import Clock
from onbeat.errors import TaskAborted, TaskNotFoundError, TaskTimeout
from onbeat.queue.base import DelayQueue
from onbeat.retry import backoff_delay
from onbeat.scheduler import process_name, sleep_or_wake
from onbeat.settings import Settings
from onbeat.store.base import ClaimedRun, Completion, Store
from onbeat.task import TaskContext, TaskRegistry
from onbeat.worker.executors import AsyncExecutor, Executor, ThreadExecutor

log = logging.getLogger("onbeat.worker")

MAX_RESULT_BYTES = MAX_PARAMS_BYTES
"""A return value whose JSON is larger is stored as a truncated preview (see ``stored_result``)."""
RESULT_PREVIEW_CHARS = 1024


@dataclass
class WorkerStats:
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    fenced: int = 0
    """Outcomes the store refused because the run's lease had been taken away."""
    released: int = 0
    threads_abandoned: int = 0
    """Sync runs that timed out or were cancelled while their thread ran on (it cannot be stopped)."""


class Worker:
    def __init__(
        self,
        store: Store,
        queue: DelayQueue,
        registry: TaskRegistry,
        settings: Settings,
        clock: Clock,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.owner = owner or process_name("worker")
        self.stats = WorkerStats()
        self._inflight: dict[str, tuple[int, asyncio.Task[None]]] = {}
        """execution id -> (fencing token, the asyncio task running it), until its outcome is written."""
        self._executing = 0
        """Tasks still running: what concurrency bounds. A finished run waiting for its outcome
        to be written holds no slot, so claiming overlaps with writing outcomes."""
        self._finished: list[Completion] = []
        self._finished_ready = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._async_executor = AsyncExecutor(clock)
        self._sync_executor = self._pool(settings, clock)

    def _pool(self, settings: Settings, clock: Clock) -> Executor:
        """The executor of sync tasks: ``settings.pool``."""
        if settings.pool == "processes":
            # Imported only when chosen: child processes cost nothing unless asked for.
            processes = importlib.import_module("onbeat.worker.processes")
            executor: Executor = processes.ProcessExecutor(settings.concurrency, clock)
            return executor
        return ThreadExecutor(clock, on_abandon=self._count_abandoned)

    def _count_abandoned(self) -> None:
        self.stats.threads_abandoned += 1

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # --- claiming ---------------------------------------------------------------------------
    async def claim_once(self) -> int:
        """Claim what is due now, up to free capacity, and start it; returns how many started."""
        free = self.settings.concurrency - self._executing
        if free <= 0:
            return 0
        ids = await self.queue.claim_due(min(free, self.settings.claim_batch))
        if not ids:
            return 0
        try:
            claim = await asyncio.to_thread(
                self.store.execution_claim, ids, self.owner, self.settings.lease_ttl
            )
        except Exception:
            log.exception("claim failed; the sweep will re-enqueue these runs")
            return 0
        if claim.not_due:
            await self.queue.enqueue(claim.not_due)
        for run in claim.started:
            for victim in run.replaced:
                self._cancel_local(victim, "replaced by a newer run (overlap=replace)")
            token = run.execution.fencing_token
            task = asyncio.create_task(self._run(run), name=f"onbeat-run-{run.execution.id}")
            self._executing += 1
            task.add_done_callback(self._run_done)
            self._inflight[run.execution.id] = (token, task)
        self.stats.started += len(claim.started)
        return len(claim.started)

    def _cancel_local(self, execution_id: str, why: str) -> None:
        entry = self._inflight.pop(execution_id, None)
        if entry is not None:
            log.warning("execution %s: stopping local run, %s", execution_id, why)
            self.stats.fenced += 1
            entry[1].cancel()

    def _run_done(self, _: asyncio.Task[None]) -> None:
        self._executing -= 1
        self._slot_free.set()

    # --- running ----------------------------------------------------------------------------
    async def _run(self, run: ClaimedRun) -> None:
        ex = run.execution
        try:
            completion = await self._execute(run)
        except asyncio.CancelledError:
            return  # fenced, replaced, or the worker is stopping (it releases the lease itself)
        if self._inflight.get(ex.id, (None,))[0] != ex.fencing_token:
            return  # fenced while running: the result is stale and must not be written
        self._finished.append(completion)
        self._finished_ready.set()

    async def _execute(self, run: ClaimedRun) -> Completion:
        ex = run.execution
        ctx = TaskContext(
            execution_id=ex.id,
            job_id=ex.job_id,
            attempt=ex.attempt,
            fencing_token=ex.fencing_token,
            scheduled_for=ex.scheduled_for,
            logger=logging.getLogger(f"onbeat.task.{run.task}"),
        )
        timed_out = False
        try:
            task = self.registry.get(run.task)
            executor = self._async_executor if task.is_async else self._sync_executor
            result = await executor.run(task, ctx, run.params, run.timeout)
            return Completion(ex.id, ex.fencing_token, succeeded=True, result=stored_result(result))
        except TaskTimeout:
            timed_out = True
            error = f"timed out after {run.timeout}s"
        except TaskNotFoundError as exc:
            error = f"{exc} in this worker"
        except TaskAborted as exc:
            error = str(exc)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        except BaseException as exc:  # an executor let task code's SystemExit & co. through
            current = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and current and current.cancelling():
                raise
            error = str(TaskAborted(exc))
        retry_in = (
            backoff_delay(run.retry, ex.attempt) if ex.attempt < run.retry.max_attempts else None
        )
        return Completion(
            ex.id,
            ex.fencing_token,
            succeeded=False,
            error=error,
            timed_out=timed_out,
            retry_in=retry_in,
        )

    async def flush(self) -> None:
        """Write the outcomes gathered so far, in one store call."""
        batch, self._finished = self._finished, []
        self._finished_ready.clear()
        if not batch:
            return
        try:
            accepted = set(await asyncio.to_thread(self.store.execution_finish_many, batch))
        except Exception:
            log.exception("recording %d outcomes failed; retrying", len(batch))
            self._finished = batch + self._finished
            self._finished_ready.set()
            await self.clock.sleep(0.5)
            return
        for done in batch:
            if self._inflight.get(done.execution_id, (None,))[0] == done.fencing_token:
                del self._inflight[done.execution_id]
            if done.execution_id not in accepted:
                self.stats.fenced += 1
                log.warning(
                    "execution %s: outcome with fencing token %d discarded, the lease was lost",
                    done.execution_id,
                    done.fencing_token,
                )
            elif done.succeeded:
                self.stats.succeeded += 1
            else:
                self.stats.failed += 1

    async def heartbeat(self) -> None:
        """Extend the leases of the runs this worker runs, in one statement; stop runs whose
        lease was lost."""
        running = {eid: token for eid, (token, _) in self._inflight.items()}
        held = await asyncio.to_thread(
            self.store.execution_heartbeat, self.owner, running, self.settings.lease_ttl
        )
        finishing = {c.execution_id for c in self._finished}
        for execution_id, (token, _) in list(self._inflight.items()):
            if held.get(execution_id) != token and execution_id not in finishing:
                self._cancel_local(execution_id, "its lease was taken away (fenced)")

    async def run_until_idle(self) -> None:
        """Burst mode: run everything due now (and the retries that become due meanwhile
        without the clock moving), then return. For tests and one-off drains."""
        while True:
            started = await self.claim_once()
            running = [task for _, task in self._inflight.values()]
            if not started and not running:
                return
            if running:
                await asyncio.wait(running)
            await self.flush()

    # --- loops ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run until ``stop`` is set, then drain (see ``shutdown``)."""
        loops = [
            asyncio.create_task(self._claim_loop(stop)),
            asyncio.create_task(self._flush_loop(stop)),
            asyncio.create_task(self._heartbeat_loop(stop)),
        ]
        try:
            await stop.wait()
        finally:
            await self.shutdown(loops)

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                started = await self.claim_once()
            except Exception:
                log.exception("claim loop error")
                started = 0
            if started:
                continue
            if self._executing >= self.settings.concurrency:
                self._slot_free.clear()
                await sleep_or_wake(self.clock, 1.0, self._slot_free, stop)
            else:
                await self.queue.wait(self.settings.poll_interval)

    async def _flush_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or_wake(self.clock, 1.0, self._finished_ready, stop)
            await asyncio.sleep(0.002)  # let outcomes finishing together share one write
            await self.flush()

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or_wake(self.clock, self.settings.heartbeat_interval, stop)
            try:
                await self.heartbeat()
            except Exception:
                log.exception("heartbeat failed; leases run out after %ss", self.settings.lease_ttl)

    async def shutdown(self, loops: Sequence[asyncio.Task[Any]] = ()) -> None:
        """Stop claiming; give in-flight runs ``shutdown_grace`` seconds, then release the rest
        so they run again at once elsewhere instead of waiting for their leases to expire."""
        for loop_task in loops:
            loop_task.cancel()
        running = [task for _, task in self._inflight.values()]
        if running:
            log.info("waiting up to %ss for %d runs", self.settings.shutdown_grace, len(running))
            await asyncio.wait(running, timeout=self.settings.shutdown_grace)
        await self.flush()
        leftover = {eid: token for eid, (token, _) in self._inflight.items()}
        for _, task in self._inflight.values():
            task.cancel()
        if leftover:
            self.stats.released += await asyncio.to_thread(
                self.store.execution_release, self.owner, leftover
            )
            log.info("released %d unfinished runs", len(leftover))
        self._inflight.clear()
        with contextlib.suppress(Exception):
            await asyncio.gather(*loops, return_exceptions=True)
        await self._async_executor.close()
        await self._sync_executor.close()


def stored_result(value: Any) -> Any:
    """A task's return value as stored: itself if JSON can hold it, else its repr; and if that
    is larger than ``MAX_RESULT_BYTES`` of JSON, ``{"truncated": true, "bytes": <its JSON size>,
    "preview": <its first RESULT_PREVIEW_CHARS characters>}`` instead, so one task cannot bloat
    every read of its executions."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        value = repr(value)
        text = json.dumps(value)
    if len(text) <= MAX_RESULT_BYTES:  # json.dumps escapes to ASCII: characters are bytes
        return value
    preview = value if isinstance(value, str) else text
    return {"truncated": True, "bytes": len(text), "preview": preview[:RESULT_PREVIEW_CHARS]}
