"""Runs the ``Store`` contract suite against every backend.

A new backend is one more ``store_factory`` param (and its URL, or its own factory); the tests
themselves live in ``onbeat.testing.store_contract`` and are never copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from onbeat.store import Store, open_store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import SHARD_COUNT, StoreContract, StoreFactory
from onbeat.testing.store_contract_dashboard import DashboardReadsContract
from onbeat.testing.store_contract_heartbeat import HeartbeatContract
from onbeat.testing.store_contract_recovery import RecoveryContract
from onbeat.testing.store_contract_schedules import (
    ScheduleChainContract,
    ScheduleHistoryContract,
)
from onbeat.testing.store_contract_tasks import TaskCatalogContract

_STORE_URLS = {"sqlite": "sqlite:///{directory}/onbeat.db"}
"""Per backend, the URL of a fresh store; ``{directory}`` is an empty directory of the test's."""


def _url_factory(backend: str) -> StoreFactory:
    @contextmanager
    def open_fresh(directory: Path, clock: FakeClock) -> Iterator[Store]:
        store = open_store(
            _STORE_URLS[backend].format(directory=directory), clock, shard_count=SHARD_COUNT
        )
        try:
            yield store
        finally:
            store.close()

    return open_fresh


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite")])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    backend: str = request.param
    return _url_factory(backend)


@pytest.fixture
def store(store_factory: StoreFactory, tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    with store_factory(tmp_path, clock) as fresh:
        yield fresh


class TestStore(
    StoreContract,
    ScheduleChainContract,
    ScheduleHistoryContract,
    RecoveryContract,
    HeartbeatContract,
    DashboardReadsContract,
    TaskCatalogContract,
):
    pass
