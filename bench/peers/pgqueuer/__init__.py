"""PgQueuer on PostgreSQL: two ``pgq run`` processes (one per core), dequeue batches of 25."""

from bench.peers.spec import PeerSpec

_RUN = ("pgq", "run", "bench.peers.pgqueuer.app:create", "--batch-size", "25")

SPEC = PeerSpec(
    name="pgqueuer",
    services=("postgres",),
    setup=(("pgq", "install"), ("pgq", "autovac")),
    workers=(_RUN, _RUN),
    config=(
        "2 x `pgq run --batch-size 25` (asyncpg driver, uvloop, LISTEN/NOTIFY), durable tables "
        "(the default) with `pgq autovac`. One process per core: PgQueuer's deployment guide, "
        "'One process per CPU core'; batch size raised from 10 to 25 for short jobs: its "
        "performance-tuning guide ('Increase batch_size when jobs are short-lived', example "
        "batch_size=25; https://janbjorge.github.io/pgqueuer/). Cron: `@pgq.schedule` in every "
        "worker (the schedules table lets one of them fire each entry)."
    ),
)
