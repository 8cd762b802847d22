"""What ``bench/fleet.py`` measures, apart from the fleet it starts: CPU time and peak RSS of
processes from ``/proc`` (``CpuMonitor``, which also finds the fleet's PostgreSQL backends), the
statements the fleet's backends execute (``PgSampler``), and the start lines the workers write
(``Starts``: start delays, lost, duplicated and early runs)."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

CLK_TCK = os.sysconf("SC_CLK_TCK")
LATE = 1.0
"""A run that starts more than this many seconds after it was due "fell behind"."""


# --- processes and /proc --------------------------------------------------------------------------
def proc_cpu_seconds(pid: int, reaped_children: bool = False) -> float | None:
    """utime + stime of ``pid`` (None once it is gone), plus cutime + cstime (its children that
    ended and that it waited for) if ``reaped_children``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def proc_peak_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def proc_rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` now (VmRSS), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


@dataclass
class Tracked:
    name: str
    group: str
    """What it is summed under: the role (scheduler, worker-0, ...), postgres, redis."""
    baseline: float = 0.0
    last: float = 0.0
    peak_rss_mib: float | None = None
    reaped_children: bool = False
    """Its figure includes the children it forked, ran and waited for (``bench/peers``: RQ's
    work horse per job, too short-lived to be sampled)."""
    in_parent: bool = False
    """A child whose parent counts ``reaped_children``: once it is gone, its time is in the
    parent's figure, so it is not counted again."""
    gone: bool = False


class CpuMonitor:
    """Samples, every ``interval``, the CPU time of the processes it is given and of the
    PostgreSQL backends serving the fleet (found by ``application_name`` in pg_stat_activity,
    so other sessions on the shared server are not counted; grouped by the process they serve,
    ``postgres:worker-0``..., or ``postgres:queue`` for the table queue's own connections) and of PostgreSQL's background
    processes (server-wide: checkpointer, walwriter, autovacuum...). A process's figure is its
    CPU time since ``mark`` (or since it appeared); a backend that exits between two samples
    loses at most one interval."""

    def __init__(
        self,
        admin_url: str,
        app_names: Sequence[str],
        interval: float = 0.5,
        databases: Sequence[str] = (),
        unnamed_role: str = "queue",
    ) -> None:
        self.admin_url, self.app_names, self.interval = admin_url, list(app_names), interval
        self.databases = list(databases)
        """Every client backend of these databases counts too (``bench/peers``: a peer's own)."""
        self.unnamed_role = unnamed_role
        """The role of a counted backend whose ``application_name`` names none."""
        self.tracked: dict[int, Tracked] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(
        self,
        pid: int,
        name: str,
        group: str,
        reaped_children: bool = False,
        in_parent: bool = False,
    ) -> None:
        with self._lock:
            self.tracked[pid] = Tracked(
                name, group, reaped_children=reaped_children, in_parent=in_parent
            )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cpu-monitor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self._stop.is_set():
                self.sample(conn)
                self._stop.wait(self.interval)
            self.sample(conn)

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT pid, backend_type, application_name FROM pg_stat_activity"
            " WHERE (backend_type = 'client backend'"
            " AND (application_name LIKE ANY(%s) OR datname = ANY(%s)))"
            " OR backend_type <> 'client backend'",
            (self.app_names, self.databases),
        ).fetchall()
        with self._lock:
            for pid, backend_type, app_name in rows:
                if pid not in self.tracked:
                    client = backend_type == "client backend"
                    role = app_name.rsplit("/", 1)[-1] if "/" in app_name else self.unnamed_role
                    group = f"postgres:{role}" if client else "postgres_background"
                    self.tracked[pid] = Tracked(f"pg:{backend_type}", group)
            for pid, t in self.tracked.items():
                cpu = proc_cpu_seconds(pid, t.reaped_children)
                if cpu is None:
                    t.gone = True
                    continue
                if t.last == 0.0 and t.baseline == 0.0 and t.group == "postgres_background":
                    t.baseline = cpu  # a server-wide process: count from when we first saw it
                t.last = cpu
                peak = None if t.group.startswith("postgres") else proc_peak_rss_mib(pid)
                if peak is not None:  # None also for a zombie, which has no memory left
                    t.peak_rss_mib = peak

    def mark(self) -> None:
        """From now on: each process's CPU counts from its current value."""
        with self._lock:
            for pid, t in self.tracked.items():
                cpu = proc_cpu_seconds(pid, t.reaped_children)
                t.baseline = t.last = cpu if cpu is not None else t.last

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def report(self) -> dict[str, Any]:
        """CPU seconds per group (backends summed), and peak RSS of the non-PostgreSQL ones."""
        out: dict[str, Any] = {}
        with self._lock:
            for t in self.tracked.values():
                if t.in_parent and t.gone:
                    continue
                entry = out.setdefault(t.group, {"cpu_s": 0.0, "processes": 0})
                entry["cpu_s"] = round(entry["cpu_s"] + max(0.0, t.last - t.baseline), 3)
                entry["processes"] += 1
                if t.peak_rss_mib is not None:
                    entry["peak_rss_mib"] = round(max(entry.get("peak_rss_mib", 0), t.peak_rss_mib))
        return out


class PgSampler:
    """A poor man's pg_stat_statements (which needs a server restart to load): every
    ``interval``, the statements the fleet's backends are executing (``state = 'active'`` in
    pg_stat_activity), named by their ``-- name:`` in queries.sql, with what they wait on. The
    share of samples is each statement's share of the backends' busy wall time."""

    def __init__(self, admin_url: str, app_names: Sequence[str], interval: float = 0.01) -> None:
        from onbeat.store.queries import load_queries

        self.admin_url, self.app_names, self.interval = admin_url, list(app_names), interval
        queries = load_queries("postgres").items()
        self.patterns = [(self._pattern(body), name) for name, body in queries]
        self.prefixes = [(self._shape(self._normal(body)), name) for name, body in queries]
        """For a statement pg_stat_activity cut short: its text up to the cut, parameters as ?."""
        self.counts: dict[str, int] = {}
        self.waits: dict[str, int] = {}
        self.samples = 0
        self._names: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pg-sampler", daemon=True)

    @staticmethod
    def _normal(sql: str) -> str:
        lines = (line for line in sql.splitlines() if not line.lstrip().startswith("--"))
        return " ".join(" ".join(lines).split()).rstrip("; ")

    @staticmethod
    def _shape(sql: str) -> str:
        """Parameters (``:name`` in queries.sql, ``$n`` on the server) as ``?``."""
        return re.sub(r"(?<!:):\w+|\$\d+", "?", sql)

    def _pattern(self, body: str) -> re.Pattern[str]:
        """The statement as the server shows it: ``:name`` parameters became ``$n``."""
        pieces = re.split(r"(?<!:):\w+", self._normal(body))
        return re.compile(r"\$\d+".join(re.escape(piece) for piece in pieces))

    def name_of(self, query: str) -> str:
        name = self._names.get(query)
        if name is None:
            text = self._normal(query)
            found = [n for pattern, n in self.patterns if pattern.fullmatch(text)]
            if not found and len(query) >= 1000:  # cut by track_activity_query_size
                shape = self._shape(text)[:-20]  # the cut may split a parameter's number
                found = [n for prefix, n in self.prefixes if prefix.startswith(shape)]
            name = found[0] if found else text[:40]
            self._names[query] = name
        return name

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU')"
                    " FROM pg_stat_activity WHERE state = 'active'"
                    " AND application_name LIKE ANY(%s)",
                    (self.app_names,),
                ).fetchall()
                self.samples += 1
                for query, wait in rows:
                    name = self.name_of(query)
                    self.counts[name] = self.counts.get(name, 0) + 1
                    key = f"{name} {wait}"
                    self.waits[key] = self.waits.get(key, 0) + 1
                self._stop.wait(self.interval)

    def report(self, top: int = 15) -> dict[str, Any]:
        """Per statement: backends busy in it, on average (1.0 = one backend all the time)."""
        n = max(1, self.samples)
        busy = sorted(self.counts.items(), key=lambda kv: -kv[1])[:top]
        waits = sorted(self.waits.items(), key=lambda kv: -kv[1])[:top]
        return {
            "samples": self.samples,
            "busy_backends": round(sum(self.counts.values()) / n, 3),
            "by_statement": {k: round(v / n, 3) for k, v in busy},
            "by_statement_and_wait": {k: round(v / n, 3) for k, v in waits},
        }


class Starts:
    """Reads the start lines the workers append, incrementally: ``(execution_id,
    scheduled_for, started)`` per run started."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.runs: list[tuple[str, float, float]] = []
        self._offsets: dict[Path, int] = {}

    def read(self) -> int:
        for path in sorted(self.directory.glob("starts-*.txt")):
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line being written has no newline yet
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in chunk[:end].decode().splitlines():
                eid, scheduled, started = line.split()
                self.runs.append((eid, float(scheduled), float(started)))
        return len(self.runs)

    def wait_for(self, count: int, deadline: float) -> bool:
        while self.read() < count:
            if time.time() > deadline:
                return False
            time.sleep(0.2)
        return True

    def figures(self, expected: int) -> dict[str, Any]:
        return start_figures(self.runs, expected)


def start_figures(runs: Sequence[tuple[str, float, float]], expected: int) -> dict[str, Any]:
    """Start delays (first start of each run), early starts, lost and duplicated, of ``expected``
    runs given their start lines ``(run_id, scheduled, started)``."""
    first: dict[str, tuple[float, float]] = {}
    times: dict[str, int] = {}
    for eid, scheduled, started in runs:
        times[eid] = times.get(eid, 0) + 1
        if eid not in first:
            first[eid] = (scheduled, started)
    delays = sorted(started - scheduled for scheduled, started in first.values())
    starts = sorted(started for _, started in first.values())
    return {
        "started": len(first),
        "lost": max(0, expected - len(first)),
        "duplicated": sum(1 for n in times.values() if n > 1),
        "early": sum(1 for d in delays if d < 0),
        "delay_p50_s": round(percentile(delays, 50), 3),
        "delay_p95_s": round(percentile(delays, 95), 3),
        "delay_p99_s": round(percentile(delays, 99), 3),
        "delay_max_s": round(delays[-1], 3) if delays else None,
        "late_over_1s": sum(1 for d in delays if d > LATE),
        "first_start": starts[0] if starts else None,
        "last_start": starts[-1] if starts else None,
    }


def drain_figures(
    figures: dict[str, Any], n: int, submit_s: float, launched: float
) -> dict[str, Any]:
    """W1's rates from ``start_figures``: submission, first start after the workers' launch,
    and the drain (first start to last start)."""
    first, last = figures["first_start"], figures["last_start"]
    return {
        "runs": n,
        "submit_per_s": round(n / submit_s),
        "first_start_after_launch_s": round(first - launched, 2) if first else None,
        "drain_per_s": round((n - 1) / (last - first)) if first and last and last > first else None,
        "drain_s": round(last - first, 2) if first and last else None,
    }
