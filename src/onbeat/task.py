"""Tasks: named Python callables that jobs refer to. Code is registered, never uploaded."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    fn: TaskFunction
    retry: RetryPolicy
    timeout: float | None

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
    ) -> Task:
        task_name = name or f"{fn.__module__}.{fn.__qualname__}"
        if task_name in self._tasks and self._tasks[task_name].fn is not fn:
            raise ValidationError(
                "name", f"a different task is already registered as {task_name!r}"
            )
        retry = validate_retry(max_attempts, backoff, backoff_max)
        if timeout is not None and timeout <= 0:
            raise ValidationError("timeout", "must be a positive number of seconds")
        task = Task(task_name, fn, retry, timeout)
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


def validate_retry(max_attempts: int, backoff: float, backoff_max: float) -> RetryPolicy:
    if not 1 <= max_attempts <= 1000:
        raise ValidationError("max_attempts", "must be between 1 and 1000")
    for field, value in (("backoff", backoff), ("backoff_max", backoff_max)):
        if not 0 <= value <= 366 * 24 * 3600:
            raise ValidationError(field, "must be a number of seconds from 0 to one year")
    return RetryPolicy(max_attempts, backoff, max(backoff_max, backoff))
