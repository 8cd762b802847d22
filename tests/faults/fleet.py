"""Processes for the fault suite and ``tests/e2e/test_fleet_faults``: the fleet (``onbeat api``, schedulers, workers), a private
``redis-server`` the test may kill, and the load submitted through the API.

Every fleet connection to PostgreSQL carries an ``application_name`` of this test's own, so the
test can terminate exactly the fleet's backends (``pg_terminate_backend``) and no other test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.client.conftest import free_port
from tests.faults.process import APP, REPO, wait_for_output, wait_until


@dataclass
class Proc:
    role: str
    log: Path
    process: subprocess.Popen[bytes]
    args: tuple[str, ...] = ()
    """The role's arguments, so a supervisor can start it again alike."""
    env: dict[str, str] = field(default_factory=dict)
    """This process's own additions to the fleet's ``env`` (kept for a restart alike)."""

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Fleet:
    """Starts and stops ``onbeat`` processes sharing ``env``; ``stop_all`` ends the living."""

    env: dict[str, str]
    logs: Path
    procs: list[Proc] = field(default_factory=list)
    role_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Extra flags per role (``{"scheduler": ("--log-level", "INFO")}``)."""

    def start(self, role: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        """``env``: this process's additions to the fleet's (S7's libfaketime)."""
        log = self.logs / f"{role}-{sum(p.role == role for p in self.procs)}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onbeat",
                    role,
                    "--no-migrate",
                    *args,
                    *self.role_flags.get(role, ()),
                ],
                cwd=REPO,
                env=self.env | (env or {}),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(role, log, process, args, env or {})
        self.procs.append(proc)
        return proc

    def migrate(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "onbeat", "migrate"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr

    def worker(self, env: dict[str, str] | None = None) -> Proc:
        return self.start("worker", "--app", APP, env=env)

    def wait_up(self, proc: Proc, timeout: float = 60) -> None:
        wait_for_output(proc.process, proc.log, f"onbeat {proc.role}:", timeout)

    def kill(self, proc: Proc) -> float:
        """kill -9; returns the wall time it was sent."""
        killed_at = time.time()
        proc.process.send_signal(signal.SIGKILL)
        proc.process.wait()
        return killed_at

    def living(self) -> list[Proc]:
        return [p for p in self.procs if p.process.poll() is None]

    def stop_all(self, timeout: float = 30) -> dict[str, int | None]:
        """SIGTERM to the living, then their exit statuses by log name (None: had to be killed)."""
        living = self.living()
        for proc in living:
            proc.process.send_signal(signal.SIGCONT)  # one the nemesis froze, to act on the TERM
            proc.process.send_signal(signal.SIGTERM)
        statuses: dict[str, int | None] = {}
        for proc in living:
            try:
                statuses[proc.log.name] = proc.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait()
                statuses[proc.log.name] = None
        return statuses

    def tail(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {p.log.name} (pid {p.pid}, exit {p.process.poll()}):\n"
            + "\n".join(
                line[:400] for line in p.log.read_text(errors="replace").splitlines()[-lines:]
            )
            for p in self.procs
        )


def terminate_backends(admin_url: str, application_names: list[str]) -> int:
    """``pg_terminate_backend`` every connection carrying one of ``application_names``;
    returns how many were terminated."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = ANY(%s) AND pid <> pg_backend_pid()",
            (application_names,),
        ).fetchall()
    return sum(1 for (done,) in rows if done)


def shard_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM shard_leases").fetchone()
    assert row is not None
    return int(row[0])


def shard_holders(database_url: str) -> dict[int, str]:
    """Shard -> owner, for the shards whose lease has not expired (by the server's clock)."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT shard, owner FROM shard_leases WHERE owner IS NOT NULL AND"
            " lease_expires_at > (extract(epoch FROM clock_timestamp()) * 1e6)::bigint"
        ).fetchall()
    return dict(rows)


def running_of(database_url: str, pid: int) -> set[str]:
    """Executions the store says the worker process ``pid`` holds (owner
    ``worker-<host>-<pid>-<hex>``, see ``onbeat.scheduler.process_name``)."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT id FROM executions WHERE status = 'running' AND lease_owner LIKE %s",
            (f"worker-%-{pid}-%",),
        ).fetchall()
    return {row[0] for row in rows}


def queued(database_url: str) -> set[str]:
    """Executions the store says are in the delay queue."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT id FROM executions WHERE status = 'queued'").fetchall()
    return {row[0] for row in rows}


