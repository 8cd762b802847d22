"""One peer's run on this machine: its venv (made from its pinned requirements when they
change), a fresh PostgreSQL database and/or a private redis-server, the peer's processes (each in
a session of its own, so it is stopped with everything it forked) and its submissions, with the
CPU time of all of them counted by ``bench.fleet_measure.CpuMonitor``."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from tests.faults.fleet import PrivateRedis

from bench.fleet_measure import CpuMonitor
from bench.peers.spec import PeerSpec

REPO = Path(__file__).resolve().parents[2]
PEERS = Path(__file__).resolve().parent
VENVS = PEERS / ".venvs"
SERVER = os.environ.get("ONBEAT_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
PEER_NAMES = (
    "onbeat", "onbeat-embedded",
    "pgqueuer", "dramatiq", "celery", "procrastinate", "arq", "rq", "apscheduler",
)  # fmt: skip
"""onbeat first (its two modes), then the peers."""
SPEC_MODULES = {
    "onbeat": "bench.peers.onbeat_peer",
    "onbeat-embedded": "bench.peers.onbeat_peer.embedded",
}
"""Where a spec lives when it is not ``bench.peers.<name>``: both onbeat modes share one app, in
a package not named ``onbeat`` (``run.py``'s directory is on ``sys.path`` and would shadow it)."""
NOT_PEER = ("submit", "postgres:submit", "postgres_background")
"""CPU groups not counted as the peer's: the submitting process (and its backend), and
PostgreSQL's server-wide background processes (shared with everyone on the box)."""


def admin_connection(wait: float = 60) -> psycopg.Connection[Any]:
    """An autocommit connection to the server, retried while it refuses for a while (the shared
    server at ``max_connections`` under other test suites)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return psycopg.connect(SERVER, autocommit=True)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def load_spec(name: str) -> PeerSpec:
    spec: PeerSpec = importlib.import_module(SPEC_MODULES.get(name, f"bench.peers.{name}")).SPEC
    return spec


def ensure_venv(name: str) -> Path:
    """``.venvs/<name>`` with ``<name>/requirements.txt`` installed; rebuilt when that file
    changes (its hash is kept in the venv). The repo's ``.venv`` for a spec that asks for it."""
    if load_spec(name).repo_venv:
        return REPO / ".venv"
    requirements = PEERS / name / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    venv = VENVS / name
    stamp = venv / ".requirements.sha256"
    if stamp.exists() and stamp.read_text() == digest:
        return venv
    print(f"installing {name} into {venv} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-r", str(requirements)], check=True
    )
    stamp.write_text(digest)
    return venv


