"""kill -9 the embedded node with runs due and in flight, restart it, and prove every run happened.

Real processes, a real SQLite file, and a ledger the task writes itself (independent of the store).
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from onbeat import App, AttemptOutcome, ExecutionStatus, OverlapPolicy
from tests.e2e.conftest import StartNode, read_ledger, wait_until

pytestmark = pytest.mark.slow


def test_crash_recovery__kill_9_loses_no_run(
    env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start_node: StartNode,
) -> None:
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    first = start_node(env, log)
    # Submit from this process, as a separate script would: same database file, no node here.
    monkeypatch.setenv("ONBEAT_TEST_LEDGER", str(ledger))
    client = App(env["ONBEAT_DATABASE_URL"])
    client.task(name="work")(lambda ctx, duration=0.3: None)
    now = datetime.now(UTC)
    one_shots = [
        client.schedule("work", {"duration": 0.4}, at=now + timedelta(seconds=0.5 + i * 0.02))
        for i in range(300)
    ]
    cron = client.schedule(
        "work", {"duration": 0.2}, cron="* * * * * *", overlap=OverlapPolicy.ALLOW
    )

    wait_until(lambda: sum(e["event"] == "start" for e in read_ledger(ledger)) >= 60, 30, "runs")
    first.send_signal(signal.SIGKILL)
    first.wait()
    at_kill = read_ledger(ledger)
    ended = {e["execution_id"] for e in at_kill if e["event"] == "end"}
    in_flight = {e["execution_id"] for e in at_kill if e["event"] == "start"} - ended
    assert in_flight, "the kill should hit runs in flight"
    killed_at = datetime.now(UTC)
    # What the dead process held by the store's account: started, outcome not yet recorded. A run
    # that ended in the ledger but whose outcome was still in the worker's write buffer is here too.
    held_at_kill = {
        e.id
        for job in [*one_shots, cron]
        for e in client.list_executions(job.id, limit=1000)
        if e.status is ExecutionStatus.RUNNING
    }
    assert in_flight <= held_at_kill

    second = start_node(env, log)
    cutoff = killed_at + timedelta(seconds=4)

    def all_final() -> bool:
        if datetime.now(UTC) < cutoff + timedelta(seconds=1):
            return False
        pending_one_shots = [
            j for j in one_shots if not client.list_executions(j.id)[0].status.is_final
        ]
        cron_runs = client.list_executions(cron.id, limit=1000)
        pending_cron = [e for e in cron_runs if e.scheduled_for <= cutoff and not e.status.is_final]
        return not pending_one_shots and not pending_cron

    wait_until(all_final, 60, "every run to finish after the restart")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0, log.read_text()[-3000:]

    entries = read_ledger(ledger)
    ends = Counter(e["execution_id"] for e in entries if e["event"] == "end")
    # Expected runs, computed without the product's cron engine: every whole second in the window.
    first_second = cron.created_at.replace(microsecond=0) + timedelta(seconds=1)
    expected_cron_seconds = {
        first_second + timedelta(seconds=i)
        for i in range(int((cutoff - first_second).total_seconds()) + 1)
    }
    cron_by_fire = {
        e.scheduled_for: e
        for e in client.list_executions(cron.id, limit=1000)
        if e.trigger == "schedule"
    }
    lost = [
        s for s in expected_cron_seconds if s not in cron_by_fire or ends[cron_by_fire[s].id] == 0
    ]
    for job in one_shots:
        [execution] = client.list_executions(job.id)
        if ends[execution.id] == 0:
            lost.append(execution.scheduled_for)
        assert execution.status is ExecutionStatus.SUCCEEDED
    duplicates = {eid: n for eid, n in ends.items() if n > 1}
    print(
        f"\ncrash recovery: runs expected={len(one_shots) + len(expected_cron_seconds)} "
        f"lost={len(lost)} in_flight_at_kill={len(in_flight)} held_at_kill={len(held_at_kill)} "
        f"duplicates={len(duplicates)}"
    )
    assert lost == []
    # A duplicate can only be a run the killed process held (duplicates <= runs in flight there).
    assert set(duplicates) <= held_at_kill
    # The product's own audit agrees: every fire time of the cron job up to the cutoff has a record.
    report = client.audit(cron.id, until=cutoff)
    assert report.missing == []
    assert report.expected == len(expected_cron_seconds)


def test_graceful_stop__sigterm_releases_unfinished_runs_for_an_immediate_restart(
    env: dict[str, str],
    tmp_path: Path,
    start_node: StartNode,
) -> None:
    """SIGTERM: runs still going after the grace period are released, not left to their lease
    (60 s here), so the restarted node runs them at once."""
    env = {**env, "ONBEAT_LEASE_TTL": "60", "ONBEAT_SHUTDOWN_GRACE": "0.5"}
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    log = tmp_path / "node.log"
    client = App(env["ONBEAT_DATABASE_URL"])
    client.task(name="work")(lambda ctx, duration=0.3: None)
    jobs = [client.schedule("work", {"duration": 30}) for _ in range(5)]
    first = start_node(env, log)
    wait_until(lambda: len(read_ledger(ledger)) >= len(jobs), 30, "all runs to start")
    stopping = time.monotonic()
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0, log.read_text()[-3000:]
    assert time.monotonic() - stopping < 10
    released = [client.list_executions(j.id)[0] for j in jobs]
    assert all(e.status is ExecutionStatus.SCHEDULED and e.attempt == 0 for e in released)

    second = start_node(env, log)
    wait_until(
        lambda: sum(e["event"] == "start" for e in read_ledger(ledger)) >= 2 * len(jobs),
        20,
        "the released runs to start again, long before their 60 s leases would have expired",
    )
    second.send_signal(signal.SIGKILL)
    second.wait()
    restarted = [client.list_executions(j.id)[0] for j in jobs]
    assert all(e.status is ExecutionStatus.RUNNING and e.attempt == 1 for e in restarted)


def shard_owners(database_url: str) -> Counter[str]:
    """How many shards each scheduler holds, read from the database file."""
    conn = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    try:
        rows = conn.execute(
            "SELECT owner FROM shard_leases WHERE owner IS NOT NULL AND lease_expires_at > ?",
            (time.time_ns() // 1000,),
        ).fetchall()
    finally:
        conn.close()
    return Counter(owner for (owner,) in rows)


def test_rescue__kill_9_runs_restart_on_the_other_node_within_lease_ttl_plus_2s(
    env: dict[str, str],
    tmp_path: Path,
    start_node: StartNode,
) -> None:
    """Two nodes on one file; one dies with runs in flight. The other reaps them once their lease
    expires, although the dead node's shard leases (15 s) still stand: no takeover is awaited."""
    lease_ttl = 2.0
    env = {
        **env,
        "ONBEAT_LEASE_TTL": str(lease_ttl),
        "ONBEAT_HEARTBEAT_INTERVAL": "0.5",
        "ONBEAT_REAP_INTERVAL": "0.5",
        "ONBEAT_SHARD_LEASE_TTL": "15",
        "ONBEAT_SHARD_RENEW_INTERVAL": "0.5",
    }
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    client = App(env["ONBEAT_DATABASE_URL"])
    client.task(name="work")(lambda ctx, duration=0.3: None)
    half = client.store.shard_count // 2  # and the schema exists before the checks below read it
    nodes = [start_node(env, tmp_path / f"node-{i}.log") for i in range(2)]
    wait_until(
        lambda: sorted(shard_owners(env["ONBEAT_DATABASE_URL"]).values()) == [half, half],
        30,
        "the two nodes to split the shards",
    )
    jobs = [client.schedule("work", {"duration": 60}) for _ in range(20)]
    wait_until(lambda: len(read_ledger(ledger)) == len(jobs), 30, "every run to start")
    started_by = Counter(e["pid"] for e in read_ledger(ledger))
    victim, survivor = sorted(nodes, key=lambda p: -started_by[p.pid])
    lost = {e["execution_id"] for e in read_ledger(ledger) if e["pid"] == victim.pid}
    assert lost and started_by[survivor.pid], started_by

    killed_at = time.time()
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    def restarts() -> dict[str, float]:
        return {
            e["execution_id"]: e["wall"] - killed_at
            for e in read_ledger(ledger)
            if e["pid"] == survivor.pid and e["execution_id"] in lost
        }

    wait_until(lambda: set(restarts()) == lost, lease_ttl + 10, "the lost runs to restart")
    delays = sorted(restarts().values())
    print(f"\nrescue after kill -9: {len(lost)} runs restarted {delays[0]:.2f}-{delays[-1]:.2f} s")
    assert delays[-1] <= lease_ttl + 2
    # The dead node's shard leases still stand: the runs came back without a takeover.
    assert sorted(shard_owners(env["ONBEAT_DATABASE_URL"]).values()) == [half, half]
    for job in jobs:
        [execution] = client.list_executions(job.id)
        if execution.id in lost:
            assert [a.outcome for a in execution.attempts] == [
                AttemptOutcome.LOST,
                AttemptOutcome.RUNNING,
            ]
