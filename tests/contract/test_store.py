"""Runs the ``Store`` contract suite against every backend.

A new backend is one more ``store_factory`` param (and its URL, or its own factory); the tests
themselves live in ``onbeat.testing.store_contract*`` (one module per area) and are never copied.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path

import psycopg
import pytest

from onbeat.store import Store, open_store
from onbeat.testing.clock import FakeClock
from onbeat.testing.postgres import store_schema
from onbeat.testing.store_contract import SHARD_COUNT, StoreFactory, StoreOpener
from onbeat.testing.store_contract_alerts import AlertContract
from onbeat.testing.store_contract_claim import ClaimContract
from onbeat.testing.store_contract_claim_ahead import ClaimAheadContract
from onbeat.testing.store_contract_concurrency import ConcurrencyContract
from onbeat.testing.store_contract_dashboard import DashboardReadsContract
from onbeat.testing.store_contract_dead_letters import DeadLetterContract
from onbeat.testing.store_contract_dispatch import DispatchContract
from onbeat.testing.store_contract_fencing import FencingContract
from onbeat.testing.store_contract_finish import FinishContract
from onbeat.testing.store_contract_heartbeat import HeartbeatContract
from onbeat.testing.store_contract_history import HistoryContract
from onbeat.testing.store_contract_interleavings import InterleavingContract
from onbeat.testing.store_contract_job_changes import JobChangesContract
from onbeat.testing.store_contract_jobs import JobsContract
from onbeat.testing.store_contract_limits import LimitsContract
from onbeat.testing.store_contract_recovery import RecoveryContract
from onbeat.testing.store_contract_schedules import (
    ScheduleChainContract,
    ScheduleHistoryContract,
)
from onbeat.testing.store_contract_simulation import ProtocolSimulationContract
from onbeat.testing.store_contract_tasks import TaskCatalogContract


@contextmanager
def _fresh_url(backend: str, directory: Path) -> Iterator[str]:
    """The URL of an empty database of ``backend`` for one test (``directory`` is the test's)."""
    if backend == "postgres":
        with store_schema() as url:  # a schema of the test server's, emptied afterwards
            yield url
    else:
        yield f"sqlite:///{directory}/onbeat.db"


ORPHANS = """
SELECT 'run ' || id FROM runs WHERE job_id NOT IN (SELECT id FROM jobs)
UNION ALL SELECT 'event of ' || job_id FROM job_events WHERE job_id NOT IN (SELECT id FROM jobs)
"""
"""Runs and job events whose job is not stored: PostgreSQL has no foreign key to refuse them
(migration 0010), so the suite checks after each test that no store method wrote one."""


def _orphans(backend: str, url: str) -> list[str]:
    if backend == "postgres":
        with psycopg.connect(url) as conn:
            return [r[0] for r in conn.execute(ORPHANS)]
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        return [r[0] for r in conn.execute(ORPHANS)]


def _url_factory(backend: str) -> StoreFactory:
    @contextmanager
    def fresh_database(directory: Path, clock: FakeClock) -> Iterator[StoreOpener]:
        stores: list[Store] = []
        with _fresh_url(backend, directory) as url, ExitStack() as opened:

            def open_another() -> Store:
                store = open_store(url, clock, shard_count=SHARD_COUNT)
                opened.callback(store.close)
                stores.append(store)
                return store

            yield open_another
            if stores:  # its tables exist
                assert _orphans(backend, url) == []

    return fresh_database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    backend: str = request.param
    return _url_factory(backend)


@pytest.fixture
def store(store_factory: StoreFactory, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    with store_factory(tmp_path, clock) as open_another:
        yield open_another()


class TestStore(
    JobsContract,
    JobChangesContract,
    DispatchContract,
    ClaimContract,
    ClaimAheadContract,
    FinishContract,
    DeadLetterContract,
    FencingContract,
    ProtocolSimulationContract,
    ConcurrencyContract,
    InterleavingContract,
    ScheduleChainContract,
    ScheduleHistoryContract,
    RecoveryContract,
    HeartbeatContract,
    DashboardReadsContract,
    TaskCatalogContract,
    AlertContract,
    LimitsContract,
    HistoryContract,
):
    pass
