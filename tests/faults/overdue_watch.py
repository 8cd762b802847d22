"""Where the late runs wait: every ``LOOK_EVERY`` seconds of the load, the runs the store calls
queued and due more than ``OVERDUE_AFTER`` ago, and where each is held, go to ``overdue.jsonl``:
the fallback table, Redis (its shard's sorted set, with the item's score and the index's head of
that shard and tier: a head later than the item, or none, means no claim visits the shard), or
neither (the sweep's to find). A short N1 once had 1 % of its runs start 20-157 s late in clumps
while the rest started in 2 s, and nothing said where they had waited.

The report gets the distinct late runs seen per place (reported, not a pass line)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import redis

from tests.faults.checker import Report
from tests.faults.redis_faults import FALLBACK_TABLE, QUEUE_PREFIX

LOOK_EVERY = 5.0
OVERDUE_AFTER = 10.0
"""Seconds past due, of a run still queued, that make it worth a look."""
MOST = 200
"""Runs looked at per look (the longest overdue first)."""


class OverdueWatch:
    """From a thread of its own, between ``start`` and ``stop``."""

    def __init__(self, database_url: str, redis_url: str, out: Path) -> None:
        self._db, self._redis_url, self._out = database_url, redis_url, out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="overdue-watch", daemon=True)
        self._where: dict[str, str] = {}
        """run -> where it was last seen late"""
        self._longest = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def report(self, report: Report) -> None:
        places = Counter(self._where.values())
        report.metrics |= {
            "overdue_runs_seen": len(self._where),
            "overdue_in_redis": places["redis"],
            "overdue_in_redis_unindexed": places["redis, not indexed"],
            "overdue_in_table": places["table"],
            "overdue_in_neither": places["neither"],
            "overdue_longest": round(self._longest, 1),
        }

    def _watch(self) -> None:
        client = redis.Redis.from_url(self._redis_url, decode_responses=True, socket_timeout=2)
        with self._out.open("a") as out:
            while not self._stop.wait(LOOK_EVERY):
                try:
                    for line in self._look(client):
                        out.write(json.dumps(line) + "\n")
                    out.flush()
                except (psycopg.Error, redis.RedisError):
                    continue  # a fault is on: the next look
        client.close()

    def _look(self, client: redis.Redis) -> list[dict[str, Any]]:
        now_us = int(time.time() * 1e6)
        with psycopg.connect(self._db, connect_timeout=2) as conn:
            rows = conn.execute(
                "SELECT id, shard, due_at FROM runs WHERE status = 'queued' AND due_at < %s"
                " ORDER BY due_at LIMIT %s",
                (now_us - int(OVERDUE_AFTER * 1e6), MOST),
            ).fetchall()
            if not rows:
                return []
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (FALLBACK_TABLE,))
            in_table: set[str] = set()
            if (row := exists.fetchone()) is not None and row[0]:
                held = conn.execute(
                    f"SELECT execution_id FROM {FALLBACK_TABLE} WHERE execution_id = ANY(%s)",
                    ([r[0] for r in rows],),
                )
                in_table = {r[0] for r in held}
        pipe = client.pipeline(transaction=False)
        for eid, shard, _ in rows:
            pipe.hget(f"{QUEUE_PREFIX}:{{{shard}}}:items", eid)
        tiers = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for (eid, shard, _), tier in zip(rows, tiers, strict=True):
            pipe.zscore(f"{QUEUE_PREFIX}:{{{shard}}}:due:{tier}", eid)
            pipe.zscore(f"{QUEUE_PREFIX}:{{index}}:due:{tier}", str(shard))
        scores = pipe.execute()
        lines = []
        for i, (eid, shard, due) in enumerate(rows):
            score, head = scores[2 * i], scores[2 * i + 1]
            if tiers[i] is not None:
                indexed = head is not None and head <= (score if score is not None else now_us)
                where = "redis" if indexed else "redis, not indexed"
            else:
                where = "table" if eid in in_table else "neither"
            self._where[eid] = where
            late = (now_us - due) / 1e6
            self._longest = max(self._longest, late)
            lines.append(
                {"t": now_us / 1e6, "run": eid, "shard": shard, "late": round(late, 2),
                 "where": where, "tier": tiers[i], "score": score, "index_head": head}
            )  # fmt: skip
        return lines
