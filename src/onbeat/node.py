"""The embedded node: scheduler and worker in one process, over one store and one delay queue."""

from __future__ import annotations

import asyncio
import logging
import signal

from onbeat.app import App
from onbeat.queue import open_queue
from onbeat.scheduler import Scheduler
from onbeat.worker import Worker

log = logging.getLogger("onbeat.node")


class Node:
    def __init__(self, app: App) -> None:
        self.app = app
        self.queue = open_queue(app.settings.queue_url, app.clock)
        self.scheduler = Scheduler(app.store, self.queue, app.settings, app.clock)
        self.worker = Worker(app.store, self.queue, app.registry, app.settings, app.clock)
        self.stop = asyncio.Event()
        app.on_submit(self.scheduler.wake)

    async def run(self) -> None:
        """Run until ``stop`` is set; the worker drains first, then the scheduler lets go of its shards."""
        worker = asyncio.create_task(self.worker.run(self.stop))
        scheduler = asyncio.create_task(self.scheduler.run(self.stop))
        try:
            await asyncio.gather(worker, scheduler)
        finally:
            await self.queue.close()


async def serve(app: App) -> None:
    """Run a node until SIGINT or SIGTERM, then shut down gracefully."""
    node = Node(app)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, node.stop.set)
    log.info(
        "onbeat node up: store %s, queue %s, %d tasks",
        app.settings.database_url,
        app.settings.queue_url,
        len(list(app.registry)),
    )
    await node.run()
    log.info("onbeat node stopped")
