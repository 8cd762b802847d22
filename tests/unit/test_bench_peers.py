"""The pure helpers of ``bench/peers`` (no peer installed): the ledger lines the peers' task
writes, the cron fire time it derives, the start figures computed from them, the descendants
the driver counts, and the peer specs the driver starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.fleet_measure import CpuMonitor, Starts, start_figures
from bench.peers import ledger
from bench.peers.processes import PEER_NAMES, REPO, PeerRun, children_of, ensure_venv, load_spec


@pytest.fixture
def ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(ledger.LEDGER_DIR, str(tmp_path))
    return tmp_path


def test_record__appends_one_line_per_run_that_starts_reads_back(ledger_dir: Path) -> None:
    ledger.record("w1-0", 100.0, 100.25)
    ledger.record("w1-1", 100.0, 101.5)
    ledger.record("w1-0", 100.0, 102.0)  # a second start of the same run
    starts = Starts(ledger_dir)
    assert starts.read() == 3
    assert starts.runs == [("w1-0", 100.0, 100.25), ("w1-1", 100.0, 101.5), ("w1-0", 100.0, 102.0)]
    figures = starts.figures(3)
    assert (figures["started"], figures["lost"], figures["duplicated"]) == (2, 1, 1)
    assert figures["delay_max_s"] == 1.5


def test_record__probe_runs_go_to_their_own_file(ledger_dir: Path) -> None:
    ledger.record("probe1-0", 5.0)
    assert Starts(ledger_dir).read() == 0
    [probe] = ledger_dir.glob("probe-*.txt")
    assert probe.read_text().startswith("probe1-0 5.000000 ")


@pytest.mark.parametrize(
    ("started", "fire"),
    [(120.0, 120.0), (120.3, 120.0), (174.9, 120.0), (175.0, 180.0), (116.0, 120.0)],
)
def test_cron_fire_time__nearest_boundary_a_run_up_to_5s_early_belongs_to(
    started: float, fire: float
) -> None:
    assert ledger.cron_fire_time(started) == fire


def test_record_cron__id_names_job_and_boundary(ledger_dir: Path) -> None:
    ledger.record_cron(7)
    starts = Starts(ledger_dir)
    starts.read()
    [(run_id, planned, started)] = starts.runs
    assert run_id == f"c7@{int(planned)}"
    assert planned % 60 == 0 and -ledger.CRON_EARLY <= started - planned < 60


def test_start_figures__early_and_percentiles_from_first_starts() -> None:
    runs = [(f"r{i}", 10.0, 10.0 + i / 100) for i in range(100)] + [("early", 10.0, 9.5)]
    figures = start_figures(runs, 101)
    assert (figures["started"], figures["lost"], figures["early"]) == (101, 0, 1)
    assert figures["delay_p50_s"] == 0.49
    assert figures["delay_p99_s"] == 0.98
    assert figures["first_start"] == 9.5


def test_children_of__finds_grandchildren_under_their_root() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while not (found := children_of({parent.pid})):
            assert time.monotonic() < deadline, "the child never appeared"
            time.sleep(0.05)
        assert set(found.values()) == {parent.pid}
        assert os.getpid() not in found
    finally:
        for pid in children_of({parent.pid}):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("name", PEER_NAMES)
def test_specs__every_peer_has_its_venv_and_a_worker(name: str) -> None:
    spec = load_spec(name)
    assert spec.name == name and spec.workers
    assert spec.cron in ("workers", "scheduler") or spec.cron.startswith("n/a: ")
    assert (spec.cron == "scheduler") == (spec.scheduler is not None)
    assert not spec.names or len(spec.names) == len(spec.workers)
    if spec.repo_venv:
        assert ensure_venv(name) == REPO / ".venv"
        return
    requirements = (Path("bench/peers") / name / "requirements.txt").read_text().split()
    assert requirements and all("==" in line for line in requirements)


def test_specs__onbeat_comes_first_in_both_modes_with_the_same_app() -> None:
    assert PEER_NAMES[:2] == ("onbeat", "onbeat-embedded")
    fleet, node = load_spec("onbeat"), load_spec("onbeat-embedded")
    assert fleet.app_module == node.app_module == "bench.peers.onbeat_peer.app"
    assert fleet.names == ("scheduler", "worker-0", "worker-1")
    assert [argv[:2] for argv in fleet.workers] == [
        ("onbeat", "scheduler"), ("onbeat", "worker"), ("onbeat", "worker"),
    ]  # fmt: skip
    assert [argv[:2] for argv in node.workers] == [("onbeat", "up")]
    for spec in (fleet, node):
        assert spec.setup[0] == ("onbeat", "migrate") and spec.cron == "workers"
    assert load_spec("pgqueuer").app_module == "bench.peers.pgqueuer.app"


def test_peer_run_env__fills_the_specs_variables_with_the_runs_database_and_directory() -> None:
    runs = [PeerRun(load_spec(name), REPO / ".venv") for name in ("onbeat", "onbeat-embedded")]
    other = PeerRun(load_spec("pgqueuer"), REPO / ".venv")
    fleet, node = runs
    try:
        env = fleet.env("worker-0")
        assert env["ONBEAT_DATABASE_URL"] == env["ONBEAT_QUEUE_URL"] == env["PEERS_DATABASE_URL"]
        assert env["ONBEAT_DATABASE_URL"].endswith(f"/{fleet.database}")
        assert env["PGAPPNAME"] == "peers/worker-0"
        assert node.env("node")["ONBEAT_DATABASE_URL"] == f"sqlite:///{node.workdir}/onbeat.db"
        assert "ONBEAT_QUEUE_URL" not in other.env("worker-0")
    finally:
        for run in (*runs, other):
            shutil.rmtree(run.workdir)


class _NoBackends:
    """Stands in for the admin connection: no PostgreSQL backend to count."""

    def execute(self, *args: object) -> _NoBackends:
        return self

    def fetchall(self) -> list[tuple[int, str, str]]:
        return []


FORKS_A_BUSY_CHILD = """
import os, sys, time
child = os.fork()
if child == 0:
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    os._exit(0)
print(child, flush=True)
os.waitpid(child, 0)
print("reaped", flush=True)
time.sleep(30)
"""


def test_cpu_monitor__a_child_its_parent_waited_for_counts_once_in_the_parent() -> None:
    monitor = CpuMonitor("unused", [])
    parent = subprocess.Popen([sys.executable, "-c", FORKS_A_BUSY_CHILD], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        monitor.add(parent.pid, "worker-0", "worker-0", reaped_children=True)
        monitor.mark()
        child = int(parent.stdout.readline())
        monitor.add(child, "worker-0-child", "worker-0", in_parent=True)
        monitor.sample(_NoBackends())  # type: ignore[arg-type]
        assert parent.stdout.readline().strip() == b"reaped"
        monitor.sample(_NoBackends())  # type: ignore[arg-type]
        cpu = monitor.report()["worker-0"]["cpu_s"]
        assert 0.28 <= cpu < 0.5  # the child's 0.3 s, once
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_record_cron__takes_the_fire_time_the_peer_gives(ledger_dir: Path) -> None:
    ledger.record_cron(3, 60.0)  # started long after: still the run of 60, late
    starts = Starts(ledger_dir)
    starts.read()
    [(run_id, planned, started)] = starts.runs
    assert (run_id, planned) == ("c3@60", 60.0)
    assert started - planned > 1_000
