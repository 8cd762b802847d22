"""A write whose COMMIT loses its answer on PostgreSQL: the server may have committed before the
connection went. A ``TcpGate`` between the store and the real server cuts the connection that
sends the next COMMIT, after the server got it (it committed) or before (it rolled back).

Regression: the API answered such a loss with the 503 that says "nothing was changed", so a
client sent its unkeyed batch create again and the first copy's 50 jobs ran unacknowledged (the
fault suite's S6, once in CI, at ``pg_ctl restart -m fast``). Now the API's writes ask the server
whether the transaction committed (``pg_xact_status``) and answer from that; a loss they cannot
settle is a 504 that says the change may have been applied; a worker's claim settles too;
and a service write without settling says the same to its caller (StoreOutcomeUnknownError).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest

import onbeat.store.postgres_settle
from onbeat import App
from onbeat.api import create_app
from onbeat.errors import StoreOutcomeUnknownError, StoreUnavailableError
from onbeat.model import ExecutionStatus, RetryPolicy
from onbeat.store.postgres import PostgresStore
from onbeat.testing.postgres import fresh_schema
from onbeat.testing.store_contract import (
    GRACE,
    RUN_TTL,
    WORKER,
    _dispatch,
    _ids,
    _new,
    _only_run,
)
from tests.api.conftest import add_test_tasks
from tests.tcp_gate import TcpGate, tcp_gate

pytestmark = pytest.mark.external_service

CUT_WITHIN = 10.0
"""Seconds by which an armed cut has been made (the write sends its COMMIT at once)."""
JOBS_INSERT = b"INSERT INTO jobs"
"""The create's transaction, which the cut is for (not another session's COMMIT)."""


@dataclass
class Gated:
    app: App
    gate: TcpGate
    direct: App
    """The same schema without the gate: what the server holds."""


@pytest.fixture
def gated() -> Iterator[Gated]:
    with fresh_schema() as url, tcp_gate(url) as gate:
        app = add_test_tasks(App(gate.url(url)))
        app.store  # opened (and migrated) before a test arms a cut  # noqa: B018
        direct = App(url, migrate=False)
        try:
            yield Gated(app, gate, direct)
        finally:
            app.close()
            direct.close()


@pytest.fixture
async def client(gated: Gated) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(gated.app))
    async with httpx.AsyncClient(transport=transport, base_url="http://onbeat.test/api/v1") as c:
        yield c


def _stored_job_ids(g: Gated) -> list[str]:
    return [job.id for job in g.direct.list_jobs()]


@pytest.mark.parametrize("jobs", [1, 3], ids=["single", "batch"])
def test_create__commit_reached_the_server__returns_the_jobs_it_stored(
    gated: Gated, jobs: int
) -> None:
    cut = gated.gate.cut_at_commit(delivered=True, after=JOBS_INSERT)
    news = [gated.app.prepare("echo", {"n": n}) for n in range(jobs)]
    created = gated.app.submit_many(news)
    assert cut.wait(CUT_WITHIN), "the COMMIT was never cut"
    assert sorted(c.job.id for c in created) == sorted(_stored_job_ids(gated))
    assert len(created) == jobs
    assert not any(c.replayed for c in created)


def test_create__commit_never_reached_the_server__unavailable_and_nothing_stored(
    gated: Gated,
) -> None:
    cut = gated.gate.cut_at_commit(delivered=False, after=JOBS_INSERT)
    with pytest.raises(StoreUnavailableError) as raised:
        gated.app.submit("echo", {"n": 1})
    assert cut.wait(CUT_WITHIN)
    assert not isinstance(raised.value, StoreOutcomeUnknownError)
    assert _stored_job_ids(gated) == []
    assert gated.app.schedule("echo", {"n": 2}).id in _stored_job_ids(gated)  # back at once


def test_service_write__commit_answer_lost__outcome_unknown_though_stored(gated: Gated) -> None:
    """A service's write does not settle (its retry is idempotent): its caller is told the
    outcome is unknown, not that nothing changed, and indeed the change is there."""
    store = gated.app.store
    cut = gated.gate.cut_at_commit(delivered=True, after=b"INSERT INTO secrets")
    with pytest.raises(StoreOutcomeUnknownError):
        store.secret_get_or_create("lost-commit", "first")
    assert cut.wait(CUT_WITHIN)
    assert gated.direct.store.secret_get_or_create("lost-commit", "second") == "first"


def test_claim__commit_answer_lost__the_worker_gets_the_runs_it_started(gated: Gated) -> None:
    """Told "unavailable", a worker would not run the runs the claim started under its lease:
    they would wait out the lease and be reaped as a lost attempt, their last one for a task of
    one attempt, without having run."""
    store = gated.app.store
    job = store.job_create(_new(retry=RetryPolicy(max_attempts=1))).job
    run = _only_run(store, job.id)
    assert run.id in _ids(_dispatch(store))
    cut = gated.gate.cut_at_commit(delivered=True, after=b"UPDATE runs")
    [started] = store.execution_claim([run.id], WORKER, RUN_TTL, GRACE).started
    assert cut.wait(CUT_WITHIN)
    stored = gated.direct.store.execution_get(run.id)
    assert stored is not None
    assert (stored.status, stored.lease_owner) == (ExecutionStatus.RUNNING, WORKER)
    assert stored.fencing_token == started.execution.fencing_token


async def test_rest_create__commit_answer_lost__201_with_the_one_job_stored(
    gated: Gated, client: httpx.AsyncClient
) -> None:
    cut = gated.gate.cut_at_commit(delivered=True, after=JOBS_INSERT)
    response = await client.post("/jobs", json={"task": "echo", "params": {"n": 1}})
    assert response.status_code == 201, response.text
    assert cut.wait(CUT_WITHIN)
    assert _stored_job_ids(gated) == [response.json()["id"]]


async def test_rest_create__lost_commit_the_server_cannot_settle__504_outcome_unknown(
    gated: Gated, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate shuts with the cut: the server cannot be asked within the settle timeout, so the
    API says the create may have been applied (no Retry-After: sending it again could apply it
    twice); the server did commit it."""
    monkeypatch.setattr(onbeat.store.postgres_settle, "SETTLE_TIMEOUT", 1.0)
    cut = gated.gate.cut_at_commit(delivered=True, shut=True, after=JOBS_INSERT)
    response = await client.post("/jobs/batch", json={"jobs": [{"task": "echo"}] * 2})
    assert cut.wait(CUT_WITHIN)
    assert response.status_code == 504, response.text
    problem = response.json()
    assert problem["type"] == "urn:onbeat:problem:store-outcome-unknown"
    assert "Idempotency-Key" in problem["detail"]
    assert "retry-after" not in response.headers
    assert len(_stored_job_ids(gated)) == 2
    gated.gate.open()
    again = await client.post("/jobs", json={"task": "echo"})
    assert again.status_code == 201, again.text


