"""Task code cannot stop, starve or strand a real node: a task blocking the event loop gets no
healthy run rescued, a hung sync task frees its slot at its timeout, and Ctrl-C exits within the
grace period although a sync task never returns."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from onbeat import App, AttemptOutcome, ExecutionStatus
from tests.e2e.conftest import StartNode, read_ledger, wait_until

pytestmark = pytest.mark.slow

POOLS = ["threads", "processes"]


def _client(env: dict[str, str]) -> App:
    """Submits to the nodes' store from this process, as a separate script would."""
    client = App(env["ONBEAT_DATABASE_URL"])
    for name in ("work", "work_sync", "block_loop", "hang", "crash"):
        client.task(name=name)(lambda ctx, **params: None)
    return client


def _shard_owners(env: dict[str, str]) -> Counter[str]:
    """How many shards each node holds: a peek at the store's table, for lack of an API."""
    path = Path(env["ONBEAT_DATABASE_URL"].removeprefix("sqlite:///"))
    if not path.exists():
        return Counter()
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT owner FROM shard_leases WHERE owner IS NOT NULL").fetchall()
    except sqlite3.OperationalError:  # the first node is still creating the schema
        return Counter()
    return Counter(owner for (owner,) in rows)


def _stop(process: subprocess.Popen[bytes], log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_two_nodes__task_blocking_the_event_loop_gets_no_healthy_run_rescued(
    env: dict[str, str], tmp_path: Path, start_node: StartNode
) -> None:
    """Two nodes on one store (2 s leases, heartbeats every 0.5 s), 50 healthy async runs in
    flight, and one async task that blocks its node's event loop for 3 leases. The heartbeat
    thread keeps that node's leases alive: the other node rescues nothing, and the blocking run
    is recorded once."""
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    logs = [tmp_path / "node-a.log", tmp_path / "node-b.log"]
    nodes = [start_node(env, log, "--no-api") for log in logs]
    client = _client(env)
    half = client.store.shard_count // 2
    wait_until(
        lambda: sorted(_shard_owners(env).values()) == [half, half], 30, "two nodes, half each"
    )
    healthy = [client.schedule("work", {"duration": 4}) for _ in range(50)]
    wait_until(
        lambda: sum(e["event"] == "start" for e in read_ledger(ledger)) >= len(healthy),
        20,
        "the healthy runs to start",
    )
    blocker = client.schedule("block_loop", {"seconds": 6})  # 3 x the lease TTL

    def done() -> bool:
        return all(client.list_executions(job.id)[0].status.is_final for job in [*healthy, blocker])

    wait_until(done, 60, "every run to finish")
    for node, log in zip(nodes, logs, strict=True):
        _stop(node, log)

    starts = Counter(e["job_id"] for e in read_ledger(ledger) if e["event"] == "start")
    executions = {job.id: client.list_executions(job.id)[0] for job in [*healthy, blocker]}
    rescued = [
        job.id for job in healthy if len(executions[job.id].attempts) > 1 or starts[job.id] > 1
    ]
    blocking = executions[blocker.id]
    print(
        f"\nblocked event loop: healthy runs rescued={len(rescued)}/{len(healthy)}, "
        f"blocking run attempts={len(blocking.attempts)} starts={starts[blocker.id]}"
    )
    assert rescued == []
    assert all(executions[job.id].status is ExecutionStatus.SUCCEEDED for job in healthy)
    assert blocking.status is ExecutionStatus.SUCCEEDED
    assert [a.outcome for a in blocking.attempts] == [AttemptOutcome.SUCCEEDED]
    assert starts[blocker.id] == 1
    named = f"event loop blocked for over 1.0s by run {blocking.id} (task block_loop)"
    assert any(named in log.read_text() for log in logs)


@pytest.mark.parametrize("pool", POOLS)
def test_pool__hung_sync_task_frees_its_slot_at_its_timeout(
    env: dict[str, str], tmp_path: Path, start_node: StartNode, pool: str
) -> None:
    """One slot; a sync task hangs past its 1 s timeout. The slot is free at the timeout, so
    the next run, due half a second later, starts on time."""
    env = {**env, "ONBEAT_CONCURRENCY": "1"}
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    node = start_node(env, log, "--no-api", "--pool", pool)
    client = _client(env)
    hung = client.schedule("hang", timeout=1, max_attempts=1)
    wait_until(lambda: len(read_ledger(ledger)) >= 1, 20, "the hung task to start")
    [hang_start] = read_ledger(ledger)
    due = datetime.fromtimestamp(hang_start["wall"], UTC) + timedelta(seconds=1.5)
    nxt = client.schedule("work_sync", at=due)
    wait_until(lambda: any(e["job_id"] == nxt.id for e in read_ledger(ledger)), 10, "the next run")
    [next_start] = [e for e in read_ledger(ledger) if e["job_id"] == nxt.id][:1]
    late = next_start["wall"] - due.timestamp()
    print(f"\n{pool}: next run started {late:.3f}s after its due time")
    assert late < 1.0
    timed_out = client.list_executions(hung.id)[0]
    assert timed_out.status is ExecutionStatus.FAILED
    assert [a.outcome for a in timed_out.attempts] == [AttemptOutcome.TIMED_OUT]
    _stop(node, log)


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("segfault", "worker process died: killed by SIGSEGV"),
        ("exit", "worker process died: exit code 137"),
        ("system_exit", "exit code 3"),
    ],
)
def test_processes__a_task_that_kills_its_process_fails_its_run_not_the_node(
    env: dict[str, str], tmp_path: Path, start_node: StartNode, how: str, error: str
) -> None:
    """A crash in a child process is a failed attempt: after max_attempts (2) crashes the run is
    a dead letter with the cause, and the node goes on running other work."""
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    node = start_node(env, log, "--no-api", "--pool", "processes")
    client = _client(env)
    crashing = client.schedule("crash", {"how": how}, max_attempts=2, backoff=0.1, backoff_max=0.2)
    healthy = client.schedule("work_sync")

    def settled() -> bool:
        return client.list_executions(crashing.id)[0].status.is_final

    wait_until(settled, 20, "the crashing run to reach a final state")
    run = client.list_executions(crashing.id)[0]
    assert run.status is ExecutionStatus.FAILED
    assert [a.outcome for a in run.attempts] == [AttemptOutcome.FAILED] * 2
    assert error in (run.last_error or ""), run.last_error
    assert [d.execution_id for d in client.list_dead_letters()] == [run.id]
    wait_until(
        lambda: client.list_executions(healthy.id)[0].status is ExecutionStatus.SUCCEEDED,
        10,
        "the healthy run",
    )
    assert node.poll() is None, "the node died"
    assert len([e for e in read_ledger(ledger) if e["job_id"] == crashing.id]) == 2
    _stop(node, log)


