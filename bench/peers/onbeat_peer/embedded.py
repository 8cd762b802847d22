"""The onbeat embedded node: one ``onbeat up`` process (scheduler and worker, in-process delay
queue) on a SQLite file; the same app as the distributed entry (``bench.peers.onbeat_peer.app``)."""

from bench.peers.onbeat_peer import APP, CREATE_CRON_JOBS
from bench.peers.spec import PeerSpec

SPEC = PeerSpec(
    name="onbeat-embedded",
    services=(),
    setup=(("onbeat", "migrate"), CREATE_CRON_JOBS),
    workers=(("onbeat", "up", "--no-api", "--app", APP),),
    names=("node",),
    environment={
        "ONBEAT_DATABASE_URL": "sqlite:///{workdir}/onbeat.db",
        "ONBEAT_MIGRATE": "false",
        "ONBEAT_LOG_LEVEL": "WARNING",
    },
    app="bench.peers.onbeat_peer.app",
    repo_venv=True,
    config=(
        "one `onbeat up --no-api` process on a SQLite file (WAL) with the in-process `memory://` "
        "delay queue: the embedded node, README 'one machine, one process', with onbeat's "
        "default settings (concurrency 64, claim batch 256, poll 0.2 s); the REST API is off "
        "(`--no-api`: idle it costs nothing, and its fixed port 8000 could clash on a shared "
        "box). The store migrated by `onbeat migrate` first; log level WARNING. Submissions "
        "come from another process through `App.submit_many` on the same file (1,000 jobs a "
        "transaction), which the node notices by its poll (another process cannot wake it); "
        "W3: the cron jobs stored before the node starts, as for the fleet."
    ),
)
