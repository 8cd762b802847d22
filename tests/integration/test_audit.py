"""The audit reconciles a job's fire times (through pauses and edits) with its execution records."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from onbeat import App, NotFoundError, ValidationError
from onbeat.auth import Role
from onbeat.testing import FakeClock
from tests.integration.conftest import Node


async def test_audit__every_fire_time_accounted_for_across_pause_and_edit(node: Node) -> None:
    app = node.app
    job = app.schedule("record", cron="*/10 * * * * *")
    for _ in range(3):  # fires at :10 :20 :30
        await node.step(advance=10)
    app.pause(job.id)
    # :40 :50 :00 fall inside the pause: not expected, but within misfire_grace, so they still
    # run after the resume, in fire-time order, before :10 (none is skipped as "overlapping").
    await node.step(advance=30)
    app.resume(job.id)
    for _ in range(2):  # :10 :20
        await node.step(advance=10)
    app.update_job(job.id, cron="*/20 * * * * *")
    for _ in range(4):  # :40 :00
        await node.step(advance=10)
    await node.step(advance=1)
    report = app.audit(job.id)
    assert report.missing == []
    assert report.expected == 7
    assert report.records == {"succeeded": 10}


async def test_audit__a_fire_time_without_a_record_is_reported_missing(node: Node) -> None:
    app = node.app
    job = app.schedule("record", cron="*/10 * * * * *")
    for _ in range(3):
        await node.step(advance=10)
    victim = app.list_executions(job.id)[-1]
    path = app.settings.database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as raw:  # simulate a lost record behind onbeat's back
        raw.execute("DELETE FROM attempts WHERE execution_id = ?", (victim.id,))
        raw.execute("DELETE FROM runs WHERE id = ?", (victim.id,))
        raw.execute("DELETE FROM execution_history WHERE id = ?", (victim.id,))
    report = app.audit(job.id)
    assert report.missing == [victim.scheduled_for]


async def test_audit__a_once_job_submitted_for_a_past_time_is_audited_by_default(
    node: Node,
) -> None:
    """Its one fire time precedes its creation (a client's clock, a slow request): the default
    range still holds it, so the audit says whether it ran instead of expecting nothing."""
    app = node.app
    job = app.schedule("record", at=node.clock.now() - timedelta(seconds=5))
    report = app.audit(job.id)
    assert (report.expected, report.missing, report.records) == (1, [], {"scheduled": 1})
    await node.step(advance=1)
    report = app.audit(job.id)
    assert (report.since, report.expected, report.missing) == (job.schedule.at, 1, [])
    assert report.records == {"succeeded": 1}
    path = app.settings.database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as raw:  # the record lost behind onbeat's back
        raw.execute("DELETE FROM attempts")
        raw.execute("DELETE FROM runs")
        raw.execute("DELETE FROM execution_history")
    assert app.audit(job.id).missing == [job.schedule.at]


class TickingClock(FakeClock):
    """Moves on by ``tick`` seconds every time it is read: the time a slow transaction takes
    between two reads of the clock."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick = tick

    def now(self) -> datetime:
        self.advance(self.tick)
        return super().now()


def test_audit__cancel_after_a_stall_leaves_no_fire_time_without_a_record(
    tmp_path: Path,
) -> None:
    """The dispatcher is behind (nothing dispatched for 5 s) when the job is cancelled, and the
    cancel takes time: every fire time up to the cancel's own instant still gets its record."""
    clock = TickingClock(tick=0.35)
    app = App(f"sqlite:///{tmp_path / 'db'}", clock=clock)
    app.task(name="record")(lambda ctx: None)
    job = app.schedule("record", cron="* * * * * *")
    clock.advance(5)
    cancelled = app.cancel(job.id)
    report = app.audit(job.id, until=cancelled.updated_at)
    assert report.expected >= 5
    assert report.missing == []
    assert report.records == {"cancelled": report.expected}
    app.close()


async def test_audit__rejects_inverted_or_naive_ranges(node: Node) -> None:
    job = node.app.schedule("record", cron="* * * * *")
    now = node.clock.now()
    with pytest.raises(ValidationError, match="since"):
        node.app.audit(job.id, since=now, until=now - timedelta(hours=1))
    with pytest.raises(ValidationError, match="since"):
        node.app.audit(job.id, since=now.replace(tzinfo=None))


async def test_tenancy__another_tenants_job_is_not_found(node: Node) -> None:
    app = node.app
    job = app.schedule("record", tenant="acme")
    assert app.get_job(job.id, tenant="acme").id == job.id
    for call in (app.get_job, app.pause, app.cancel, app.run_now, app.list_executions):
        with pytest.raises(NotFoundError):
            call(job.id, tenant="globex")
    await node.step()
    [execution] = app.list_executions(job.id)
    with pytest.raises(NotFoundError):
        app.get_execution(execution.id, tenant="globex")
    assert app.get_job(job.id).status.value == "completed"  # nothing changed by the refusals


async def test_api_keys__only_a_hash_is_stored_and_revocation_works(node: Node) -> None:
    app = node.app
    assert not app.auth_enabled()
    api_key, secret = app.create_api_key("acme", "writer")
    assert api_key.role is Role.WRITER and secret.startswith(f"onb_{api_key.id}_")
    assert app.auth_enabled()
    found = app.authenticate(secret)
    assert found is not None and found.tenant == "acme"
    assert app.authenticate(secret + "x") is None
    raw = sqlite3.connect(app.settings.database_url.removeprefix("sqlite:///"))
    stored = list(raw.execute("SELECT * FROM api_keys"))
    raw.close()
    assert secret not in repr(stored)
    app.revoke_api_key(api_key.id)
    assert app.authenticate(secret) is None
    assert not app.auth_enabled()
    with pytest.raises(NotFoundError):
        app.revoke_api_key(api_key.id)
    with pytest.raises(ValidationError, match="role"):
        app.create_api_key("acme", "owner")
