"""Dramatiq on Redis: ``dramatiq`` with 2 worker processes x 8 threads (its defaults on 2 cores)."""

from bench.peers.spec import PeerSpec

SPEC = PeerSpec(
    name="dramatiq",
    services=("redis",),
    workers=(("dramatiq", "bench.peers.dramatiq.app", "--processes", "2", "--threads", "8"),),
    config=(
        "`dramatiq --processes 2 --threads 8` on the Redis broker: the CLI's defaults on this "
        "box (processes = CPU count, 8 threads each; dramatiq.io 'Worker' / `dramatiq --help`), "
        "default middleware. W2 uses `send_with_options(delay=...)` (the broker's delay queue)."
    ),
    cron="n/a: Dramatiq has no periodic or cron scheduling (its docs point to APScheduler)",
)
