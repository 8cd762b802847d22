"""One attempt of a run: task code in, a ``Completion`` out, whatever the code did.

Task code is hostile: it may raise anything (``SystemExit`` and ``KeyboardInterrupt`` included),
time out, or name a task this worker does not have. Each becomes a failed attempt whose error
names what happened, with the retry delay of the run's policy; only the worker's own cancellation
(fenced, replaced, stopping) goes up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from onbeat.clock import Clock
from onbeat.errors import TaskAborted, TaskCrashed, TaskNotFoundError, TaskTimeout
from onbeat.retry import backoff_delay
from onbeat.store.base import ClaimedRun, Completion
from onbeat.task import Task, TaskContext, TaskRegistry
from onbeat.worker.executors import Executor
from onbeat.worker.instruments import TaskInstruments
from onbeat.worker.processes import ChildTaskError
from onbeat.worker.results import stored_result

__all__ = ["run_attempt"]


async def run_attempt(
    run: ClaimedRun,
    registry: TaskRegistry,
    executor_for: Callable[[Task], Executor],
    instruments: TaskInstruments,
    clock: Clock,
) -> Completion:
    """Run ``run``'s task on its executor and return the attempt's outcome."""
    ex = run.execution
    ctx = TaskContext(
        execution_id=ex.id,
        job_id=ex.job_id,
        attempt=ex.attempt,
        fencing_token=ex.fencing_token,
        scheduled_for=ex.scheduled_for,
        logger=instruments.logger(run.task),
    )
    timed_out = False
    started = clock.monotonic()
    try:
        task = registry.get(run.task)
        try:
            result = await executor_for(task).run(task, ctx, run.params, run.timeout)
        finally:
            instruments.run_duration(run.task).observe(clock.monotonic() - started)
        return Completion(ex.id, ex.fencing_token, succeeded=True, result=stored_result(result))
    except TaskTimeout:
        timed_out = True
        error = f"timed out after {run.timeout}s"
    except TaskNotFoundError as exc:
        error = f"{exc} in this worker"
    except (TaskAborted, TaskCrashed, ChildTaskError) as exc:  # they name what happened
        error = str(exc)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    except BaseException as exc:  # SystemExit & co. from task code run in this task
        current = asyncio.current_task()
        if isinstance(exc, asyncio.CancelledError) and current and current.cancelling():
            raise
        error = str(TaskAborted(exc))
    retry_in = backoff_delay(run.retry, ex.attempt) if ex.attempt < run.retry.max_attempts else None
    return Completion(
        ex.id,
        ex.fencing_token,
        succeeded=False,
        error=error,
        timed_out=timed_out,
        retry_in=retry_in,
    )
