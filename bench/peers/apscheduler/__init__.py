"""APScheduler 3 with a SQLAlchemy job store on PostgreSQL: one scheduler process."""

from bench.peers.spec import PeerSpec

SPEC = PeerSpec(
    name="apscheduler",
    services=("postgres",),
    workers=(("python", "-m", "bench.peers.apscheduler.app", "run"),),
    config=(
        "one `BlockingScheduler` process with a `SQLAlchemyJobStore` on PostgreSQL (psycopg 3) "
        "and the default `ThreadPoolExecutor` (10 threads); APScheduler 3 does not share a job "
        "store between schedulers ('Limitations: sharing a persistent job store among two or "
        "more processes will lead to incorrect scheduler behavior', apscheduler.readthedocs.io "
        "3.x userguide), so one process is its 2-core setup. `misfire_grace_time=None` (the "
        "default, 1 s, would skip every run started more than 1 s late: lost, not late). W1 "
        "jobs are written to the store before the scheduler starts; W2 jobs are added with "
        "`add_job` inside the running scheduler (another process's writes to the store are not "
        "seen until its next wake-up); W3: 10,000 `cron` jobs added at start."
    ),
)
