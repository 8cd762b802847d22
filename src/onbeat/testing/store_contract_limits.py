"""Store contract, fleet limits: the counters of runs in flight stay equal to the runs running
through every path that starts or ends one; caps on runs in flight hold, per tenant and for the
fleet, also when two stores claim at once; a starts/s limit gives evenly spaced slots, written
on the runs, and a run starts at its slot without taking another.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures; the
races use ``store_pair`` and ``race`` of :mod:`onbeat.testing.store_contract_concurrency`).
"""

from __future__ import annotations

import itertools
from functools import partial

from onbeat.limits import (
    GLOBAL,
    IN_FLIGHT_RECHECK,
    RATE_SLOT,
    LimitDefaults,
    TenantLimits,
)
from onbeat.model import ExecutionStatus, OverlapPolicy, RetryPolicy
from onbeat.store.base import ClaimResult, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    GRACE,
    OTHER_WORKER,
    RUN_TTL,
    WORKER,
    _at,
    _dispatch,
    _failed,
    _get,
    _held,
    _ids,
    _new,
    _ok,
    _only_run,
    _reap,
    _start,
)
from onbeat.testing.store_contract_concurrency import RACE_ROUNDS, ConcurrencyContract, race

__all__ = ["LimitsContract"]


def _queued_runs(store: Store, count: int, tenant: str = "acme", priority: int = 0) -> list[str]:
    """``count`` now-jobs of ``tenant``, dispatched: their runs' ids, in submission order."""
    ids = []
    for _ in range(count):
        job = store.job_create(_new(tenant=tenant, priority=priority)).job
        ids.append(_only_run(store, job.id).id)
    assert set(ids) <= _ids(_dispatch(store))
    return ids


def _claim_under(store: Store, ids: list[str], limits: LimitDefaults) -> ClaimResult:
    return store.execution_claim(ids, WORKER, RUN_TTL, GRACE, limits)


def _running_count(store: Store, tenant: str) -> int:
    return store.tenant_usage(tenant).running


def _due(result: ClaimResult) -> dict[str, float]:
    """Handed-back run id -> its due time, as a timestamp."""
    return {item.execution_id: item.due_at.timestamp() for item in result.not_due}


