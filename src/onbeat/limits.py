"""Fleet limits, the pure decision: which of the runs a claim is about to start may start now,
under a global cap on runs in flight and per-tenant caps on runs in flight and starts per second.

The store calls :func:`plan_limits` inside its claim transaction, with the counters it locked
(``tenant_usage``), so the limits hold across every worker process. Apart from ``plan.py`` (which
it follows) only because that module is long enough already.

- **Starts per second** is a GCRA (generic cell rate algorithm): each tenant has a *theoretical
  arrival time* ``tat``; a run may start at ``max(now, tat)`` and moves ``tat`` on by
  ``1 / rate``. A run whose time is later than now gets that time as its *slot*: the store writes
  the slot on the run and hands it back to the queue due then, so the queue brings it back
  exactly when it may start, and it starts then without asking the rate again. Each run is
  deferred by the rate at most once, whatever the backlog: no churn.
- **Runs in flight** (a tenant's cap and the global one): a run that would exceed a cap is handed
  back for a re-check after ``IN_FLIGHT_RECHECK``, growing with how long it has waited up to
  ``IN_FLIGHT_RECHECK_MAX``. Nothing is written for it. A constant interval would make the
  re-checks grow with the backlog (20,000 waiting runs every 0.2 s is 100,000 claims per second,
  all of a fleet's spare claiming); the backoff bounds them by ``waiting runs /
  IN_FLIGHT_RECHECK_MAX`` per second at worst, at the price of a run starting up to that much
  after a place frees.
- **Priority**: the runs are decided in priority order (highest tier first), then by due time,
  so within what the limits allow the high tiers start first and get the earlier slots. A slot
  once given is kept: a high-priority run that arrives after a tenant's backlog got its slots
  waits behind them.
- **Free places**: at most ``max_starts`` runs start (the claiming worker's free places); a run
  that could start beyond them goes back as it was, taking no slot. A slot takes no place, so a
  worker with few free places still gives a whole batch of a tenant's burst its slots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

GLOBAL = ""
"""The ``tenant_usage`` row of the whole fleet (no tenant has an empty name); it sorts first,
which is the lock order: the global row, then the tenants by name."""
IN_FLIGHT_RECHECK = 0.2
"""Seconds until a run held back by a cap on runs in flight is first checked again."""
IN_FLIGHT_RECHECK_MAX = 2.0
"""Most seconds between two checks of a run held back by a cap on runs in flight."""
IN_FLIGHT_BACKOFF = 0.25
"""A held run is checked again after this fraction of the time it has waited (within the
bounds above): its re-checks grow geometrically, so a long wait costs few of them."""
MAX_IN_FLIGHT = 1_000_000_000
"""The highest cap on runs in flight a tenant may be given (the column is a 32-bit integer)."""
MIN_STARTS_PER_SECOND = 1e-6
"""The lowest starts/s limit a tenant may be given (one start per 11.6 days)."""
MAX_STARTS_PER_SECOND = 1_000_000.0
"""The highest starts/s limit a tenant may be given (beyond it a slot is under a microsecond, the
store's time resolution)."""
RATE_SLOT = "waits for its slot under the tenant's starts-per-second limit"
"""The reason of a queued run that holds a slot (its ``queued_at`` is the slot): stores find them
by it, and such a run starts at its slot without taking another."""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits; None leaves the fleet's default (``LimitDefaults``) in force."""

    max_in_flight: int | None = None
    max_starts_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class LimitDefaults:
    """The limits a worker claims under (its ``Settings``): the global cap, and the per-tenant
    limits of every tenant without an override of its own. None is no limit."""

    max_in_flight: int | None = None
    tenant_max_in_flight: int | None = None
    tenant_max_starts_per_second: float | None = None

    def of(self, override: TenantLimits | None) -> TenantLimits:
        """A tenant's limits in force: its override's where set, else these defaults."""
        own = override or TenantLimits()
        return TenantLimits(
            own.max_in_flight if own.max_in_flight is not None else self.tenant_max_in_flight,
            own.max_starts_per_second
            if own.max_starts_per_second is not None
            else self.tenant_max_starts_per_second,
        )


NO_LIMITS = LimitDefaults()


@dataclass(frozen=True, slots=True)
class Usage:
    """A ``tenant_usage`` row: runs in flight, and the GCRA's theoretical arrival time."""

    running: int = 0
    tat: datetime | None = None


@dataclass(frozen=True, slots=True)
class LimitCandidate:
    """A run the claim would start, with what the limits need of it."""

    id: str
    tenant: str
    priority: int
    due_at: datetime
    waiting_since: datetime
    """Since when it has been waiting to start (its due time, or its slot)."""
    slot: datetime | None = None
    """The slot it already holds under the tenant's rate, if any."""
    frees: int = 0
    """Runs of its tenant its start ends (overlap=replace cancels them)."""


@dataclass
class LimitPlan:
    start: list[str] = field(default_factory=list)
    slotted: list[tuple[str, datetime]] = field(default_factory=list)
    """Given a slot later than now: write it on the run, hand the run back due then."""
    held: list[tuple[str, datetime]] = field(default_factory=list)
    """Over a cap on runs in flight (or early for the slot it holds): hand back due then."""
    spare: list[tuple[str, datetime]] = field(default_factory=list)
    """Beyond ``max_starts``: hand back due as they were, for the next claim."""
    running: dict[str, int] = field(default_factory=dict)
    """Change of each counter (tenant, and ``GLOBAL``) by the runs this plan starts."""
    tat: dict[str, datetime] = field(default_factory=dict)
    """New theoretical arrival time of each tenant whose rate this plan used."""


def in_flight_recheck(waited: float) -> float:
    """Seconds until a run over a cap on runs in flight, waiting for ``waited`` s, is checked
    again."""
    return min(IN_FLIGHT_RECHECK_MAX, max(IN_FLIGHT_RECHECK, waited * IN_FLIGHT_BACKOFF))


def plan_limits(
    candidates: Sequence[LimitCandidate],
    limits: Mapping[str, TenantLimits],
    global_cap: int | None,
    usage: Mapping[str, Usage],
    now: datetime,
    max_starts: int | None = None,
) -> LimitPlan:
    """Decide which ``candidates`` start now, which get a slot under their tenant's rate and which
    wait for a place under a cap on runs in flight. ``limits`` are each tenant's limits in force,
    ``usage`` the counters (``GLOBAL`` for the fleet) as locked by the claim. Past ``max_starts``
    (the caller's free places) a run that could start is handed back as it is (``spare``),
    taking nothing."""
    plan = LimitPlan()
    running = {tenant: u.running for tenant, u in usage.items()}
    tat = {tenant: u.tat for tenant, u in usage.items()}
    for run in sorted(candidates, key=lambda r: (-r.priority, r.due_at, r.id)):
        rule = limits.get(run.tenant, TenantLimits())
        if run.slot is not None and run.slot > now:
            plan.held.append((run.id, run.slot))  # the queue handed it out before its slot
            continue
        after = running.get(run.tenant, 0) - run.frees
        total = running.get(GLOBAL, 0) - run.frees
        if (rule.max_in_flight is not None and after >= rule.max_in_flight) or (
            global_cap is not None and total >= global_cap
        ):
            waited = max(0.0, (now - run.waiting_since).total_seconds())
            plan.held.append((run.id, now + timedelta(seconds=in_flight_recheck(waited))))
            continue
        rate = rule.max_starts_per_second
        at = now
        if run.slot is None and rate is not None:
            previous = tat.get(run.tenant)
            at = now if previous is None or previous < now else previous
            if at > now:  # a slot takes no place: given even when no place is free
                tat[run.tenant] = plan.tat[run.tenant] = at + timedelta(seconds=1 / rate)
                plan.slotted.append((run.id, at))
                continue
        if max_starts is not None and len(plan.start) >= max_starts:
            plan.spare.append((run.id, run.waiting_since))
            continue
        if run.slot is None and rate is not None:
            tat[run.tenant] = plan.tat[run.tenant] = at + timedelta(seconds=1 / rate)
        running[run.tenant] = after + 1
        running[GLOBAL] = total + 1
        plan.running[run.tenant] = plan.running.get(run.tenant, 0) + 1 - run.frees
        plan.running[GLOBAL] = plan.running.get(GLOBAL, 0) + 1 - run.frees
        plan.start.append(run.id)
    return plan
