"""The alert outbox's transactions: schedulers claim alerts, deliver them, and forget or retry them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from onbeat.batch_json import batch_json
from onbeat.store.base import PendingAlert
from onbeat.store.rows import from_us, to_us
from onbeat.store.sql_store.base import SQLBase, retried


class AlertTransactions(SQLBase):
    """``alert_claim``, ``alert_done`` and ``alert_retry`` (alerts are written by ``_dead_letter``
    and ``_alert_skips`` in the transactions that record what they report)."""

    @retried
    def alert_claim(self, limit: int, hold: float) -> list[PendingAlert]:
        now = self._now_us()
        with self._tx() as c:
            rows = c.execute(self._q["alerts_due"], {"now": now, "limit": limit}).fetchall()
            if rows:
                c.execute(
                    self._q["alerts_hold"],
                    {
                        "ids": batch_json([r["id"] for r in rows]),
                        "until": now + int(hold * 1_000_000),
                    },
                )
        return [
            PendingAlert(
                id=r["id"],
                kind=r["kind"],
                job_id=r["job_id"],
                tenant=r["tenant"],
                task=r["task"],
                payload=json.loads(r["payload"]),
                created_at=from_us(r["created_at"]),
                attempts=r["attempts"] + 1,
            )
            for r in rows
        ]

    def alert_done(self, alert_ids: Sequence[int]) -> None:
        if alert_ids:
            with self._tx() as c:
                c.execute(self._q["alerts_delete"], {"ids": batch_json(list(alert_ids))})

    def alert_retry(self, retries: Mapping[int, tuple[datetime, str]]) -> None:
        if retries:
            with self._tx() as c:
                c.executemany(
                    self._q["alert_retry"],
                    [
                        {"id": alert_id, "next_attempt_at": to_us(at), "error": error}
                        for alert_id, (at, error) in retries.items()
                    ],
                )
