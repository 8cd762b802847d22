"""Celery's app: the ``noop`` task (results ignored), ``CRON_JOBS`` beat entries, submission
with ``apply_async`` (one message each; ``eta`` for W2)."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime

from celery import Celery
from celery.schedules import crontab

from bench.peers import adapter, ledger

app = Celery("peers", broker=adapter.REDIS_URL)
app.conf.update(
    task_ignore_result=True,
    beat_schedule_filename=os.path.join(os.environ.get(ledger.LEDGER_DIR, "."), "beat-schedule"),
    beat_schedule={
        f"cron-{i}": {"task": "cron", "schedule": crontab(), "args": (i,)}
        for i in range(adapter.CRON_JOBS)
    },
)


@app.task(name="noop")
def noop(run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


@app.task(name="cron")
def cron(job: int) -> None:
    ledger.record_cron(job)


def submit(ids: list[str], at: float | None) -> None:
    eta = None if at is None else datetime.fromtimestamp(at, UTC)
    for run_id in ids:
        noop.apply_async((run_id, time.time() if at is None else at), eta=eta)


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
