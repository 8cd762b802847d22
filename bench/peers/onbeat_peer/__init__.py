"""onbeat's distributed fleet on PostgreSQL: ``onbeat scheduler`` + 2 ``onbeat worker``, the
table queue in the same database, as ``bench/fleet.py`` runs it. (``embedded.py``: the node.)"""

from bench.peers.spec import PeerSpec

APP = "bench.peers.onbeat_peer.app:app"
CREATE_CRON_JOBS = ("python", "-m", "bench.peers.onbeat_peer.app", "cron")

SPEC = PeerSpec(
    name="onbeat",
    services=("postgres",),
    setup=(("onbeat", "migrate"), CREATE_CRON_JOBS),
    workers=(
        ("onbeat", "scheduler"),
        ("onbeat", "worker", "--app", APP),
        ("onbeat", "worker", "--app", APP),
    ),
    names=("scheduler", "worker-0", "worker-1"),
    environment={
        "ONBEAT_DATABASE_URL": "{database_url}",
        "ONBEAT_QUEUE_URL": "{database_url}",
        "ONBEAT_MIGRATE": "false",
        "ONBEAT_LOG_LEVEL": "WARNING",
    },
    app="bench.peers.onbeat_peer.app",
    repo_venv=True,
    config=(
        "`onbeat migrate` once, then 1 `onbeat scheduler` + 2 `onbeat worker` (the fleet bench's "
        "shape, docs/deploy.md 'Processes': one scheduler is enough for load, a worker per core) "
        "with onbeat's default settings (concurrency 64, claim batch 256, poll 0.2 s, window "
        "30 s; the docs recommend nothing else for a 2-core box) and `--no-migrate` "
        "(`ONBEAT_MIGRATE=false`, deploy.md: migrate once per deploy); log level WARNING (INFO "
        "logs two lines per run; the peers run at WARNING too). Queue: the PostgreSQL table in "
        "the store's database (`queue_url` = the database URL): docs/deploy.md 'When Redis "
        "pays': 'a fleet of a few workers is well served by PostgreSQL alone' (Redis pays for "
        "tens of idle workers or a database that is the bottleneck), and bench/fleet.py drained "
        "faster with lower CPU per run on the table queue on this box. W1/W2: `App.submit_many`, "
        "1,000 jobs a transaction (`at=` for W2); W3: 10,000 every-minute cron jobs stored by the "
        "setup step (`submit_many`, idempotency key `peers-cron-<i>`), fired by the scheduler; "
        "a run's planned time is its `ctx.scheduled_for`."
    ),
)
