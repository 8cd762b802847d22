"""Procrastinate on PostgreSQL: 2 ``procrastinate worker`` processes, 10 concurrent jobs each."""

from bench.peers.spec import PeerSpec

_APP = ("procrastinate", "--app", "bench.peers.procrastinate.app.app")
_WORKER = (*_APP, "worker", "--concurrency", "10")

SPEC = PeerSpec(
    name="procrastinate",
    services=("postgres",),
    setup=((*_APP, "schema", "--apply"),),
    workers=(_WORKER, _WORKER),
    config=(
        "2 x `procrastinate worker --concurrency 10` (psycopg 3 connector, LISTEN/NOTIFY on; "
        "one asyncio process per core). The worker's default concurrency is 1 job at a time "
        "(`procrastinate worker --help`: 'Number of parallel asynchronous jobs'); 10 matches "
        "arq's default max_jobs and PgQueuer's dequeue batch. W1/W2 submitted with "
        "`batch_defer_async` (`schedule_at` for W2); W3: `app.periodic(cron=..., periodic_id=i)`, "
        "deferred by every worker's periodic deferrer."
    ),
)
