"""The pure decision of the fleet limits (``onbeat.limits.plan_limits``): GCRA slots, caps on runs
in flight, priority order, and the counters' changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from onbeat.limits import (
    GLOBAL,
    IN_FLIGHT_RECHECK,
    IN_FLIGHT_RECHECK_MAX,
    LimitCandidate,
    LimitDefaults,
    TenantLimits,
    Usage,
    in_flight_recheck,
    plan_limits,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _s(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def _run(
    rid: str,
    tenant: str = "a",
    priority: int = 0,
    due: float = 0.0,
    slot: datetime | None = None,
    frees: int = 0,
) -> LimitCandidate:
    return LimitCandidate(rid, tenant, priority, _s(due), slot or _s(due), slot, frees)


def test_no_limits__every_run_starts_and_is_counted() -> None:
    plan = plan_limits([_run("1"), _run("2", "b")], {}, None, {}, NOW)
    assert plan.start == ["1", "2"]
    assert plan.running == {"a": 1, "b": 1, GLOBAL: 2}
    assert (plan.slotted, plan.held, plan.tat) == ([], [], {})


def test_rate__runs_get_evenly_spaced_slots_from_now() -> None:
    runs = [_run(str(i), due=-1.0) for i in range(4)]
    plan = plan_limits(runs, {"a": TenantLimits(max_starts_per_second=10)}, None, {}, NOW)
    assert plan.start == ["0"]
    assert plan.slotted == [("1", _s(0.1)), ("2", _s(0.2)), ("3", _s(0.3))]
    assert plan.tat == {"a": _s(0.4)}
    assert plan.running == {"a": 1, GLOBAL: 1}


def test_rate__slots_go_on_from_the_stored_arrival_time() -> None:
    usage = {"a": Usage(0, _s(5.0))}
    plan = plan_limits([_run("1")], {"a": TenantLimits(None, 2.0)}, None, usage, NOW)
    assert (plan.start, plan.slotted, plan.tat) == ([], [("1", _s(5.0))], {"a": _s(5.5)})


def test_rate__an_arrival_time_in_the_past_starts_now() -> None:
    usage = {"a": Usage(0, _s(-30.0))}
    plan = plan_limits([_run("1")], {"a": TenantLimits(None, 2.0)}, None, usage, NOW)
    assert (plan.start, plan.tat) == (["1"], {"a": _s(0.5)})


def test_rate__a_run_holding_its_slot_starts_at_it_without_taking_another() -> None:
    usage = {"a": Usage(0, _s(100.0))}  # a backlog slotted far ahead
    rule = {"a": TenantLimits(None, 1.0)}
    plan = plan_limits([_run("1", slot=_s(-0.001))], rule, None, usage, NOW)
    assert (plan.start, plan.slotted, plan.tat) == (["1"], [], {})


def test_rate__a_run_handed_out_before_its_slot_is_held_until_it() -> None:
    rule = {"a": TenantLimits(None, 1.0)}
    plan = plan_limits([_run("1", slot=_s(3.0))], rule, None, {}, NOW)
    assert (plan.start, plan.held, plan.tat) == ([], [("1", _s(3.0))], {})


def test_rate__is_per_tenant() -> None:
    rule = {"a": TenantLimits(None, 1.0)}
    runs = [_run("a1"), _run("a2"), _run("b1", "b"), _run("b2", "b")]
    plan = plan_limits(runs, rule, None, {}, NOW)
    assert sorted(plan.start) == ["a1", "b1", "b2"]
    assert plan.slotted == [("a2", _s(1.0))]


def test_tenant_cap__runs_over_it_are_held_for_a_recheck_without_a_slot() -> None:
    usage = {"a": Usage(2)}
    rule = {"a": TenantLimits(max_in_flight=3, max_starts_per_second=100)}
    plan = plan_limits([_run("1"), _run("2"), _run("3")], rule, None, usage, NOW)
    assert plan.start == ["1"]
    assert plan.held == [("2", _s(IN_FLIGHT_RECHECK)), ("3", _s(IN_FLIGHT_RECHECK))]
    assert plan.tat == {"a": _s(0.01)}, "a held run takes no slot"
    assert plan.running == {"a": 1, GLOBAL: 1}


def test_global_cap__counts_every_tenant() -> None:
    usage = {GLOBAL: Usage(8)}
    plan = plan_limits([_run("1"), _run("2", "b"), _run("3", "c")], {}, 10, usage, NOW)
    assert plan.start == ["1", "2"]
    assert [i for i, _ in plan.held] == ["3"]


def test_caps__a_replacing_run_frees_the_place_of_what_it_cancels() -> None:
    usage = {"a": Usage(1), GLOBAL: Usage(1)}
    plan = plan_limits([_run("1", frees=1)], {"a": TenantLimits(1)}, 1, usage, NOW)
    assert plan.start == ["1"]
    assert plan.running == {"a": 0, GLOBAL: 0}


def test_priority__high_tiers_start_first_and_get_the_earlier_slots() -> None:
    runs = [_run("low", priority=0, due=-5), _run("high", priority=9), _run("mid", priority=5)]
    plan = plan_limits(runs, {"a": TenantLimits(None, 10)}, None, {}, NOW)
    assert plan.start == ["high"]
    assert plan.slotted == [("mid", _s(0.1)), ("low", _s(0.2))]
    capped = plan_limits(runs, {}, 1, {GLOBAL: Usage(0)}, NOW)
    assert capped.start == ["high"]


def test_in_flight_recheck__grows_with_the_wait_and_is_bounded() -> None:
    assert in_flight_recheck(0.0) == IN_FLIGHT_RECHECK
    assert in_flight_recheck(4.0) == 1.0
    assert in_flight_recheck(3600.0) == IN_FLIGHT_RECHECK_MAX
    waited = LimitCandidate("1", "a", 0, _s(-4.0), _s(-4.0))
    plan = plan_limits([waited], {"a": TenantLimits(0)}, None, {}, NOW)
    assert plan.held == [("1", _s(1.0))]


def test_defaults__a_tenant_override_wins_field_by_field() -> None:
    defaults = LimitDefaults(100, 10, 5.0)
    assert defaults.of(None) == TenantLimits(10, 5.0)
    assert defaults.of(TenantLimits(max_in_flight=3)) == TenantLimits(3, 5.0)
    assert defaults.of(TenantLimits(None, 50.0)) == TenantLimits(10, 50.0)


def test_max_starts__runs_past_the_free_places_go_back_as_they_were_taking_nothing() -> None:
    runs = [_run(str(i), due=-1.0) for i in range(4)]
    plan = plan_limits(runs, {}, None, {}, NOW, max_starts=2)
    assert plan.start == ["0", "1"]
    assert plan.spare == [("2", _s(-1.0)), ("3", _s(-1.0))]
    assert plan.running == {"a": 2, GLOBAL: 2}


def test_max_starts__slots_need_no_place_and_a_spare_run_takes_no_slot() -> None:
    runs = [_run(str(i), tenant="b" if i == 0 else "a") for i in range(4)]
    rule = {"a": TenantLimits(None, 10.0)}
    plan = plan_limits(runs, rule, None, {"a": Usage(0, _s(-1.0))}, NOW, max_starts=1)
    assert plan.start == ["0"]
    assert plan.spare == [("1", NOW), ("2", NOW), ("3", NOW)], "could start now: no slot taken"
    assert (plan.slotted, plan.tat) == ([], {})
    backlog = plan_limits(runs, rule, None, {"a": Usage(0, _s(1.0))}, NOW, max_starts=1)
    assert backlog.start == ["0"]
    assert backlog.slotted == [("1", _s(1.0)), ("2", _s(1.1)), ("3", _s(1.2))]


def test_rate_slot__is_not_taken_for_a_run_waiting_for_a_predecessor() -> None:
    """Stores wake runs whose reason starts with plan.WAITING; a slotted run must not be one."""
    from onbeat.limits import RATE_SLOT
    from onbeat.plan import WAITING

    assert not RATE_SLOT.startswith(WAITING)
