"""Catches a stall in the act: when no run has started for ``STALL_SECONDS`` during the load,
what every process of the fleet and the database were doing right then goes to
``stalls.jsonl`` (a ``py-spy dump`` of each process, PostgreSQL's non-idle sessions).

A full N1 once had 12 s without a start and nothing in any log; by the time the checker looked,
the database and the processes were gone. Starts are read from the ledgers' sizes (every start
appends a line), so watching costs one ``stat`` per ledger a second. A stall is recorded once,
then again only after starts resume. A stall during a fault (PostgreSQL stopped) is recorded
like any other: the timeline says which were planned.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

STALL_SECONDS = 3.0
"""Seconds without a new ledger line, during the load, that count as a stall."""
PG_ACTIVITY = """
    SELECT pid, application_name, state, wait_event_type, wait_event, backend_type,
           round(extract(epoch FROM now() - xact_start)::numeric, 3) AS xact_seconds,
           round(extract(epoch FROM now() - query_start)::numeric, 3) AS query_seconds,
           left(query, 300) AS query
    FROM pg_stat_activity
    WHERE state IS DISTINCT FROM 'idle' AND pid <> pg_backend_pid()
    ORDER BY xact_start NULLS LAST
"""


def py_spy() -> str | None:
    """The py-spy beside this interpreter (a dev dependency), else one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class StallWatch:
    """From a thread of its own, between ``start`` and ``stop``."""

    def __init__(
        self, ledger: Path, out: Path, pids: Callable[[], dict[str, int]], db: str | None
    ) -> None:
        """``pids``: the fleet's processes now, by name; ``db``: a PostgreSQL URL, or None."""
        self._ledger, self._out, self._pids, self._db = ledger, out, pids, db
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self.stalls = 0
        self._size, self._grew_at, self._recorded = 0, 0.0, False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _ledger_bytes(self) -> int:
        total = 0
        for path in self._ledger.glob("*.jsonl"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def _watch(self) -> None:
        self._size, self._grew_at = self._ledger_bytes(), time.monotonic()
        while not self._stop.wait(1.0):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One look at the ledgers, at monotonic time ``now``: record a stall that just reached
        ``STALL_SECONDS``."""
        size = self._ledger_bytes()
        if size != self._size:
            self._size, self._grew_at, self._recorded = size, now, False
        elif not self._recorded and now - self._grew_at >= STALL_SECONDS:
            self._recorded = True
            self._record(now - self._grew_at)

    def _record(self, quiet_for: float) -> None:
        snapshot: dict[str, Any] = {"at": time.time(), "seconds_without_a_start": quiet_for}
        snapshot["postgres"] = self._pg_activity()
        snapshot["processes"] = {name: _dump(pid) for name, pid in self._pids().items()}
        with self._out.open("a") as out:
            out.write(json.dumps(snapshot, default=str) + "\n")
        self.stalls += 1

    def _pg_activity(self) -> list[dict[str, Any]] | str | None:
        if self._db is None:
            return None
        try:
            with psycopg.connect(self._db, connect_timeout=2, autocommit=True) as conn:
                cur = conn.execute(PG_ACTIVITY)
                columns = [c.name for c in cur.description or ()]
                return [dict(zip(columns, row, strict=True)) for row in cur]
        except psycopg.Error as exc:
            return f"unreachable: {exc}"


def _dump(pid: int) -> str:
    tool = py_spy()
    if tool is None:
        return "py-spy is not installed"
    try:  # --nonblocking: read the stacks without pausing the process (a frozen one too)
        done = subprocess.run(
            [tool, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except subprocess.TimeoutExpired:
        return "py-spy dump timed out"
    return done.stdout or done.stderr
