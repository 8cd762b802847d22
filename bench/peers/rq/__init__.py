"""RQ on Redis: 2 ``rq worker --with-scheduler`` processes (a forked work horse per job, the
default); ``rq cron`` for W3."""

from bench.peers.spec import PeerSpec

_WORKER = ("python", "-m", "bench.peers.rq.worker")

SPEC = PeerSpec(
    name="rq",
    services=("redis",),
    workers=(_WORKER, _WORKER),
    config=(
        "2 x `rq worker --with-scheduler` (one per core; the default `rq.Worker` forks a work "
        "horse per job, python-rq.org/docs/workers; the scheduler moves due `enqueue_at` jobs "
        "every second, python-rq.org/docs/scheduling). W1 with `Queue.enqueue_many` in a "
        "pipeline; W3: `rq cron` (RQ's built-in cron scheduler, 2.x) with one `cron.register` "
        "per job."
    ),
    cron="scheduler",
    scheduler=("python", "-m", "bench.peers.rq.worker", "cron"),
)
