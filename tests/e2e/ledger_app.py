"""The app the crash tests run: its task writes a start and an end line per run to a ledger file
(one ``write()`` each, O_APPEND), independent of the store, so lost and duplicate runs can be counted."""

from __future__ import annotations

import asyncio
import json
import os
import time

from onbeat import App, TaskContext

app = App()


def _record(event: str, ctx: TaskContext) -> None:
    line = json.dumps(
        {
            "event": event,
            "execution_id": ctx.execution_id,
            "job_id": ctx.job_id,
            "attempt": ctx.attempt,
            "fencing_token": ctx.fencing_token,
            "scheduled_for": ctx.scheduled_for.isoformat(),
            "pid": os.getpid(),
            "wall": time.time(),
        }
    )
    fd = os.open(os.environ["ONBEAT_TEST_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(name="work", max_attempts=5, backoff=0.2, backoff_max=1.0)
async def work(ctx: TaskContext, duration: float = 0.3) -> None:
    _record("start", ctx)
    await asyncio.sleep(duration)
    _record("end", ctx)
