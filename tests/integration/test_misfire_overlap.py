"""Every pair of misfire and overlap policies across a stall, a kill -9 and an outage.

A job fires every 10 s; the node stops for 70 minutes in one of three ways, then recovers:
- stall: the process is frozen; its delay queue still holds what it had queued;
- kill: the process dies with runs claimed but not finished; a new scheduler and worker with an
  empty queue take over (shard takeover sweeps the queued runs back in, the reaper frees the
  dead worker's runs);
- outage: the process lives but its queue is lost (as with Redis flushed), and the sweep refills it.

What must hold, whatever the pair (the table in docs/architecture.md):
- every fire time of the schedule has exactly one record (the audit finds none missing);
- the misfire policy alone picks which missed fire times run: ``skip`` none, ``run_once`` the most
  recent one, ``run_all`` those inside ``catchup_window``; each marked as a catch-up;
- fire times late by less than ``misfire_grace`` all run, in fire-time order, under every overlap
  policy: a backlog is not "overlapping" itself.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from onbeat.model import ExecutionStatus, MisfirePolicy, OverlapPolicy, Trigger
from onbeat.queue.memory import MemoryDelayQueue
from onbeat.scheduler import Scheduler
from onbeat.worker import Worker
from tests.integration.conftest import Node

EVERY_10S = "*/10 * * * * *"
CATCHUP_WINDOW = 600.0
DOWN = timedelta(minutes=70)


def _replace_node_processes(node: Node) -> None:
    """A new process: new scheduler and worker (new owners) over an empty queue."""
    app = node.app
    node.queue = MemoryDelayQueue(node.clock)
    node.scheduler = Scheduler(app.store, node.queue, app.settings, node.clock)
    node.worker = Worker(app.store, node.queue, app.registry, app.settings, node.clock)


@pytest.mark.parametrize("fault", ["stall", "kill", "outage"])
@pytest.mark.parametrize("overlap", list(OverlapPolicy))
@pytest.mark.parametrize("misfire", list(MisfirePolicy))
async def test_misfire_and_overlap_across_a_fault(
    node: Node, misfire: MisfirePolicy, overlap: OverlapPolicy, fault: str
) -> None:
    app = node.app
    job = app.schedule(
        "record", cron=EVERY_10S, misfire=misfire, overlap=overlap, catchup_window=CATCHUP_WINDOW
    )
    for _ in range(3):
        await node.step(advance=10)
    if fault == "kill":  # runs in flight die with the process
        node.clock.advance(9)
        await node.scheduler.dispatch()
        node.clock.advance(1)
        claimed = await node.queue.claim_due(10)
        in_flight = app.store.execution_claim(
            claimed, node.worker.owner, app.settings.lease_ttl, app.settings.misfire_grace
        )
        assert len(in_flight.started) == 1
    node.clock.advance(DOWN.total_seconds())
    back = node.clock.now()
    if fault == "kill":
        _replace_node_processes(node)
    elif fault == "outage":
        node.queue = node.worker.queue = node.scheduler.queue = MemoryDelayQueue(node.clock)
        await node.scheduler.renew_shards()
        await node.scheduler.sweep()
    await node.step()  # the first pass after the fault, at `back`
    for _ in range(80):  # each pass starts the next of a backlog: a finished run wakes it
        await node.step(advance=0.5)

    assert app.audit(job.id).missing == []
    runs = [e for e in app.list_executions(job.id, limit=1000) if e.trigger is Trigger.SCHEDULE]
    by_fire = {e.scheduled_for: e for e in runs}
    assert len(by_fire) == len(runs), "a fire time has two records"

    grace_line = back - timedelta(seconds=app.settings.misfire_grace)
    missed = sorted(f for f in by_fire if f < grace_line and by_fire[f].attempt <= 1)
    missed = [f for f in missed if f > job.created_at + timedelta(seconds=40)]
    caught_up = [f for f in missed if by_fire[f].catchup]
    if misfire is MisfirePolicy.SKIP:
        assert caught_up == []
    elif misfire is MisfirePolicy.RUN_ONCE:
        assert caught_up == [missed[-1]]
    else:
        window_line = back - timedelta(seconds=CATCHUP_WINDOW)
        assert caught_up == [f for f in missed if f >= window_line]
    for fire in missed:
        run = by_fire[fire]
        if fire in caught_up:
            assert run.status is ExecutionStatus.SUCCEEDED, (fire, run.status, run.reason)
        else:
            assert run.status is ExecutionStatus.SKIPPED, (fire, run.status)
            assert "misfire" in (run.reason or ""), run.reason

    within_grace = [f for f in by_fire if grace_line <= f <= back]
    assert len(within_grace) == 7
    for fire in within_grace:
        run = by_fire[fire]
        assert run.status is ExecutionStatus.SUCCEEDED, (fire, run.status, run.reason)
        assert not run.catchup
    started = [by_fire[f].started_at or back for f in sorted(within_grace)]
    assert started == sorted(started), "the backlog ran out of fire-time order"


async def test_a_run_that_ends_wakes_the_dispatch_of_the_runs_waiting_for_it(node: Node) -> None:
    """A backlog drains at the pace of its runs: the worker asks for a dispatch pass as soon as
    a run that others wait for is written, instead of leaving them to the next poll."""
    woken: list[None] = []
    node.worker.on_runs_woken = lambda: woken.append(None)
    node.app.schedule("record", cron=EVERY_10S)
    other = node.app.schedule("record")  # a run no one waits for
    await node.step()
    assert woken == []  # `other` ran; nothing waited
    assert node.app.list_executions(other.id)[0].status is ExecutionStatus.SUCCEEDED
    node.clock.advance(45)  # 12:00:10, :20, :30, :40 came due together: a backlog
    await node.step()
    assert len(woken) == 1  # :10 ran while the others waited for it
