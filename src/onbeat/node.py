"""The embedded node: scheduler and worker in one process, over one store and one delay queue."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from onbeat.app import App
from onbeat.metrics import Metrics
from onbeat.queue import open_queue
from onbeat.scheduler import Scheduler
from onbeat.worker import Worker

log = logging.getLogger("onbeat.node")


class Node:
    def __init__(self, app: App) -> None:
        self.app = app
        self.queue = open_queue(app.settings.queue_url, app.clock)
        self.metrics = Metrics()
        self.scheduler = Scheduler(
            app.store, self.queue, app.settings, app.clock, metrics=self.metrics
        )
        self.worker = Worker(
            app.store, self.queue, app.registry, app.settings, app.clock, metrics=self.metrics
        )
        self.stop = asyncio.Event()
        self.api_ready = asyncio.Event()
        app.on_submit(self.scheduler.wake)
        self.worker.on_runs_woken = self.scheduler.wake

    async def run(self, listen: tuple[str, int] | None = None) -> None:
        """Run until ``stop`` is set, serving the REST API on ``listen`` (host, port) if given.
        On stop the worker drains first, then the scheduler lets go of its shards."""
        services = [self.worker.run(self.stop), self.scheduler.run(self.stop)]
        if listen is not None:
            from onbeat.api.server import serve_api

            services.append(
                serve_api(
                    self.app, *listen, ready=self.api_ready, stop=self.stop, metrics=self.metrics
                )
            )
        tasks = [asyncio.create_task(service) for service in services]
        try:
            await asyncio.gather(*tasks)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.queue.close()


def _stop_signal(node: Node, sig: signal.Signals) -> None:
    """The first SIGINT/SIGTERM stops the node gracefully (runs get ``shutdown_grace``, the rest
    are released); a second one exits at once, leaving unfinished runs to their leases."""
    if not node.stop.is_set():
        log.info("%s: stopping gracefully (send it again to exit at once)", sig.name)
        node.stop.set()
        return
    log.warning(
        "second %s: exiting now; unfinished runs are retried once their leases expire", sig.name
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + sig)


async def serve(app: App, listen: tuple[str, int] | None = ("127.0.0.1", 8000)) -> None:
    """Run a node until SIGINT or SIGTERM, then shut down gracefully (a second signal exits at
    once). Prints the API's URLs once it listens."""
    node = Node(app)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stop_signal, node, sig)
    log.info(
        "onbeat node up: store %s, queue %s, %d tasks",
        app.settings.database_url,
        app.settings.queue_url,
        len(list(app.registry)),
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
    await running
    log.info("onbeat node stopped")
