"""The peers' no-op task body: one line per run, ``run_id planned started`` (epoch seconds), appended
to a file of the process's own with a single ``write()`` (O_APPEND), so the driver counts starts,
lost and duplicated runs without asking the peer. Standard library only: the peers' venvs
import it.

Runs whose id starts with ``probe`` (the driver's readiness check) go to ``probe-<pid>.txt``,
the others to ``starts-<pid>.txt`` (what ``bench.fleet_measure.Starts`` reads)."""

from __future__ import annotations

import math
import os
import time

LEDGER_DIR = "PEERS_LEDGER_DIR"
CRON_EARLY = 5.0
"""A cron run that starts up to this many seconds before a minute boundary is counted for that
boundary (as early); later than ``60 - CRON_EARLY`` after it, it would count for the next one."""

_files: dict[str, int] = {}


def _fd(kind: str) -> int:
    # by path, which names the pid: a forked child (Celery's prefork pool, RQ) opens its own
    path = os.path.join(os.environ[LEDGER_DIR], f"{kind}-{os.getpid()}.txt")
    fd = _files.get(path)
    if fd is None:
        fd = _files[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return fd


def record(run_id: str, planned: float, started: float | None = None) -> None:
    """One run of ``run_id``, due at ``planned``, started now (or at ``started``)."""
    started = time.time() if started is None else started
    kind = "probe" if run_id.startswith("probe") else "starts"
    os.write(_fd(kind), f"{run_id} {planned:.6f} {started:.6f}\n".encode())


def cron_fire_time(started: float) -> float:
    """The minute boundary a cron run that started at ``started`` belongs to, for a peer that
    does not tell its task the fire time (Celery, RQ, APScheduler, PgQueuer): a run more than
    ``60 - CRON_EARLY`` s late counts for the next boundary (as an early start, or a duplicate)."""
    return float(math.floor((started + CRON_EARLY) / 60) * 60)


def record_cron(job: int | str, fire: float | None = None) -> None:
    """One run of every-minute cron job ``job``; its id is ``c<job>@<fire time>``. ``fire``:
    the fire time the peer gave the run, if it gives one (else ``cron_fire_time``)."""
    started = time.time()
    fire = cron_fire_time(started) if fire is None else fire
    record(f"c{job}@{int(fire)}", fire, started)
