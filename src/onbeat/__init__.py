"""onbeat: a distributed job scheduler for Python."""

from typing import TYPE_CHECKING, Any

from onbeat.app import App
from onbeat.errors import (
    ConflictError,
    NotFoundError,
    OnbeatError,
    TaskNotFoundError,
    ValidationError,
)
from onbeat.model import (
    Attempt,
    AttemptOutcome,
    DeadLetter,
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.schedule import Schedule, ScheduleKind
from onbeat.task import TaskContext

if TYPE_CHECKING:
    from onbeat.client import AsyncClient, Client


def __getattr__(name: str) -> Any:
    """``Client``/``AsyncClient`` load lazily, so ``import onbeat`` does not pull in httpx."""
    if name in ("Client", "AsyncClient"):
        from onbeat import client

        return getattr(client, name)
    raise AttributeError(f"module 'onbeat' has no attribute {name!r}")


__all__ = [
    "App",
    "AsyncClient",
    "Attempt",
    "AttemptOutcome",
    "Client",
    "ConflictError",
    "DeadLetter",
    "Execution",
    "ExecutionStatus",
    "Job",
    "JobStatus",
    "MisfirePolicy",
    "NotFoundError",
    "OnbeatError",
    "OverlapPolicy",
    "RetryPolicy",
    "Schedule",
    "ScheduleKind",
    "TaskContext",
    "TaskNotFoundError",
    "Trigger",
    "ValidationError",
]
