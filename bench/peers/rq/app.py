"""RQ's app: the ``noop`` function, submission with ``enqueue_many`` (W1, pipelined, 1,000 a
batch) and ``enqueue_at`` (W2, in a pipeline per 1,000)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

from redis import Redis
from rq import Queue

from bench.peers import adapter, ledger

BATCH = 1_000
NOOP = "bench.peers.rq.app.noop"
"""By name: ``submit`` runs as ``__main__``, which the workers cannot import."""


def noop(run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


def cron_noop(job: int) -> None:
    ledger.record_cron(job)


def submit(ids: list[str], at: float | None) -> None:
    redis = Redis.from_url(adapter.REDIS_URL)
    queue = Queue("default", connection=redis)
    for first in range(0, len(ids), BATCH):
        chunk = ids[first : first + BATCH]
        with redis.pipeline() as pipe:
            if at is None:
                now = time.time()
                queue.enqueue_many(
                    [Queue.prepare_data(NOOP, (run_id, now)) for run_id in chunk], pipeline=pipe
                )
            else:
                when = datetime.fromtimestamp(at, UTC)
                for run_id in chunk:
                    queue.enqueue_at(when, NOOP, run_id, at, pipeline=pipe)
            pipe.execute()


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
