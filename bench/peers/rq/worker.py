"""Starts ``rq worker --with-scheduler`` (or ``rq cron``) on the URL the driver passes in the
environment (the spec is fixed before the driver picks the private Redis port)."""

from __future__ import annotations

import os
import sys

from bench.peers import adapter

if __name__ == "__main__":
    rq = os.path.join(os.path.dirname(sys.executable), "rq")
    if sys.argv[1:] == ["cron"]:
        argv = [rq, "cron", "bench.peers.rq.cron_config", "--url", adapter.REDIS_URL,
                "--logging-level", "warning"]  # fmt: skip
    else:
        argv = [rq, "worker", "--with-scheduler", "--url", adapter.REDIS_URL,
                "--logging_level", "WARNING"]  # fmt: skip
    os.execv(rq, argv)
