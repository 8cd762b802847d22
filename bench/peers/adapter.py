"""What every peer's app module shares in the peer's venv (standard library only): the settings
the driver passes in the environment, and the command line that submits a workload::

    python -m bench.peers.<peer>.app submit --prefix w1 --count 20000 [--at EPOCH]

``submit(ids, at)`` is the peer's own: it makes one run per id of the no-op task with arguments
``(run_id, planned)``, due now (``at`` None) or at epoch second ``at``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

DATABASE_URL = os.environ.get("PEERS_DATABASE_URL", "")
REDIS_URL = os.environ.get("PEERS_REDIS_URL", "")
APP_NAME = os.environ.get("PGAPPNAME", "peers/peer")
"""This process's PostgreSQL ``application_name`` (libpq reads PGAPPNAME itself; asyncpg does not)."""
CRON_JOBS = int(os.environ.get("PEERS_CRON_JOBS", "0") or 0)
"""W3: how many every-minute cron jobs the peer's processes register (0: none)."""
EVERY_MINUTE = "* * * * *"

Submit = Callable[[list[str], float | None], None]
LIVE = False
"""Set by ``--live``: the peer's processes are running (APScheduler takes runs through its
running scheduler then, and from its job store before it starts)."""


def run_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]


def main(submit: Submit, argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["submit"])
    p.add_argument("--prefix", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--at", type=float, help="epoch seconds the runs are due (default: now)")
    p.add_argument("--live", action="store_true", help="the peer's processes are running")
    args = p.parse_args(argv)
    global LIVE
    LIVE = args.live
    t0 = time.perf_counter()
    submit(run_ids(args.prefix, args.count), args.at)
    print(f"submitted {args.count} in {time.perf_counter() - t0:.3f} s", file=sys.stderr)
    return 0
