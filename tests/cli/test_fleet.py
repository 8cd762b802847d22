"""The fleet's process commands (``scheduler``, ``worker``, ``api``, ``migrate``, and ``up``): their
flags come from ``Settings``, a bad value is one line, and ``migrate`` sets up a fresh store."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from onbeat.settings import Settings, flag_commands, flag_name
from onbeat.store.queries import migrations
from tests.cli.conftest import (
    APP,
    COMMAND_TIMEOUT,
    REPO,
    START_TIMEOUT,
    base_env,
    onbeat,
    onbeat_all,
)
from tests.client.conftest import free_port

pytestmark = pytest.mark.slow

PROCESSES = ("up", "scheduler", "worker", "api", "migrate")
VERSIONS = [version for version, _ in migrations("sqlite")]


def test_help__each_command_lists_the_flags_of_its_settings() -> None:
    helps = onbeat_all(*[(command, "--help") for command in PROCESSES])
    for command, done in zip(PROCESSES, helps, strict=True):
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"Usage: onbeat {command} [OPTIONS]")
        flags = {flag_name(n) for n in Settings.model_fields if command in flag_commands(n)}
        others = {flag_name(n) for n in Settings.model_fields} - flags
        for flag in flags:
            assert flag in done.stdout, (command, flag)
        for flag in others:
            assert flag not in done.stdout, (command, flag)
    worker, api = helps[2].stdout, helps[3].stdout
    assert "--app" in worker and "--concurrency INTEGER" in worker
    assert "--pool [threads|processes]" in worker
    assert "--port INTEGER" in api and "--queue-url" in api and "--concurrency" not in api
    assert "[env: ONBEAT_CONCURRENCY; default: 64]" in " ".join(worker.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("worker", "--concurrency", "many"), "Invalid value for '--concurrency': 'many'"),
        (("worker", "--pool", "fork"), "Invalid value for '--pool': 'fork' is not one of"),
        (("api", "--port", "http"), "Invalid value for '--port': 'http'"),
        (("scheduler", "--no-such-flag"), "No such option '--no-such-flag'"),
        (("up", "--app", APP, "--log-level", "chatty"), "Invalid value for '--log-level'"),
    ],
)
def test_bad_flag_value__one_line_and_exit_status_2(args: tuple[str, ...], message: str) -> None:
    done = onbeat(*args)
    assert done.returncode == 2, done
    [line] = done.stderr.splitlines()
    assert line.startswith(f"Error: {message}")
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ("worker", "--app", APP, "--concurrency", "0"),
            {},
            "invalid setting: --concurrency 0: Input should be greater than or equal to 1",
        ),
        (
            ("api", "--port", "70000"),
            {},
            "invalid setting: --port 70000: Input should be less than or equal to 65535",
        ),
        (
            ("scheduler",),
            {"ONBEAT_POLL_INTERVAL": "-1"},
            "invalid setting: ONBEAT_POLL_INTERVAL='-1': Input should be greater than 0",
        ),
        (
            ("worker", "--app", APP),
            {"ONBEAT_LEASE_TTL": "long"},
            "invalid setting: ONBEAT_LEASE_TTL='long': Input should be a valid number",
        ),
        (("worker",), {}, "no app: pass --app MODULE:ATTR (or set ONBEAT_APP)"),
        (("worker", "--app", "tests.cli.cli_app"), {}, "expected MODULE:ATTR"),
        (("up", "--app", "tests.cli.no_such_module:app"), {}, "cannot load it: No module named"),
        (("scheduler", "--queue-url", "carrier-pigeon://"), {}, "unsupported scheme"),
    ],
)
def test_refused_setting__one_line_naming_where_it_came_from(
    args: tuple[str, ...], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    done = onbeat(*args, "--database-url", f"sqlite:///{tmp_path / 'onbeat.db'}", env=env)
    assert done.returncode == 1, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: ") and message in line, line
    assert "Traceback" not in done.stderr


def test_migrate__fresh_sqlite_file_gets_every_migration(tmp_path: Path) -> None:
    path = tmp_path / "onbeat.db"
    url = f"sqlite:///{path}"
    first = onbeat("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    applied = ", ".join(map(str, VERSIONS))
    assert first.stdout == f"onbeat migrate: applied migration(s) {applied} to {url}\n"
    with closing(sqlite3.connect(path)) as db:
        recorded = [v for (v,) in db.execute("SELECT version FROM onbeat_migrations ORDER BY 1")]
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert recorded == VERSIONS
    assert {"jobs", "executions", "tasks", "shard_leases"} <= tables
    again = onbeat("migrate", "--database-url", url)
    assert (again.returncode, again.stdout) == (0, f"onbeat migrate: {url} is up to date\n")


def test_no_migrate__refuses_a_fresh_store_and_creates_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'onbeat.db'}"
    for done in onbeat_all(
        ("scheduler", "--no-migrate", "--database-url", url),
        ("api", "--database-url", url),
        ("worker", "--app", APP, "--database-url", url),
        env={"ONBEAT_MIGRATE": "false"},
    ):
        assert done.returncode == 1, done
        [line] = done.stderr.strip().splitlines()
        assert line == (
            f"Error: cannot open the store {url}: it has no onbeat schema yet: run `onbeat "
            "migrate` first, or let this process migrate (drop --no-migrate / ONBEAT_MIGRATE=false)"
        )
    assert list(tmp_path.iterdir()) == []


def test_api__refuses_an_open_non_loopback_address(tmp_path: Path) -> None:
    done = onbeat("api", "--host", "0.0.0.0", "--database-url", f"sqlite:///{tmp_path / 'o.db'}")
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: refusing to serve 0.0.0.0: no API key exists")


@pytest.mark.parametrize("command", ["scheduler", "worker"])
def test_metrics_port__a_scheduler_or_worker_process_serves_its_metrics(
    tmp_path: Path, command: str
) -> None:
    port = free_port()
    database_url = f"sqlite:///{tmp_path / 'o.db'}"
    args = [command, "--database-url", database_url, "--queue-url", database_url]
    args += ["--metrics-port", str(port), *(["--app", APP] if command == "worker" else [])]
    log = tmp_path / "process.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "onbeat", *args], cwd=REPO, env=base_env(), stderr=stderr
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                break
            except httpx.TransportError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "no /metrics within the start timeout"
                time.sleep(0.1)
        assert "# TYPE onbeat_shards_held gauge" in text
        assert "onbeat_runs_in_flight" in text
    finally:
        process.terminate()
        process.wait(timeout=30)


def _node_up_line(tmp_path: Path, **env: str) -> str:
    """The line an ``onbeat scheduler`` logs once it is up, with these ``ONBEAT_*`` variables."""
    database_url = f"sqlite:///{tmp_path / 'o.db'}"
    with subprocess.Popen(
        [sys.executable, "-m", "onbeat", "scheduler", "--database-url", database_url],
        cwd=REPO,
        env={**base_env(), "ONBEAT_LOG_LEVEL": "INFO", **env},
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stderr is not None
            for line in process.stderr:  # ends when the process does
                if "onbeat node up" in line:
                    return line
            pytest.fail(f"the process ended without starting (status {process.wait()})")
        finally:
            process.terminate()


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_event_loop__a_process_runs_on_the_loop_its_setting_names(
    tmp_path: Path, event_loop: str
) -> None:
    line = _node_up_line(tmp_path, ONBEAT_EVENT_LOOP=event_loop)
    assert f"event loop {event_loop}" in line


@pytest.mark.parametrize(("setting", "threshold"), [(None, 50_000), ("0", 700), ("20000", 20_000)])
def test_gc_threshold__a_process_collects_as_its_setting_says(
    tmp_path: Path, setting: str | None, threshold: int
) -> None:
    """0 leaves Python's default (700); the test's own process is not touched."""
    env = {} if setting is None else {"ONBEAT_GC_THRESHOLD": setting}
    found = re.search(r"gc threshold (\d+)", _node_up_line(tmp_path, **env))
    assert found is not None and int(found[1]) == threshold


@pytest.mark.parametrize("unreachable", ["store", "queue"])
def test_start__an_unreachable_postgresql_or_redis_is_one_line_without_the_password(
    tmp_path: Path, unreachable: str
) -> None:
    nothing_there = free_port()
    database_url = f"sqlite:///{tmp_path / 'o.db'}"
    queue_url = "redis://127.0.0.1:6379/0"
    if unreachable == "store":
        database_url = f"postgresql://root:s3cret@127.0.0.1:{nothing_there}/test"
    else:
        queue_url = f"redis://:s3cret@127.0.0.1:{nothing_there}/0"
    started = time.monotonic()
    done = onbeat("scheduler", "--database-url", database_url, "--queue-url", queue_url)
    assert time.monotonic() - started < COMMAND_TIMEOUT / 2  # it does not wait out retries
    assert done.returncode != 0
    [line] = done.stderr.strip().splitlines()
    assert "s3cret" not in done.stderr
    what = "cannot open the store" if unreachable == "store" else "cannot reach the delay queue"
    assert line.startswith(f"Error: {what}"), line
    assert f"127.0.0.1:{nothing_there}" in line, line
