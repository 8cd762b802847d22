"""A node: the parts of onbeat one process runs, over one store and one delay queue.

The embedded node (``onbeat up``) runs them all: scheduler, worker and REST API in one process and
one event loop. The fleet's processes run one part each over a shared store and queue:
``onbeat scheduler`` (``Node(app, worker=False)``), ``onbeat worker`` (``scheduler=False``) and
``onbeat api`` (neither, serving the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import reprlib
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from prometheus_client import start_http_server

from onbeat.app import App
from onbeat.errors import OnbeatError, QueueUnavailableError
from onbeat.metrics import Metrics
from onbeat.queue import DelayQueue, open_node_queue
from onbeat.queue.failover import FailoverDelayQueue
from onbeat.queue.feeder import QueueFeeder
from onbeat.scheduler import Scheduler
from onbeat.settings import redact_url
from onbeat.store import one_line
from onbeat.worker import Worker
from onbeat.worker.catalog import publish_tasks

log = logging.getLogger("onbeat.node")

SHUTDOWN_OVERRUN = 15.0
"""Seconds past ``shutdown_grace`` a graceful stop may take (flushing outcomes, releasing runs,
closing connections) before the process reports every thread's stack and exits: a stop that
hangs would otherwise wait for a SIGKILL and leave no trace of where it hung. 10 + 15 s stays
under the 30 s Kubernetes gives a pod before it kills it."""


class Node:
    def __init__(self, app: App, *, scheduler: bool = True, worker: bool = True) -> None:
        """Raises OnbeatError if the queue URL names no queue onbeat has (nothing is opened)."""
        self.app = app
        self.metrics = Metrics()
        self._queue: DelayQueue | None = None
        self._scheduler: Scheduler | None = None
        self._worker: Worker | None = None
        # For the worker's claim thread: a second connection to the queue, which leaves logging
        # moves to the fallback and back to ``self._queue``. A queue in this process has none.
        claim_queue: Callable[[], DelayQueue] | None = None
        if scheduler or worker:
            open_queue = partial(
                open_node_queue,
                app.settings.queue_url,
                app.settings.database_url,
                app.clock,
                failover=app.settings.queue_failover,
            )
            try:
                self._queue = open_queue()
            except ValueError as exc:
                raise OnbeatError(str(exc)) from None
            if not app.settings.queue_url.startswith("memory:"):
                claim_queue = partial(open_queue, log_changes=False)
        if scheduler:
            self._scheduler = Scheduler(
                app.store, self.queue, app.settings, app.clock, metrics=self.metrics
            )
            app.on_submit(self._scheduler.wake)
            if isinstance(self._queue, FailoverDelayQueue):
                self._queue.on_primary_change(self._scheduler.recheck_queue)
        if worker:
            self._worker = Worker(
                app.store,
                self.queue,
                app.registry,
                app.settings,
                app.clock,
                metrics=self.metrics,
                claim_queue=claim_queue,
            )
            if self._scheduler is not None:
                self._worker.on_runs_woken = self._scheduler.wake
        if isinstance(self._queue, FailoverDelayQueue):
            self._queue.on_primary_change(self._count_failover)
        self.stop = asyncio.Event()
        self.api_ready = asyncio.Event()
        self.stop_deadline: threading.Timer | None = None
        """Set by the stop signal: exits the process if the stop hangs (``SHUTDOWN_OVERRUN``)."""

    def _count_skips(self, skips: Mapping[str, int]) -> None:
        for cause, count in skips.items():
            self.metrics.skipped.labels(cause).inc(count)

    def _count_failover(self, primary_up: bool) -> None:
        self.metrics.queue_on_fallback.set(0 if primary_up else 1)
        if not primary_up:
            self.metrics.queue_failovers.inc()

    @property
    def queue(self) -> DelayQueue:
        if self._queue is None:
            raise AttributeError("this node runs neither a scheduler nor a worker: it has no queue")
        return self._queue

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise AttributeError("this node runs no scheduler")
        return self._scheduler

    @property
    def worker(self) -> Worker:
        if self._worker is None:
            raise AttributeError("this node runs no worker")
        return self._worker

    @property
    def parts(self) -> list[str]:
        """What this node runs, for logs: e.g. ``["scheduler", "worker"]``."""
        return [
            name
            for name, part in (("scheduler", self._scheduler), ("worker", self._worker))
            if part is not None
        ]

    async def check(self) -> None:
        """Fail fast, before anything starts: open the store (StoreOpenError) and ask the queue
        something (QueueUnavailableError), each saying why in one line. Later outages are ridden
        out with retries instead."""
        await asyncio.to_thread(lambda: self.app.store)
        if self._queue is None:
            return
        try:
            await self._queue.size()
        except QueueUnavailableError:
            raise  # it names the queue already
        except Exception as exc:
            url = redact_url(self.app.settings.queue_url)
            raise QueueUnavailableError(f"cannot reach the queue {url}: {one_line(exc)}") from exc

    async def run(self, listen: tuple[str, int] | None = None) -> None:
        """Run until ``stop`` is set, serving the REST API on ``listen`` (host, port) if given.
        On stop the worker drains first, then the scheduler lets go of its shards."""
        settings, services = self.app.settings, []
        self.app.store.on_skipped = self._count_skips
        if self._worker is not None:
            services.append(self._worker.run(self.stop))
            services.append(
                publish_tasks(
                    self.app.store,
                    self.app.registry,
                    self._worker.owner,
                    settings.task_publish_interval,
                    self.app.clock,
                    self.stop,
                )
            )
        if self._scheduler is not None:
            services.append(self._scheduler.run(self.stop))
            if settings.database_url.startswith(("postgresql://", "postgres://")):
                from onbeat import dispatch_wake  # psycopg: imported only for PostgreSQL

                services.append(
                    dispatch_wake.listen(
                        settings.database_url, self._scheduler.wake, self.app.clock, self.stop
                    )
                )
        if listen is not None:
            from onbeat.api.server import serve_api

            services.append(
                serve_api(
                    self.app, *listen, ready=self.api_ready, stop=self.stop, metrics=self.metrics
                )
            )
        metrics_server = None
        if listen is None and settings.metrics_port is not None:
            metrics_server, _ = start_http_server(
                settings.metrics_port, settings.host, self.metrics.registry
            )
            log.info("metrics at http://%s:%d/metrics", settings.host, settings.metrics_port)
        feeder = None
        if self._queue is not None:  # submissions in this process feed this node's queue
            feeder = QueueFeeder.on_loop(self._queue)
            replaced = self.app.feed_queue(feeder)
            if replaced is not None:
                await asyncio.to_thread(replaced.close)
        tasks = [asyncio.create_task(service) for service in services]
        try:
            await asyncio.gather(*tasks)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            if feeder is not None:
                self.app.feed_queue(None)
                await feeder.drain()
            if self._queue is not None:
                await self._queue.close()


def _stop_signal(node: Node, sig: signal.Signals) -> None:
    """The first SIGINT/SIGTERM stops the node gracefully (runs get ``shutdown_grace``, the rest
    are released); a second one exits at once, leaving unfinished runs to their leases."""
    if not node.stop.is_set():
        log.info("%s: stopping gracefully (send it again to exit at once)", sig.name)
        node.stop.set()
        node.stop_deadline = exit_unless_over_within(
            node.app.settings.shutdown_grace + SHUTDOWN_OVERRUN, asyncio.get_running_loop()
        )
        return
    log.warning(
        "second %s: exiting now; unfinished runs are retried once their leases expire", sig.name
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + sig)


def exit_unless_over_within(seconds: float, loop: asyncio.AbstractEventLoop) -> threading.Timer:
    """Unless cancelled within ``seconds``, log that the stop is stuck, write every thread's
    stack and every task's of ``loop`` to stderr, and exit (1). A thread of its own, not the
    loop: the loop may be what is stuck. Runs not finished then are retried once their leases
    expire."""

    def exit_stuck() -> None:
        log.error(
            "the graceful stop is not over %.0fs after the signal; exiting, with every "
            "thread's and task's stack on stderr (unfinished runs are retried once their "
            "leases expire)",
            seconds,
        )
        faulthandler.dump_traceback(all_threads=True)
        with contextlib.suppress(Exception):  # read from outside the loop: best effort
            sys.stderr.write(task_stacks(loop))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(seconds, exit_stuck)
    timer.daemon = True  # not waited for by a process that exits
    timer.start()
    return timer


def task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    """Each task of ``loop`` and the chain of awaits it is suspended in, innermost last (a
    thread's stack shows only the loop waiting; ``Task.print_stack`` only a task's outer
    coroutine)."""
    out = []
    for task in asyncio.all_tasks(loop):
        out.append(f"\nTask {task.get_name()!r} (most recent call last):")
        awaited: Any = task.get_coro()
        while (
            frame := getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        ) is not None:
            code = frame.f_code
            out.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if awaited is not None:
            out.append(f"  waiting for {reprlib.repr(awaited)}")
    return "\n".join(out) + "\n"


async def serve(
    app: App,
    listen: tuple[str, int] | None = ("127.0.0.1", 8000),
    *,
    scheduler: bool = True,
    worker: bool = True,
    banner: str | None = None,
) -> None:
    """Run a node until SIGINT or SIGTERM, then shut down gracefully (a second signal exits at
    once). The store and queue are checked first (OnbeatError, one line, if either cannot be
    reached); then ``banner`` is printed. Prints the API's URLs once it listens."""
    node = Node(app, scheduler=scheduler, worker=worker)
    # before the checks and the banner: a process that printed it stops gracefully on SIGTERM
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stop_signal, node, sig)
    await node.check()
    if banner is not None:
        print(banner, flush=True)
    parts = [*node.parts, *(["api"] if listen is not None else [])]
    log.info(
        "onbeat node up (%s): store %s, queue %s, %d tasks, event loop %s, gc threshold %d",
        ", ".join(parts),
        redact_url(app.settings.database_url),
        redact_url(app.settings.queue_url) if node.parts else "none",
        len(list(app.registry)),
        type(loop).__module__.partition(".")[0],  # uvloop or asyncio
        gc.get_threshold()[0],
    )
    if app.settings.queue_url.startswith("memory://") and len(node.parts) == 1:
        log.warning(
            "the queue %s lives inside this process: this %s shares it with no other process "
            "(give the fleet a queue it shares, or run `onbeat up`)",
            app.settings.queue_url,
            node.parts[0],
        )
    running = asyncio.create_task(node.run(listen))
    if listen is not None:
        ready = asyncio.create_task(node.api_ready.wait())
        await asyncio.wait([running, ready], return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if node.api_ready.is_set():
            base = f"http://{listen[0]}:{listen[1]}"
            print(f"onbeat API: {base}/api/v1  (OpenAPI docs: {base}/docs)", flush=True)
            print(f"onbeat dashboard: {base}/", flush=True)
    try:
        await running
    finally:
        if node.stop_deadline is not None:
            node.stop_deadline.cancel()
    log.info("onbeat node stopped")
