"""What a worker tells about the outcomes it wrote: its counters, the metrics, and one log line per
state change (a success only at INFO). Runs end by the thousand a second, so a success costs no
log fields unless the line is written and its counter moves once per task and batch."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onbeat.logs import run_fields
from onbeat.metrics import Metrics
from onbeat.store.base import ClaimedRun, Completion
from onbeat.worker.instruments import TaskInstruments

if TYPE_CHECKING:
    from onbeat.worker.worker import WorkerStats

log = logging.getLogger("onbeat.worker")

__all__ = ["report_outcomes"]


def report_outcomes(
    batch: Sequence[Completion],
    runs: Mapping[str, ClaimedRun],
    accepted: Collection[str],
    stats: WorkerStats,
    metrics: Metrics,
    instruments: TaskInstruments,
) -> None:
    """Count and log a written ``batch``: ``runs`` are the held runs it ended (by id), ``accepted``
    the ids the store took (the others' leases were lost: their outcomes were discarded)."""
    logging_successes = log.isEnabledFor(logging.INFO)
    succeeded: dict[str, int] = {}
    for done in batch:
        run = runs.get(done.execution_id)
        task = run.task if run else "unknown"
        if done.succeeded and done.execution_id in accepted:
            stats.succeeded += 1
            succeeded[task] = succeeded.get(task, 0) + 1
            if logging_successes:
                log.info("execution succeeded", extra=_outcome_fields(done, run))
            continue
        fields = _outcome_fields(done, run)
        if done.execution_id not in accepted:
            stats.fenced += 1
            metrics.fenced.inc()
            log.warning(
                "execution %s: outcome with fencing token %d discarded, the lease was lost",
                done.execution_id,
                done.fencing_token,
                extra=fields,
            )
            continue
        stats.failed += 1
        if done.retry_in is not None:
            metrics.retries.labels(task).inc()
            log.info(
                "execution failed; retrying in %ss: %s", done.retry_in, done.error, extra=fields
            )
        else:
            instruments.outcomes(task, "failed").inc()
            metrics.dead_letters.inc()
            log.warning("execution failed; dead-lettered: %s", done.error, extra=fields)
    for task, n in succeeded.items():
        instruments.outcomes(task, "succeeded").inc(n)


def _outcome_fields(done: Completion, run: ClaimedRun | None) -> dict[str, Any]:
    """The fields of an outcome's log line: the run's, with the outcome's own id and token."""
    fields = run_fields(run.execution, task=run.task) if run else {}
    fields |= {"execution_id": done.execution_id, "fencing_token": done.fencing_token}
    return fields
