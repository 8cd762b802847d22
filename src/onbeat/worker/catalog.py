"""A worker publishes the tasks it runs, with their default policies, to the store's catalog: on
start and every ``task_publish_interval``. Processes without the user's code (``onbeat api``) read
it to validate a job's task and fill in its defaults (``App.get_task``)."""

from __future__ import annotations

import asyncio
import logging

from onbeat.clock import Clock
from onbeat.scheduler import sleep_or_wake
from onbeat.store.base import Store, TaskDefaults
from onbeat.task import TaskRegistry
from onbeat.worker.outage import FailureStreak

log = logging.getLogger("onbeat.worker")


def task_defaults(registry: TaskRegistry) -> list[TaskDefaults]:
    return [TaskDefaults(t.name, t.retry, t.timeout, t.is_async) for t in registry]


async def publish_tasks(
    store: Store,
    registry: TaskRegistry,
    worker: str,
    interval: float,
    clock: Clock,
    stop: asyncio.Event,
) -> None:
    """Publish ``registry``'s tasks as ``worker`` now and every ``interval`` seconds until
    ``stop`` is set. A failed publication is retried with backoff (never later than
    ``interval``): the catalog keeps a task for ``task_ttl``, so an outage shorter than that
    changes nothing for the API."""
    tasks = task_defaults(registry)
    streak = FailureStreak("publishing tasks", log)
    while not stop.is_set():
        try:
            await asyncio.to_thread(store.task_publish, worker, tasks)
        except Exception:
            wait = min(streak.failed("retrying with backoff"), interval)
        else:
            streak.succeeded()
            wait = interval
        await sleep_or_wake(clock, wait, stop)