def _seems_restarted(store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every settled COMMIT seem to have been sent before a server restart: the server's
    start time read before it is an hour earlier than the one read after."""
    assert isinstance(store, PostgresStore)
    before_restart = store._q["transaction_id_if_assigned"].replace(
        "pg_postmaster_start_time()", "pg_postmaster_start_time() - interval '1 hour'"
    )
    monkeypatch.setattr(store, "_q", {**store._q, "transaction_id_if_assigned": before_restart})


def test_claim__commit_answer_lost_across_a_server_restart__is_taken_as_not_committed(
    gated: Gated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a crash the server gives out again the transaction ids whose WAL it lost, so across
    a restart pg_xact_status may say "committed" of another transaction (S6: a worker started a
    run whose lost confirm it took for committed, and the run ran again elsewhere). The settle
    answers "not committed" then; here the claim did commit, and the server seems to have
    restarted since the COMMIT was sent."""
    store = gated.app.store
    _seems_restarted(store, monkeypatch)
    job = store.job_create(_new()).job
    run = _only_run(store, job.id)
    assert run.id in _ids(_dispatch(store))
    cut = gated.gate.cut_at_commit(delivered=True, after=b"UPDATE runs")
    with pytest.raises(StoreUnavailableError):
        store.execution_claim([run.id], WORKER, RUN_TTL, GRACE)
    assert cut.wait(CUT_WITHIN)
    stored = gated.direct.store.execution_get(run.id)
    assert stored is not None  # committed all the same: it waits out its lease, then runs again
    assert (stored.status, stored.lease_owner) == (ExecutionStatus.RUNNING, WORKER)


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "rolled-back"])
async def test_rest_create__commit_answer_lost_across_a_server_restart__settled_by_its_jobs(
    gated: Gated, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, delivered: bool
) -> None:
    """Across a restart the server's word on a transaction id cannot be trusted, so a create
    asks whether its first new job is stored. Regression (S6 in CI, at ``pg_ctl restart -m
    fast``): it answered every such loss 503 "nothing was changed", so the load generator sent
    its unkeyed batch again and the first copy's 50 jobs ran unacknowledged."""
    _seems_restarted(gated.app.store, monkeypatch)
    cut = gated.gate.cut_at_commit(delivered=delivered, after=JOBS_INSERT)
    response = await client.post("/jobs/batch", json={"jobs": [{"task": "echo"}] * 3})
    assert cut.wait(CUT_WITHIN)
    if delivered:
        assert response.status_code == 201, response.text
        answered = sorted(job["id"] for job in response.json()["items"])
        assert answered == sorted(_stored_job_ids(gated))
        assert len(answered) == 3
    else:
        assert response.status_code == 503, response.text
        assert "nothing was changed" in response.json()["detail"]
        assert _stored_job_ids(gated) == []


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "rolled-back"])
def test_run_now__commit_answer_lost_across_a_server_restart__settled_by_its_run(
    gated: Gated, monkeypatch: pytest.MonkeyPatch, delivered: bool
) -> None:
    """A manual run sent again makes a second one, so its lost COMMIT is settled by the run."""
    store = gated.app.store
    job = store.job_create(_new()).job
    first = _only_run(store, job.id)
    _seems_restarted(store, monkeypatch)
    cut = gated.gate.cut_at_commit(delivered=delivered, after=b"INSERT INTO runs")
    if delivered:
        run = store.job_run_now(job.id)
    else:
        with pytest.raises(StoreUnavailableError) as raised:
            store.job_run_now(job.id)
        assert not isinstance(raised.value, StoreOutcomeUnknownError)
    assert cut.wait(CUT_WITHIN)
    stored = {r.id for r in gated.direct.store.execution_list(job.id)} - {first.id}
    assert stored == ({run.id} if delivered else set())


@pytest.mark.parametrize("delivered", [True, False], ids=["committed", "rolled-back"])
def test_api_key_create__commit_answer_lost_across_a_server_restart__settled_by_its_key(
    gated: Gated, monkeypatch: pytest.MonkeyPatch, delivered: bool
) -> None:
    """Sent again after a 503, a key create makes a second key, and the first one would stay
    active with a secret no one was shown."""
    _seems_restarted(gated.app.store, monkeypatch)
    cut = gated.gate.cut_at_commit(delivered=delivered, after=b"INSERT INTO api_keys")
    if delivered:
        key, _ = gated.app.create_api_key("acme", "admin")
        stored = [k.id for k in gated.direct.store.api_key_list()]
        assert stored == [key.id]
    else:
        with pytest.raises(StoreUnavailableError) as raised:
            gated.app.create_api_key("acme", "admin")
        assert not isinstance(raised.value, StoreOutcomeUnknownError)
        assert gated.direct.store.api_key_list() == []
    assert cut.wait(CUT_WITHIN)
