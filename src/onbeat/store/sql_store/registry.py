"""API keys, secrets and the task catalog workers publish."""

from __future__ import annotations

from collections.abc import Sequence

from onbeat import validation
from onbeat.auth import ApiKey
from onbeat.batch_json import batch_json
from onbeat.store.base import (
    PublishedTask,
    TaskDefaults,
)
from onbeat.store.rows import (
    api_key_of,
    published_task_of,
    to_us,
)
from onbeat.store.sql_store.base import Connection, SQLBase, retried


class RegistryTransactions(SQLBase):
    """API keys, secrets and the task catalog workers publish."""

    def api_key_insert(self, key: ApiKey, key_hash: str) -> None:
        def committed(c: Connection) -> bool:
            """Whether the key is stored: sent again, a second key would be made, the first
            left active with a secret no one was shown."""
            return c.execute(self._q["api_key_get"], {"id": key.id}).fetchone() is not None

        with self._tx(settle=True, witness=committed) as c:
            c.execute(
                self._q["api_key_insert"],
                {
                    "id": key.id,
                    "key_hash": key_hash,
                    "tenant": key.tenant,
                    "role": key.role.value,
                    "now": to_us(key.created_at),
                },
            )

    def api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        with self._read() as c:
            row = c.execute(self._q["api_key_by_hash"], {"key_hash": key_hash}).fetchone()
        return api_key_of(row) if row else None

    def api_key_list(self) -> list[ApiKey]:
        with self._read() as c:
            return [api_key_of(r) for r in c.execute(self._q["api_key_list"])]

    def api_key_revoke(self, key_id: str) -> bool:
        with self._tx(settle=True) as c:
            return (
                c.execute(self._q["api_key_revoke"], {"id": key_id, "now": self._now_us()}).rowcount
                > 0
            )

    def api_key_count_active(self) -> int:
        with self._read() as c:
            count: int = c.execute(self._q["api_key_count_active"]).fetchone()[0]
        return count

    def api_key_get(self, key_id: str) -> ApiKey | None:
        with self._read() as c:
            row = c.execute(self._q["api_key_get"], {"id": key_id}).fetchone()
        return api_key_of(row) if row else None

    @retried
    def secret_get_or_create(self, name: str, value: str) -> str:
        with self._tx() as c:
            c.execute(
                self._q["secret_insert"], {"name": name, "value": value, "now": self._now_us()}
            )
            stored: str = c.execute(self._q["secret_get"], {"name": name}).fetchone()[0]
        return stored

    # --- task catalog -----------------------------------------------------------------------
    @retried
    def task_publish(self, worker: str, tasks: Sequence[TaskDefaults]) -> None:
        if not tasks:
            return
        with self._tx() as c:
            now = self._now_us()
            c.executemany(
                self._q["task_publish"],
                [
                    {
                        "name": t.name,
                        "max_attempts": t.retry.max_attempts,
                        "backoff_base": t.retry.backoff_base,
                        "backoff_cap": t.retry.backoff_cap,
                        "timeout": t.timeout,
                        "is_async": t.is_async,
                        "worker": worker,
                        "now": now,
                    }
                    for t in sorted(tasks, key=lambda t: t.name)  # one lock order for every worker
                ],
            )

    def task_catalog(
        self, seen_within: float, names: Sequence[str] | None = None
    ) -> list[PublishedTask]:
        since = self._now_us() - int(seen_within * 1_000_000)
        with self._read() as c:
            if names is None:
                rows = c.execute(self._q["task_catalog"], {"since": since}).fetchall()
            else:
                # A name no stored text can be (NUL, a lone surrogate) is nobody's task; sent to
                # PostgreSQL it would be an error, not an answer.
                storable = [n for n in names if validation.storable(n)]
                params = {"since": since, "names": batch_json(storable)}
                rows = c.execute(self._q["task_catalog_of_names"], params).fetchall()
        return [published_task_of(r) for r in rows]
