"""An example onbeat app: run it with ``onbeat up --app examples.app:app``.

On start-up of a fresh database it schedules a few demo jobs, so the node has something to do.
"""

from __future__ import annotations

import asyncio
import random

from onbeat import App, TaskContext

app = App()


@app.task(name="hello", max_attempts=3)
def hello(ctx: TaskContext, name: str = "world") -> str:
    ctx.logger.info("hello, %s (execution %s, attempt %d)", name, ctx.execution_id, ctx.attempt)
    return f"hello, {name}"


@app.task(name="flaky", max_attempts=4, backoff=0.5, backoff_max=5)
async def flaky(ctx: TaskContext, failure_rate: float = 0.5) -> str:
    await asyncio.sleep(0.05)
    if random.random() < failure_rate:
        raise RuntimeError(f"flaked on attempt {ctx.attempt}")
    return "ok"


def seed_demo_jobs(target: App) -> None:
    """Schedule the demo jobs once (on an empty database)."""
    if target.list_jobs(limit=1):
        return
    target.schedule("hello", {"name": "cron"}, cron="*/10 * * * * *")
    target.schedule("flaky", {"failure_rate": 0.5}, cron="*/15 * * * * *", max_attempts=4)
    target.schedule("hello", {"name": "now"})
