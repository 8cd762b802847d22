"""``Idempotency-Key`` for ``POST /jobs``: a retried request returns the first job, not a second.

Keys are scoped to the caller's tenant: two tenants that happen to pick the same key get a job
each, and neither ever sees the other's.

**In memory, per API process, for now.** Keys live in an LRU map of this process (``capacity``
keys, default 10,000): a restart, an eviction, or a retry that reaches another API process
creates a second job. A durable version needs a store table ``idempotency_keys (tenant, key,
fingerprint, job_id, created_at)`` written in the same transaction as the job, with a retention.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from onbeat.api.problems import FieldError, ProblemError

MAX_KEY_LENGTH = 255


class IdempotencyKeys:
    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        # (tenant, key) -> (fingerprint, job id)
        self._entries: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        # Held across look-up and create, so two concurrent retries of one request make one job.
        # Only idempotent POSTs take it; SQLite serialises their writes anyway.
        self._lock = threading.Lock()

    def create_once(
        self, tenant: str, key: str, fingerprint: str, create: Callable[[], str]
    ) -> tuple[str, bool]:
        """The job id for ``key`` of ``tenant`` and whether it was replayed: ``create()`` runs
        only for a new key. The same key with another request body (``fingerprint``) is a 422
        problem. A create that raises records nothing, so the client can retry with a corrected
        body."""
        with self._lock:
            entry = (tenant, key)
            found = self._entries.get(entry)
            if found is not None:
                if found[0] != fingerprint:
                    message = "was already used with a different request body; use a new key"
                    raise ProblemError(
                        422,
                        "idempotency-key-reused",
                        f"Idempotency-Key {message}",
                        [FieldError(field="Idempotency-Key", message=message)],
                    )
                self._entries.move_to_end(entry)
                return found[1], True
            job_id = create()
            self._entries[entry] = (fingerprint, job_id)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
            return job_id, False
