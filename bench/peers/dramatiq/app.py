"""Dramatiq's app: the ``noop`` actor on the Redis broker; submission with ``send`` /
``send_with_options(delay=...)``, one message at a time (the broker has no bulk enqueue)."""

from __future__ import annotations

import sys
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import adapter, ledger

broker = RedisBroker(url=adapter.REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def noop(run_id: str, planned: float) -> None:
    ledger.record(run_id, planned)


def submit(ids: list[str], at: float | None) -> None:
    for run_id in ids:
        if at is None:
            noop.send(run_id, time.time())
        else:
            delay_ms = max(0, int((at - time.time()) * 1000))
            noop.send_with_options(args=(run_id, at), delay=delay_ms)


if __name__ == "__main__":
    sys.exit(adapter.main(submit))
