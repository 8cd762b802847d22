"""APScheduler's app. ``run``: the scheduler process (adds ``CRON_JOBS`` cron jobs at start, and
takes submissions from request files the ``submit`` command drops in the ledger directory,
since APScheduler 3 only sees jobs added through its own scheduler). ``submit`` before the
scheduler runs (W1) writes the jobs to the job store directly."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger

from bench.peers import adapter, ledger

REQUESTS = Path(os.environ.get(ledger.LEDGER_DIR, ".")) / "apscheduler-requests"
READY = REQUESTS / "scheduler-running"
NOOP, CRON_NOOP = "bench.peers.apscheduler.app:noop", "bench.peers.apscheduler.app:cron_noop"
"""By name: this module runs as ``__main__``; the job store keeps the textual reference."""


def noop(run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


def cron_noop(job: int) -> None:
    ledger.record_cron(job)


def configure(scheduler: BaseScheduler) -> BaseScheduler:
    url = adapter.DATABASE_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    scheduler.configure(
        jobstores={"default": SQLAlchemyJobStore(url=url)},
        job_defaults={"misfire_grace_time": None},
        timezone="UTC",
    )
    return scheduler


def add_runs(scheduler: BaseScheduler, ids: list[str], at: float | None) -> None:
    planned = time.time() if at is None else at
    when = datetime.fromtimestamp(planned, UTC)
    for run_id in ids:
        scheduler.add_job(NOOP, "date", run_date=when, args=(run_id, planned), id=run_id)


def take_requests(scheduler: BaseScheduler) -> None:
    """Submissions made while the scheduler runs: ``<n>.json`` files of ``[ids, at]``."""
    while True:
        for path in sorted(REQUESTS.glob("*.json")):
            ids, at = json.loads(path.read_text())
            add_runs(scheduler, ids, at)
            path.rename(path.with_suffix(".done"))
        time.sleep(0.05)


def run() -> None:
    scheduler = configure(BlockingScheduler())
    trigger = CronTrigger.from_crontab(adapter.EVERY_MINUTE, timezone="UTC")
    for i in range(adapter.CRON_JOBS):
        scheduler.add_job(CRON_NOOP, trigger, args=(i,), id=f"cron-{i}", replace_existing=True)
    REQUESTS.mkdir(exist_ok=True)
    threading.Thread(target=take_requests, args=(scheduler,), daemon=True).start()
    READY.touch()
    scheduler.start()


def submit(ids: list[str], at: float | None) -> None:
    if adapter.LIVE:  # the scheduler runs: hand the runs to it and wait until it took them
        while not READY.exists():
            time.sleep(0.05)
        request = REQUESTS / f"{time.time_ns()}.json"
        request.with_suffix(".tmp").write_text(json.dumps([ids, at]))
        request.with_suffix(".tmp").rename(request)
        while not request.with_suffix(".done").exists():
            time.sleep(0.05)
        return
    scheduler = configure(BackgroundScheduler())
    scheduler.start(paused=True)  # writes the jobs to the store, runs nothing
    add_runs(scheduler, ids, at)
    scheduler.shutdown(wait=False)


if __name__ == "__main__":
    if sys.argv[1:] == ["run"]:
        run()
    else:
        sys.exit(adapter.main(submit))
