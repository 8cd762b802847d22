"""Tasks: named Python callables that jobs refer to. Code is registered, never uploaded."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from onbeat import validation
from onbeat.errors import TaskNotFoundError, ValidationError
from onbeat.model import RetryPolicy


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a running task knows about the run it is doing; passed as the first argument."""

    execution_id: str
    job_id: str
    attempt: int
    """1-based."""
    fencing_token: int
    scheduled_for: datetime
    logger: logging.Logger


TaskFunction = Callable[..., Any]
Pool = Literal["threads", "processes"]
"""Where a sync task runs: the worker's thread pool or its child processes (docs/executors.md)."""


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    fn: TaskFunction
    retry: RetryPolicy
    timeout: float | None
    pool: Pool | None = None
    """A sync task's executor; None: the worker's ``--pool``. A task that may hold the GIL in
    one long C call, crash its process or balloon in memory says ``"processes"``."""

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


class TaskRegistry:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def register(
        self,
        fn: TaskFunction,
        *,
        name: str | None = None,
        max_attempts: int = 3,
        timeout: float | None = None,
        backoff: float = 1.0,
        backoff_max: float = 300.0,
        pool: Pool | None = None,
    ) -> Task:
        default_name = f"{fn.__module__}.{fn.__qualname__}"
        task_name = validation.text(
            "name", default_name if name is None else name, validation.MAX_TASK_NAME
        )
        if task_name in self._tasks and self._tasks[task_name].fn is not fn:
            raise ValidationError(
                "name", f"a different task is already registered as {task_name!r}"
            )
        retry = validation.retry(max_attempts, backoff, backoff_max)
        if pool is not None and pool not in ("threads", "processes"):
            raise ValidationError("pool", f"must be 'threads' or 'processes', not {pool!r}")
        if pool is not None and inspect.iscoroutinefunction(fn):
            raise ValidationError("pool", "an async def task runs on the event loop, not a pool")
        task = Task(task_name, fn, retry, validation.timeout(timeout), pool)
        self._tasks[task_name] = task
        return task

    def get(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            raise TaskNotFoundError(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Any:
        return iter(self._tasks.values())
