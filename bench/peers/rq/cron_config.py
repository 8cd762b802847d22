"""``rq cron``'s configuration: ``CRON_JOBS`` every-minute jobs."""

from rq import cron

from bench.peers import adapter
from bench.peers.rq.app import cron_noop

for _i in range(adapter.CRON_JOBS):
    cron.register(cron_noop, queue_name="default", args=(_i,), cron=adapter.EVERY_MINUTE)
