"""arq on Redis: 2 ``arq`` worker processes with the default ``max_jobs`` of 10."""

from bench.peers.spec import PeerSpec

_WORKER = ("arq", "bench.peers.arq.app.WorkerSettings")

SPEC = PeerSpec(
    name="arq",
    services=("redis",),
    workers=(_WORKER, _WORKER),
    config=(
        "2 x `arq bench.peers.arq.app.WorkerSettings` (one asyncio process per core), defaults: "
        "max_jobs 10, poll_delay 0.5 s (arq docs, 'Worker'). W2 with `_defer_until`; W3: one "
        "`cron(..., second=0)` entry per job in every worker (`unique=True`, the default, lets "
        "one of them run each fire; arq fires at microsecond 123,456 by default)."
    ),
)
