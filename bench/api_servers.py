"""The servers ``bench/api.py`` loads: the embedded node (``onbeat up`` on SQLite), or the
distributed API (``onbeat api`` processes on a fresh PostgreSQL schema, with a scheduler and a
worker when the jobs run). Each gives the URLs to spread connections over, and the CPU seconds
of its processes (and, distributed, of their PostgreSQL backends) since ``mark``."""

from __future__ import annotations

import argparse
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

import psycopg

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: import bench.* from the repo
    sys.path.insert(0, str(REPO))

from bench.fleet import SERVER, Fleet, bench_app  # noqa: E402
from bench.fleet_measure import CpuMonitor, proc_cpu_seconds  # noqa: E402
from onbeat.worker.catalog import task_defaults  # noqa: E402


class Servers(Protocol):
    urls: list[str]

    def mark(self) -> None: ...
    def cpu(self) -> dict[str, float]: ...
    def stop(self) -> None: ...


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class NodeProcess:
    """``onbeat up --app bench.api:app`` on ``database_url`` and a free port, until :meth:`stop`."""

    def __init__(self, database_url: str, log: Path, timeout: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.urls = [self.url]
        self._cpu_at_mark = 0.0
        env = {
            **os.environ,
            "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",  # this checkout's onbeat
            "ONBEAT_LOG_LEVEL": "WARNING",
        }
        command = [sys.executable, "-m", "onbeat", "up", "--app", "bench.api:app"]
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), "--database-url", database_url],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
            )
        lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, args=(lines,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(f"onbeat up did not start; see {log}:\n{log.read_text()}")
            if line.startswith("onbeat API:"):
                return

    def _pump(self, lines: queue.Queue[str | None]) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            lines.put(line)
        lines.put(None)

    def mark(self) -> None:
        self._cpu_at_mark = proc_cpu_seconds(self.process.pid) or 0.0

    def cpu(self) -> dict[str, float]:
        """The node's user + system CPU seconds since ``mark``."""
        now = proc_cpu_seconds(self.process.pid)
        return {"node": float("nan") if now is None else now - self._cpu_at_mark}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


class ApiFleet:
    """``onbeat migrate`` on a fresh schema, the bench's tasks published to its catalog (as a
    worker would), ``api_processes`` ``onbeat api`` processes on free ports and, if ``with_worker``
    (jobs due now), ``onbeat scheduler`` + ``onbeat worker`` on the table queue. ``stop``
    ends them and drops the schema."""

    def __init__(self, workdir: Path, api_processes: int, with_worker: bool) -> None:
        args = argparse.Namespace(workers=1, concurrency=None, claim_batch=None, keep=False)
        self.fleet = Fleet("table", workdir, args)
        self.fleet.open()
        self.monitor = CpuMonitor(SERVER, self.fleet.pg_app_names)
        self.urls: list[str] = []
        try:
            app = bench_app(self.fleet.database_url, self.fleet.queue_url)
            app.store.task_publish("bench-api", task_defaults(app.registry))
            app.close()
            if with_worker:
                self.fleet.start_all()
            for i in range(api_processes):
                port = free_port()
                self.fleet.start("api", f"api-{i}", ["--port", str(port)])
                self.urls.append(f"http://127.0.0.1:{port}")
            self.fleet.wait_up()
            for name in self.fleet.procs:
                if name.startswith("api-"):
                    self._wait_listening(name)
            for name, proc in self.fleet.procs.items():
                self.monitor.add(proc.pid, name, name)
            self.monitor.start()
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, name: str, timeout: float = 60) -> None:
        log, deadline = self.fleet.workdir / f"{name}.log", time.monotonic() + timeout
        while "onbeat API:" not in log.read_text(errors="replace"):
            if self.fleet.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not listen:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)

    def mark(self) -> None:
        self.monitor.mark()

    def cpu(self) -> dict[str, float]:
        """CPU seconds since ``mark`` of each process and of its PostgreSQL backends
        (``postgres:api-0``...); PostgreSQL's background processes are the shared server's."""
        with psycopg.connect(SERVER, autocommit=True) as conn:
            self.monitor.sample(conn)
        return {
            group: v["cpu_s"]
            for group, v in self.monitor.report().items()
            if group != "postgres_background"
        }

    def stop(self) -> None:
        self.monitor.stop()
        self.fleet.close()
