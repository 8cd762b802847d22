"""onbeat's app for the peers harness, both modes: the ``peers.noop`` task (one ledger line per
run, planned = the run's ``scheduled_for``), ``peers.cron`` for W3, and the submissions through
``App.submit_many`` (1,000 jobs a transaction, as ``bench/fleet.py`` submits). ``cron``: the
setup step that stores ``CRON_JOBS`` every-minute cron jobs (onbeat keeps cron jobs in its store,
not in code), each under a stable idempotency key, so running it twice creates them once.

The store (and queue) come from ``ONBEAT_*`` variables the spec sets."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from bench.peers import adapter, ledger
from onbeat import App, TaskContext

BATCH = 1_000
NOOP, CRON = "peers.noop", "peers.cron"

app = App()


@app.task(name=NOOP)
async def noop(ctx: TaskContext, run_id: str) -> None:
    ledger.record(run_id, ctx.scheduled_for.timestamp())


@app.task(name=CRON)
async def cron(ctx: TaskContext, job: int) -> None:
    ledger.record_cron(job, ctx.scheduled_for.timestamp())  # the fire time onbeat gives


def submitting_app() -> App:
    """The module's App for a short-lived process: the store is migrated by the setup step."""
    app.settings = app.settings.with_overrides({"migrate": False})
    return app


def submit(ids: list[str], at: float | None) -> None:
    submitter = submitting_app()
    when = None if at is None else datetime.fromtimestamp(at, UTC)
    for first in range(0, len(ids), BATCH):
        submitter.submit_many(
            [
                submitter.prepare(NOOP, {"run_id": run_id}, at=when)
                for run_id in ids[first : first + BATCH]
            ]
        )
    submitter.close()


def create_cron_jobs(count: int) -> None:
    """``count`` every-minute cron jobs of ``peers.cron``, job ``i`` under the idempotency key
    ``peers-cron-<i>`` (a second call returns the jobs the first one stored)."""
    submitter = submitting_app()
    for first in range(0, count, BATCH):
        submitter.submit_many([
            submitter.prepare(CRON, {"job": i}, cron=adapter.EVERY_MINUTE,
                              idempotency_key=f"peers-cron-{i}")
            for i in range(first, min(count, first + BATCH))
        ])  # fmt: skip
    submitter.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["cron"]:
        create_cron_jobs(adapter.CRON_JOBS)
    else:
        sys.exit(adapter.main(submit))
