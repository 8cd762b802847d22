"""Celery on Redis: one prefork worker with 2 children (its default on 2 cores); beat for W3."""

from bench.peers.spec import PeerSpec

_APP = ("-A", "bench.peers.celery.app")

SPEC = PeerSpec(
    name="celery",
    services=("redis",),
    workers=(("celery", *_APP, "worker", "--concurrency", "2", "--loglevel", "WARNING"),),
    config=(
        "one `celery worker` with the prefork pool and `--concurrency 2` (the default: "
        "'Number of child processes... The default is the number of CPUs'; prefork is "
        "'recommended for most users', docs.celeryq.dev userguide/concurrency), default "
        "prefetch multiplier 4, Redis broker, results ignored. W2: `apply_async(eta=...)`; W3: "
        "`celery beat` with one `crontab()` entry per job."
    ),
    cron="scheduler",
    scheduler=("celery", *_APP, "beat", "--loglevel", "WARNING"),
)
