"""onbeat: a distributed job scheduler for Python."""

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

__all__ = [
    "App",
    "Attempt",
    "AttemptOutcome",
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