def pending_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM executions WHERE status IN ('scheduled', 'queued', 'running')"
        ).fetchone()
    assert row is not None
    return int(row[0])


class PrivateRedis:
    """A ``redis-server`` of this test's own, without persistence, on a free port: killing it
    loses everything it held, and starting it again gives an empty one on the same port."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, appendonly: bool = False) -> float:
        """Start it and wait until it answers; returns the wall time it answered. ``appendonly``:
        with an AOF (``appendfsync everysec``), reloaded from ``directory`` if there is one."""
        with (self.directory / "redis.log").open("ab") as out:
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "yes" if appendonly else "no",
                    "--appendfsync", "everysec",
                    "--dir", str(self.directory),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(self._answers, 10, f"redis-server on port {self.port}")
        return time.time()

    def _answers(self) -> bool:
        """Whether *this* server answers commands: after a restart, another test's redis-server
        may have taken the port while ours was down (ours then exits: address in use); while it
        loads its AOF it answers INFO but refuses the queue's commands (``loading:1``), and that
        time is Redis's, not onbeat's (N1's AOF rebuilds measured 2.5-4 s with it)."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited ({self.process.returncode})")
        cli = ["redis-cli", "-p", str(self.port), "INFO"]
        info = subprocess.run(cli, capture_output=True, check=False, text=True).stdout
        fields = dict(line.strip().split(":", 1) for line in info.splitlines() if ":" in line)
        if "process_id" not in fields:
            return False
        if fields["process_id"] != str(self.process.pid):
            raise AssertionError(
                f"port {self.port} is another redis-server's (it took it meanwhile)"
            )
        return fields.get("loading") == "0"

    def cli(self, *args: str) -> str:
        """A ``redis-cli`` command's answer (the server may be paused: no timeout here)."""
        cli = ["redis-cli", "-p", str(self.port), *args]
        return subprocess.run(cli, capture_output=True, check=True, text=True).stdout.strip()

    def kill(self) -> float:
        assert self.process is not None
        killed_at = time.time()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return killed_at

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def private_redis(directory: Path, port: int | None = None) -> Iterator[PrivateRedis]:
    server = PrivateRedis(directory, port)
    try:
        server.start()
        yield server
    finally:
        server.stop()


RETRY_PAUSE = 0.2
RETRY_LIMIT = 150
"""A request is given up after this many tries (30 s of outage)."""
MakeBody = Callable[[], dict[str, Any] | None]


class ApiCalls:
    """``(path, body maker)`` requests, ``concurrency`` at a time; request ``i`` is sent no
    sooner than ``i * pace`` seconds after the start, and its body is made just before its
    first send (a once job's ``at`` is relative to then). A 503 is sent again (the API changed
    nothing); so is a dropped connection, for an ``idempotent`` request only (a POST /jobs then
    carries the Idempotency-Key ``key_prefix`` + its index). ``run`` may be called in another
    thread; ``abort`` makes it send no more."""

    def __init__(
        self,
        api_url: str,
        method: str,
        requests: Sequence[tuple[str, MakeBody]],
        *,
        ok: int = 201,
        concurrency: int = 8,
        pace: float = 0.0,
        idempotent: bool = True,
        key_prefix: str = "",
        on_answer: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.api_url, self.method, self.requests = api_url, method, requests
        self.ok, self.concurrency, self.pace = ok, concurrency, pace
        self.idempotent, self.key_prefix = idempotent, key_prefix
        self.on_answer = on_answer
        """Called with each request's index and 2xx answer as it arrives (an ack log)."""
        self.answers: list[dict[str, Any]] = [{} for _ in requests]
        self.done = 0
        """Requests answered, in order: ``answers[:done]`` are all filled in."""
        self.retries = 0
        """Requests answered 503 or cut off, and sent again."""
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._answered = [False] * len(requests)
        self._abort = threading.Event()

    def run(self) -> ApiCalls:
        started = time.monotonic()
        try:
            asyncio.run(self._run(started))
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.seconds = time.monotonic() - started
        return self

    def abort(self) -> None:
        self._abort.set()

    def answered(self) -> list[dict[str, Any]]:
        """The answers of every request answered (after an abort, not only ``answers[:done]``)."""
        return [a for a, ok in zip(self.answers, self._answered, strict=True) if ok]

    async def _run(self, started: float) -> None:
        todo = iter(enumerate(self.requests))
        limits = httpx.Limits(
            max_connections=self.concurrency, max_keepalive_connections=self.concurrency
        )
        async with httpx.AsyncClient(base_url=self.api_url, timeout=30, limits=limits) as client:

            async def drain() -> None:
                for index, (path, make_body) in todo:
                    await asyncio.sleep(max(0.0, started + index * self.pace - time.monotonic()))
                    if self._abort.is_set():
                        return
                    self.answers[index] = await self._send(client, index, path, make_body())
                    if self.on_answer is not None:
                        self.on_answer(index, self.answers[index])
                    self._answered[index] = True
                    while self.done < len(self._answered) and self._answered[self.done]:
                        self.done += 1

            await asyncio.gather(*(drain() for _ in range(self.concurrency)))

    async def _send(
        self, client: httpx.AsyncClient, index: int, path: str, body: dict[str, Any] | None
    ) -> dict[str, Any]:
        keyed = self.method == "POST" and self.key_prefix
        headers = {"Idempotency-Key": f"{self.key_prefix}{index}"} if keyed else {}
        for _ in range(RETRY_LIMIT):
            try:
                response = await client.request(self.method, path, json=body, headers=headers)
            except httpx.TransportError:
                if not self.idempotent:
                    raise
                response = None
            if response is not None and response.status_code == self.ok:
                answer: dict[str, Any] = response.json()
                return answer
            if response is not None and response.status_code != 503:
                raise AssertionError(
                    f"{self.method} {path}: {response.status_code} {response.text}"
                )
            self.retries += 1
            await asyncio.sleep(RETRY_PAUSE)
        raise AssertionError(f"{self.method} {path}: still unavailable after {RETRY_LIMIT} tries")


def attempts_of(database_url: str, execution_id: str) -> str:
    """A run's record and attempts, one line, for a report."""
    with psycopg.connect(database_url) as conn:
        run = conn.execute(
            "SELECT status, due_at, scheduled_for, queued_at FROM executions WHERE id = %s",
            (execution_id,),
        ).fetchone()
        attempts = conn.execute(
            "SELECT attempt, worker, started_at, finished_at, outcome FROM attempts"
            " WHERE execution_id = %s ORDER BY started_at",
            (execution_id,),
        ).fetchall()
    if run is None:
        return f"{execution_id}: no record"

    def at(micros: int | None) -> str:
        return "-" if micros is None else f"{micros / 1e6 % 1000:.2f}"

    status, due_at, scheduled_for, queued_at = run
    tries = "; ".join(
        f"#{n} {worker.split('-')[-2]} {at(started)}..{at(finished)} {outcome}"
        for n, worker, started, finished, outcome in attempts
    )
    return (
        f"{execution_id} {status}, fire {at(scheduled_for)}, due {at(due_at)}, "
        f"queued {at(queued_at)} (s mod 1000): {tries}"
    )