class LimitsContract:
    """``tenant_usage`` counters, ``tenant_limits_*`` and the limits of ``execution_claim``."""

    # -- the counters ---------------------------------------------------------------------------

    def test_tenant_usage__counts_runs_started_and_every_way_they_end(
        self, store: Store, clock: FakeClock
    ) -> None:
        def counts() -> tuple[int, int, int]:
            return tuple(_running_count(store, t) for t in (GLOBAL, "acme", "zeta"))  # type: ignore[return-value]

        assert counts() == (0, 0, 0)
        done = _start(store, _new(tenant="acme"))
        fails = _start(store, _new(tenant="acme", retry=RetryPolicy(max_attempts=3)))
        released = _start(store, _new(tenant="zeta"))
        lost = _start(store, _new(tenant="zeta", retry=RetryPolicy(max_attempts=1)))
        assert counts() == (4, 2, 2)
        store.execution_finish_many([_ok(done), _failed(fails, retry_in=1.0)])
        assert counts() == (2, 0, 2)
        store.execution_release(WORKER, _held(released))
        assert counts() == (1, 0, 1)
        clock.advance(RUN_TTL + 1)
        assert _ids(_reap(store)) == {lost.execution.id}
        assert counts() == (0, 0, 0)
        store.execution_finish_many([_ok(lost)])  # fenced: counts nothing
        assert counts() == (0, 0, 0)

    def test_tenant_usage__overlap_replace_counts_the_cancelled_run_out_and_frees_its_place(
        self, store: Store, clock: FakeClock
    ) -> None:
        first = _start(store, _new(tenant="acme", overlap=OverlapPolicy.REPLACE))
        assert _running_count(store, "acme") == 1
        clock.advance(1)
        second = store.job_run_now(first.execution.job_id)
        assert second.id in _ids(_dispatch(store))
        cap = LimitDefaults(max_in_flight=1, tenant_max_in_flight=1)
        [run] = store.execution_claim([second.id], OTHER_WORKER, RUN_TTL, GRACE, cap).started
        assert run.replaced == (first.execution.id,)
        assert (_running_count(store, "acme"), _running_count(store, GLOBAL)) == (1, 1)

    # -- caps on runs in flight -----------------------------------------------------------------

    def test_execution_claim__tenant_cap_holds_and_hands_the_rest_back_for_a_recheck(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = _queued_runs(store, 5)
        other = _queued_runs(store, 1, tenant="zeta")
        limits = LimitDefaults(tenant_max_in_flight=2)
        result = _claim_under(store, [*ids, *other], limits)
        assert _ids(result.started) == {*ids[:2], *other}
        recheck = _at(clock, IN_FLIGHT_RECHECK).timestamp()
        assert _due(result) == dict.fromkeys(ids[2:], recheck)
        assert all(_get(store, i).status is ExecutionStatus.QUEUED for i in ids[2:])
        assert _claim_under(store, ids[2:], limits).started == []
        [acme_run] = [r for r in result.started if r.execution.id == ids[0]]
        store.execution_finish_many([_ok(acme_run)])
        assert len(_claim_under(store, ids[2:], limits).started) == 1
        assert _running_count(store, "acme") == 2

    def test_execution_claim__a_tenant_override_beats_the_default(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.tenant_limits_set("acme", TenantLimits(max_in_flight=3))
        assert store.tenant_limits_get("acme") == TenantLimits(3, None)
        assert store.tenant_limits_get("zeta") == TenantLimits()
        ids = _queued_runs(store, 4)
        zeta = _queued_runs(store, 2, tenant="zeta")
        result = _claim_under(store, [*ids, *zeta], LimitDefaults(tenant_max_in_flight=1))
        assert _ids(result.started) == {*ids[:3], zeta[0]}
        store.tenant_limits_set("acme", TenantLimits())
        assert store.tenant_limits_get("acme") == TenantLimits()

    def test_execution_claim__global_cap_holds_across_tenants_high_priority_first(
        self, store: Store, clock: FakeClock
    ) -> None:
        low = _queued_runs(store, 2, tenant="acme", priority=0)
        high = _queued_runs(store, 2, tenant="zeta", priority=5)
        result = _claim_under(store, [*low, *high], LimitDefaults(max_in_flight=3))
        assert _ids(result.started) == {*high, low[0]}
        assert _running_count(store, GLOBAL) == 3
        assert _claim_under(store, [low[1]], LimitDefaults(max_in_flight=3)).started == []

    # -- starts per second ------------------------------------------------------------------------

    def test_execution_claim__rate_gives_evenly_spaced_slots_written_on_the_runs(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = _queued_runs(store, 4)
        limits = LimitDefaults(tenant_max_starts_per_second=4.0)
        result = _claim_under(store, ids, limits)
        assert _ids(result.started) == {ids[0]}
        slots = {i: _at(clock, 0.25 * n) for n, i in enumerate(ids) if n}
        assert _due(result) == {i: at.timestamp() for i, at in slots.items()}
        for i in ids[1:]:
            run = _get(store, i)
            assert (run.status, run.reason) == (ExecutionStatus.QUEUED, RATE_SLOT)
        assert store.tenant_usage("acme").tat == _at(clock, 1.0)
        # Handed out early (a queue refilled by the sweep): back to its slot, nothing taken.
        early = _claim_under(store, [ids[2]], limits)
        assert (early.started, _due(early)) == ([], {ids[2]: slots[ids[2]].timestamp()})
        # At its slot it starts, although later arrivals have pushed the arrival time on.
        later = _queued_runs(store, 1)
        clock.advance(0.25)
        assert _ids(_claim_under(store, [*ids[1:2], *later], limits).started) == {ids[1]}
        assert _due(_claim_under(store, later, limits)) == {later[0]: _at(clock, 0.75).timestamp()}
        started = _get(store, ids[1])
        assert (started.status, started.reason) == (ExecutionStatus.RUNNING, None)

    def test_execution_claim__a_slotted_run_is_not_a_misfire_at_its_slot(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = _queued_runs(store, 2)
        limits = LimitDefaults(tenant_max_starts_per_second=1 / (2 * GRACE))
        _claim_under(store, ids, limits)
        clock.advance(2 * GRACE)
        [run] = _claim_under(store, ids[1:], limits).started
        assert run.execution.catchup is False

    def test_execution_claim__tenants_without_limits_are_not_slowed(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.tenant_limits_set("acme", TenantLimits(max_starts_per_second=1.0))
        acme = _queued_runs(store, 3)
        zeta = _queued_runs(store, 3, tenant="zeta")
        result = _claim_under(store, [*acme, *zeta], LimitDefaults())
        assert _ids(result.started) == {acme[0], *zeta}
        assert _running_count(store, "zeta") == 3

    # -- races --------------------------------------------------------------------------------

    store_pair = ConcurrencyContract.store_pair

    def test_execution_claim__race_two_stores_never_exceed_a_tenant_cap(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        a, b = store_pair
        limits = LimitDefaults(max_in_flight=2, tenant_max_in_flight=1)
        for _ in range(RACE_ROUNDS):
            one, two = _queued_runs(a, 2)
            first, second = race(
                partial(a.execution_claim, [one], WORKER, RUN_TTL, GRACE, limits),
                partial(b.execution_claim, [two], OTHER_WORKER, RUN_TTL, GRACE, limits),
            )
            both = [*first.started, *second.started]
            assert len(both) == 1, "two claims both took the last place"
            [started] = both
            assert (_running_count(a, "acme"), _running_count(b, GLOBAL)) == (1, 1)
            a.execution_finish_many([_ok(started)])
            [rest] = a.execution_claim([one, two], WORKER, RUN_TTL, GRACE, limits).started
            b.execution_finish_many([_ok(rest)])
            assert (_running_count(a, "acme"), _running_count(b, GLOBAL)) == (0, 0)

    def test_execution_claim__race_two_stores_never_give_one_slot_twice(
        self, store_pair: tuple[Store, Store], clock: FakeClock
    ) -> None:
        a, b = store_pair
        limits = LimitDefaults(tenant_max_starts_per_second=1.0)
        starts: list[float] = []
        for _ in range(RACE_ROUNDS):
            one, two = _queued_runs(a, 2)
            first, second = race(
                partial(a.execution_claim, [one], WORKER, RUN_TTL, GRACE, limits),
                partial(b.execution_claim, [two], OTHER_WORKER, RUN_TTL, GRACE, limits),
            )
            now = clock.now().timestamp()
            starts += [now] * len([*first.started, *second.started])
            starts += [*_due(first).values(), *_due(second).values()]
        starts.sort()
        gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
        assert len(starts) == 2 * RACE_ROUNDS
        assert min(gaps) >= 1.0 - 1e-6, "two runs got one slot"

    # -- the caller's free places ---------------------------------------------------------------

    def test_execution_claim__max_starts_hands_the_rest_back_as_it_was(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = _queued_runs(store, 3)
        result = store.execution_claim(ids, WORKER, RUN_TTL, GRACE, LimitDefaults(), 1)
        assert _ids(result.started) == {ids[0]}
        assert _due(result) == {i: _get(store, i).due_at.timestamp() for i in ids[1:]}
        assert result.held_back == 0
        assert _running_count(store, "acme") == 1
        slotted = _queued_runs(store, 3, tenant="zeta")
        limits = LimitDefaults(tenant_max_starts_per_second=1.0)
        result = store.execution_claim(slotted, WORKER, RUN_TTL, GRACE, limits, 1)
        assert (len(result.started), result.held_back) == (1, 2)
