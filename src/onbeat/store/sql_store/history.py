"""History upkeep: partitions ahead and retention of final runs and their attempts.

A day is a UTC day counted by fire time (``scheduled_for``): the unit of partitioning (PostgreSQL)
and of retention (every backend). A day before the retention line is kept whole while it holds an
unresolved dead letter (a human decides about those, never retention), a run not final yet (a
replayed dead letter, a retry of an old fire time: its attempts must stay with it) or a run that
ended within the retention (so a run is kept at least that long after it ended).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from onbeat.batch_json import batch_json
from onbeat.store.base import HistoryUpkeep
from onbeat.store.rows import to_us
from onbeat.store.sql_store.base import SQLBase

log = logging.getLogger("onbeat.store")
DAY_US = 86_400_000_000
"""A UTC day in microseconds: day partitions and retention are counted in these."""
DELETE_BATCH = 10_000
"""Rows retention deletes per transaction, so it never holds a long write lock."""


def day_of(when: datetime) -> int:
    """The UTC day number (days since the epoch) of ``when``."""
    return to_us(when) // DAY_US


def day_date(day: int) -> str:
    """``YYYYMMDD`` of a UTC day number: the suffix of its partitions' names."""
    return datetime.fromtimestamp(day * 86_400, UTC).strftime("%Y%m%d")


class HistoryTransactions(SQLBase):
    """History upkeep: partitions ahead (PostgreSQL) and retention (every backend)."""

    def history_maintain(self, retention_days: int, ahead_days: int) -> HistoryUpkeep:
        today = day_of(self.now())
        created = self._create_day_partitions(range(today - 1, today + ahead_days + 1))
        if retention_days <= 0:
            return HistoryUpkeep(created=created)
        first_kept = today - retention_days
        cutoff = first_kept * DAY_US
        with self._read() as c:
            protected = sorted(
                {
                    int(r[0])
                    for r in c.execute(self._q["history_protected_days"], {"cutoff": cutoff})
                }
            )
        if protected:
            log.info(
                "history retention keeps %d day(s) past %d days: unresolved dead letters, "
                "runs not final yet or ended lately (%s)",
                len(protected),
                retention_days,
                ", ".join(day_date(d) for d in protected[:10]),
            )
        dropped = self._drop_day_partitions(first_kept, protected)
        args = {"cutoff": cutoff, "days": batch_json(protected), "limit": DELETE_BATCH}
        deleted = self._delete_in_batches(self._q["history_delete_expired"], args)
        self._delete_in_batches(self._q["attempts_delete_expired"], args)
        return HistoryUpkeep(
            created=created, dropped=dropped, kept=[day_date(d) for d in protected], deleted=deleted
        )

    def _delete_in_batches(self, statement: str, args: dict[str, object]) -> int:
        """Run a batched DELETE (LIMIT ``DELETE_BATCH``), one transaction per batch, until a
        batch comes back short; the rows deleted."""
        deleted = 0
        while True:
            with self._tx() as c:
                n = c.execute(statement, args).rowcount
            deleted += n
            if n < DELETE_BATCH:
                return deleted

    # --- what a partitioning backend provides -----------------------------------------------
    def _create_day_partitions(self, days: Sequence[int]) -> list[str]:
        """Create the partitions of ``days`` that do not exist yet; their names. A backend without
        partitions has nothing to do."""
        return []

    def _drop_day_partitions(self, first_kept: int, protected: Sequence[int]) -> list[str]:
        """Drop the day partitions before ``first_kept`` except ``protected`` days; their names."""
        return []