def children_of(pids: set[int]) -> dict[int, int]:
    """Every live descendant of ``pids``: ``{pid: its ancestor in pids}``."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    parent[int(entry.name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: dict[int, int] = {}
    for pid in parent:
        ancestor, seen = parent.get(pid), 0
        while ancestor is not None and ancestor > 1 and seen < 64:
            if ancestor in pids:
                found[pid] = ancestor
                break
            ancestor, seen = parent.get(ancestor), seen + 1
    return found


class PeerRun:
    """A context manager: ``with PeerRun(spec, venv, cron_jobs) as run: run.start_workers() ...``."""

    def __init__(self, spec: PeerSpec, venv: Path, cron_jobs: int = 0, keep: bool = False):
        self.spec, self.venv, self.cron_jobs, self.keep = spec, venv, cron_jobs, keep
        self.workdir = Path(tempfile.mkdtemp(prefix=f"onbeat-peers-{spec.name}-"))
        self.ledger = self.workdir / "ledger"
        self.ledger.mkdir()
        self.database = f"peers_{spec.name}_{uuid.uuid4().hex[:8]}"
        self.redis: PrivateRedis | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.monitor = CpuMonitor(SERVER, [], databases=[self.database], unnamed_role="peer")
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="descendants", daemon=True)
        self._probes = 0

    # --- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> PeerRun:
        if "postgres" in self.spec.services:
            with admin_connection() as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"')
        if "redis" in self.spec.services:
            self.redis = PrivateRedis(self.workdir / "redis")
            self.redis.start()
            assert self.redis.process is not None
            self.monitor.add(self.redis.process.pid, "redis-server", "redis")
        self.monitor.start()
        self._watcher.start()
        for i, argv in enumerate(self.spec.setup):
            done = self.run(argv, f"setup-{i}", timeout=300)
            if done.returncode:
                raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()
        self._stop.set()
        self._watcher.join(timeout=5)
        self.monitor.stop()
        if self.redis is not None:
            self.redis.stop()
        if "postgres" in self.spec.services and not self.keep:
            with admin_connection() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def env(self, name: str) -> dict[str, str]:
        database_url = f"postgresql://root@127.0.0.1:5432/{self.database}"
        redis_url = self.redis.url if self.redis else ""
        return {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",  # this tree's onbeat
            "PEERS_LEDGER_DIR": str(self.ledger),
            "PEERS_DATABASE_URL": database_url,
            "PEERS_REDIS_URL": redis_url,
            "PEERS_CRON_JOBS": str(self.cron_jobs),
            "PGHOST": "127.0.0.1",
            "PGPORT": "5432",
            "PGUSER": "root",
            "PGDATABASE": self.database,
            "PGAPPNAME": f"peers/{name}",
            **{
                key: value.format(
                    database_url=database_url, redis_url=redis_url, workdir=self.workdir
                )
                for key, value in self.spec.environment.items()
            },
        }

    def argv(self, argv: tuple[str, ...]) -> list[str]:
        return [str(self.venv / "bin" / argv[0]), *argv[1:]]

    def run(
        self, argv: tuple[str, ...], name: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(argv), cwd=REPO, env=self.env(name), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def start(self, argv: tuple[str, ...], name: str) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                self.argv(argv), cwd=REPO, env=self.env(name), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        self.monitor.add(proc.pid, name, name, reaped_children=True)
        return proc

    def start_workers(self, with_scheduler: bool = False) -> None:
        names = self.spec.names or [f"worker-{i}" for i in range(len(self.spec.workers))]
        for argv, name in zip(self.spec.workers, names, strict=True):
            self.start(argv, name)
        if with_scheduler and self.spec.scheduler is not None:
            self.start(self.spec.scheduler, "scheduler")

    def stop_all(self, timeout: float = 20) -> dict[str, int | None]:
        """SIGTERM to each process's session, SIGKILL after ``timeout``; exit statuses."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        statuses: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                statuses[name] = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                statuses[name] = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it forked, too
        return statuses

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name != "submit":
                raise RuntimeError(f"{name} exited ({proc.returncode}):\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # --- descendants ----------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.adopt_children()

    def adopt_children(self) -> None:
        """Count what the peer's processes forked (Celery's pool, Dramatiq's workers) under the
        process that forked them; a child that ended and was waited for (RQ's work horse per
        job, most too short-lived to be seen here) is in its parent's figure."""
        roots = {proc.pid: name for name, proc in self.procs.items()}
        known = set(self.monitor.tracked)
        for pid, root in children_of(set(roots)).items():
            if pid not in known:
                self.monitor.add(pid, f"{roots[root]}-child", roots[root], in_parent=True)

    # --- submitting -----------------------------------------------------------------------------
    def submit(self, prefix: str, count: int, at: float | None, timeout: float = 600) -> float:
        """``count`` runs of the no-op task through the peer's own client, in a process of the
        peer's venv (counted as ``submit``); returns the seconds it took."""
        t0 = time.time()
        argv = ("python", "-m", self.spec.app_module, "submit",
                "--prefix", prefix, "--count", str(count),
                *(("--at", f"{at:.6f}") if at is not None else ()),
                *(("--live",) if self.procs else ()))  # fmt: skip
        proc = self.start(argv, "submit")
        try:
            status = proc.wait(timeout=timeout)
        finally:
            self.procs.pop("submit")
        if status:
            raise RuntimeError(f"submit failed ({status}):\n{self.log_tail('submit')}")
        return time.time() - t0

    def wait_ready(self, timeout: float = 120) -> float:
        """Submits one probe run due now and waits until it started: the peer takes work.
        Returns the seconds it took."""
        self._probes += 1
        run_id = f"probe{self._probes}-0"
        t0 = time.time()
        self.submit(f"probe{self._probes}", 1, None)
        while not any(
            run_id in p.read_text(errors="replace") for p in self.ledger.glob("probe-*.txt")
        ):
            self.check_alive()
            if time.time() - t0 > timeout:
                raise RuntimeError(f"{self.spec.name}: probe not run in {timeout} s\n"
                                   + "\n".join(self.log_tail(n) for n in self.procs))  # fmt: skip
            time.sleep(0.1)
        return time.time() - t0

    def cpu_report(self) -> dict[str, Any]:
        with admin_connection() as conn:
            self.monitor.sample(conn)  # the backends end with the processes: last figures now
        return self.monitor.report()
