"""Redis killed under a running fleet: runs keep starting from the PostgreSQL fallback.

``onbeat api``, one scheduler and one worker on a fresh PostgreSQL schema, with a private
``redis-server`` as the delay queue (so the fleet uses ``FailoverDelayQueue``). Once jobs are
submitted through the API, each due 1-3 s after its submission, 10 per second. Redis is
``kill -9``-ed and stays down for ``OUTAGE`` seconds, then comes back empty. Proven from the
ledger the task writes itself: runs start while Redis is down, every run starts within
``ON_TIME`` of its due time (including the runs Redis held when it died: the scheduler moves
them to the fallback as soon as it sees Redis gone), none is lost and none runs twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from onbeat.testing.postgres import fresh_schema
from tests.client.conftest import free_port
from tests.e2e.conftest import read_ledger, wait_for_output, wait_until
from tests.faults.fleet import ApiCalls, Fleet, pending_count, private_redis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REDIS_PORT = 18700
"""This test's private redis-server (the failover helper's port range is 18700-18749)."""
TIMINGS = {
    "ONBEAT_LEASE_TTL": 4.0,
    "ONBEAT_HEARTBEAT_INTERVAL": 1.0,
    "ONBEAT_SHARD_LEASE_TTL": 4.0,
    "ONBEAT_SHARD_RENEW_INTERVAL": 1.0,
    "ONBEAT_SWEEP_INTERVAL": 1.0,
    "ONBEAT_SWEEP_OVERDUE": 5.0,
    "ONBEAT_WINDOW": 4.0,
    "ONBEAT_POLL_INTERVAL": 0.2,
}
PACE = 0.1
"""Seconds between two submissions."""
DUE_AFTER = (1.0, 3.0)
"""A job falls due this long after its submission (spread evenly over the jobs)."""
KILL_AT = 6.0
OUTAGE = 10.0
LOAD_FOR = 26.0
"""Seconds of submissions: Redis dies at ``KILL_AT``, comes back ``OUTAGE`` later, and the
load goes on for a while after."""
ON_TIME = 2.0
"""Largest start delay allowed for any run, before, during and after the outage."""


@pytest.fixture
def fleet_env(env: dict[str, str]) -> Iterator[tuple[dict[str, str], str]]:
    with fresh_schema() as schema_url:
        timings = {k: str(v) for k, v in TIMINGS.items()}
        url = f"{schema_url}&application_name=onbeat-failover-{uuid.uuid4().hex[:8]}"
        yield {**env, **timings, "ONBEAT_DATABASE_URL": url}, schema_url


def test_queue_failover__runs_start_while_redis_is_down(
    fleet_env: tuple[dict[str, str], str], tmp_path: Path
) -> None:
    env, db = fleet_env
    ledger = Path(env["ONBEAT_TEST_LEDGER"])
    with ExitStack() as cleanup:
        redis = cleanup.enter_context(private_redis(tmp_path / "redis", REDIS_PORT))
        env["ONBEAT_QUEUE_URL"] = redis.url
        fleet = Fleet(env, tmp_path, role_flags={"scheduler": ("--log-level", "INFO")})
        cleanup.callback(fleet.stop_all)
        try:
            fleet.migrate()
            port = free_port()
            api = fleet.start("api", "--port", str(port))
            scheduler = fleet.start("scheduler")
            worker = fleet.worker()
            wait_for_output(api.process, api.log, "onbeat API:")
            for proc in (scheduler, worker):
                fleet.wait_up(proc)
            base = f"http://127.0.0.1:{port}/api/v1"
            wait_until(lambda: _task_published(base), 30, "the worker's tasks published")
            jobs = int(LOAD_FOR / PACE)
            spread = DUE_AFTER[1] - DUE_AFTER[0]
            calls = ApiCalls(
                base,
                "POST",
                [("/jobs", _once_job(DUE_AFTER[0] + spread * i / jobs)) for i in range(jobs)],
                pace=PACE,
                concurrency=4,
                key_prefix=f"failover-{uuid.uuid4().hex[:6]}-",
            )
            submitter = threading.Thread(target=calls.run, name="submitter")
            began = time.time()
            submitter.start()
            try:
                time.sleep(KILL_AT)
                killed_at = redis.kill()
                time.sleep(OUTAGE)
                back_at = redis.start()
            finally:
                submitter.join()
            assert calls.error is None, calls.error
            wait_until(lambda: pending_count(db) == 0, 60, "every run to be final")
            statuses = fleet.stop_all()
        except BaseException:
            print(fleet.tail(30))
            raise
    assert set(statuses.values()) == {0}, (statuses, fleet.tail())
    submitted = {answer["id"] for answer in calls.answers}
    assert len(submitted) == jobs
    starts = [line for line in read_ledger(ledger) if line["event"] == "start"]
    ran = Counter(line["job_id"] for line in starts)
    lost = submitted - set(ran)
    twice = sorted(job for job, n in ran.items() if n > 1)
    delays = {
        line["job_id"]: line["wall"] - datetime.fromisoformat(line["scheduled_for"]).timestamp()
        for line in starts
    }
    in_outage = [
        line for line in starts if killed_at + 1.0 <= line["wall"] <= back_at
    ]  # started while Redis was down (a second after the kill: well after it)
    outage_delays = sorted(delays[line["job_id"]] for line in in_outage)
    worst = max(delays.values())
    print(
        f"\nfailover: {len(submitted)} runs over {LOAD_FOR:.0f} s from {began:.0f}; Redis down "
        f"{back_at - killed_at:.1f} s; {len(in_outage)} started while it was down (delay max "
        f"{max(outage_delays, default=0):.2f} s); worst delay overall {worst:.2f} s; lost "
        f"{len(lost)}; ran twice {len(twice)}"
    )
    assert not lost, sorted(lost)[:10]
    assert not twice, twice[:10]
    assert len(in_outage) >= OUTAGE / PACE / 2, "runs should keep starting while Redis is down"
    assert worst < ON_TIME, sorted(delays.items(), key=lambda kv: -kv[1])[:10]
    for proc in (worker, scheduler):  # each noticed once, and once only, in each direction
        text = proc.log.read_text()
        assert text.count("using the fallback queue") == 1, proc.log
        assert text.count("is back; enqueueing to it again") == 1, proc.log


def _task_published(base: str) -> bool:
    return "work" in {t["name"] for t in httpx.get(f"{base}/tasks").json()["items"]}


def _once_job(due_after: float) -> Any:
    def body() -> dict[str, Any]:
        at = (datetime.now(UTC) + timedelta(seconds=due_after)).isoformat()
        return {
            "task": "work",
            "params": {"duration": 0.05},
            "schedule": {"type": "once", "at": at},
        }

    return body
