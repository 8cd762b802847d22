"""onbeat's exceptions: one base class, and one subclass per kind of failure a caller handles."""

from __future__ import annotations

SHOWN = 80
"""Longest piece of user input an error message echoes back."""


def shown(value: object, limit: int = SHOWN) -> str:
    """``repr`` of user input, shortened so an error message never echoes a huge string."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OnbeatError(Exception):
    """Base class of every error onbeat raises on purpose."""


class ValidationError(OnbeatError, ValueError):
    """Bad input, refused before anything is stored.

    ``field`` names the offending input (``"cron"``, ``"timezone"``, ``"task"``...), so an API can
    point at it; the message says what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFoundError(OnbeatError, LookupError):
    """A job, execution or dead letter with that id does not exist (or is not visible to the caller)."""


class ConflictError(OnbeatError):
    """The request is valid but the resource's current state forbids it (e.g. resuming a cancelled job)."""


class TaskNotFoundError(ValidationError):
    """A job names a task that is not registered."""

    def __init__(self, name: str) -> None:
        super().__init__("task", f"unknown task {name!r}: no task of that name is registered")
        self.name = name


class TaskTimeout(OnbeatError, TimeoutError):
    """A run passed its timeout. The executor stopped it as far as it can: an async task is
    cancelled, a child process is killed; a thread cannot be stopped, so it is abandoned (it runs
    on, holding no slot)."""


class TaskCrashed(OnbeatError):
    """The process running the task died (killed, crashed, ``os._exit``) before it returned."""


class TaskAborted(OnbeatError):
    """Task code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``...). Carried as an ordinary exception, so that it fails
    the run instead of stopping the worker: task code must never stop the node."""

    def __init__(self, original: BaseException) -> None:
        detail = (
            f"{type(original).__name__}: {original}" if str(original) else type(original).__name__
        )
        super().__init__(f"{detail} (raised by the task; task code cannot stop the worker)")
        self.original = original


class UnreadableRecordError(OnbeatError):
    """A stored record holds something this version cannot read (written behind onbeat's back,
    by a bug, or by a version with other rules): it is reported, and left as it is."""

    def __init__(self, kind: str, record_id: str, reason: str) -> None:
        super().__init__(f"{kind} {record_id!r} is stored in a form that cannot be read: {reason}")
        self.kind = kind
        self.record_id = record_id
        self.reason = reason


class StoreOpenError(OnbeatError):
    """The store cannot be opened (no such directory, no permission, not a database...)."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"cannot open the store {location}: {reason}")
        self.location = location
        self.reason = reason


class StoreWriteRefusedError(OnbeatError):
    """The store refuses writes (its disk is full, its file became read-only, an I/O error):
    nothing was changed; retry once it accepts writes again."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the store refuses writes ({reason})")
        self.reason = reason


class StoreUnavailableError(OnbeatError):
    """The store cannot be reached right now (connection refused or lost, the server
    restarting): nothing was changed (unless it is a StoreOutcomeUnknownError); retry later. A
    backend raises it for connection failures, so the API answers 503 and the services retry
    with backoff rather than fail."""


class StoreOutcomeUnknownError(StoreUnavailableError):
    """The connection to the store was lost while a transaction was being committed, and the
    store could not be asked whether it was: the change may or may not have been applied. A
    service whose writes are idempotent (outcomes under a fencing token, runs under their ids)
    retries as for any unavailable store; the API answers 504 (a retry needs an
    Idempotency-Key, or a look at what is stored, not to apply a change twice)."""


class QueueUnavailableError(OnbeatError):
    """The delay queue's backing service cannot be reached or used (database down, file not
    openable): nothing was queued or claimed; retry once it is back."""