def test_sigint__exits_after_the_grace_period_although_a_sync_task_never_returns(
    env: dict[str, str], tmp_path: Path, start_node: StartNode
) -> None:
    """Ctrl-C: the hung run gets shutdown_grace (1 s), is released (due again, attempt not
    counted), and the process exits, not waiting for the thread."""
    env = {**env, "ONBEAT_SHUTDOWN_GRACE": "1", "ONBEAT_LEASE_TTL": "60"}
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    node = start_node(env, log, "--no-api")
    client = _client(env)
    hung = client.schedule("hang", max_attempts=1)
    wait_until(lambda: len(read_ledger(ledger)) >= 1, 20, "the hung task to start")
    stopping = time.monotonic()
    node.send_signal(signal.SIGINT)
    assert node.wait(timeout=10) == 0, log.read_text()[-3000:]
    assert time.monotonic() - stopping < 1 + 3
    released = client.list_executions(hung.id)[0]
    assert (released.status, released.attempt) == (ExecutionStatus.SCHEDULED, 0)
    assert [a.outcome for a in released.attempts] == [AttemptOutcome.RELEASED]


def test_sigint__a_second_one_exits_at_once(
    env: dict[str, str], tmp_path: Path, start_node: StartNode
) -> None:
    env = {**env, "ONBEAT_SHUTDOWN_GRACE": "60", "ONBEAT_LOG_LEVEL": "INFO"}
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    node = start_node(env, log, "--no-api")
    client = _client(env)
    client.schedule("hang")
    wait_until(lambda: len(read_ledger(ledger)) >= 1, 20, "the hung task to start")
    node.send_signal(signal.SIGINT)
    wait_until(lambda: "waiting up to 60.0s for 1 runs" in log.read_text(), 10, "the graceful stop")
    stopping = time.monotonic()
    node.send_signal(signal.SIGINT)
    assert node.wait(timeout=10) == 128 + signal.SIGINT, log.read_text()[-3000:]
    assert time.monotonic() - stopping < 2
