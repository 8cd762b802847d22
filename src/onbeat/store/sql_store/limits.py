"""Fleet limits in the store: the per-tenant overrides, and the counters every transaction that
starts or ends runs keeps right (``tenant_usage``: runs in flight per tenant and for the fleet,
and each tenant's GCRA arrival time). The decision itself is ``onbeat.limits.plan_limits``.

Lock order (PostgreSQL): a transaction locks jobs, then runs, then the ``tenant_usage`` rows,
the fleet's row ('') first and then the tenants by name; a claim locks them only when a limit
applies to one of its runs, and every writer of the counters writes them with one statement, at
the end of its transaction, in that order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from onbeat.batch_json import batch_json
from onbeat.limits import (
    GLOBAL,
    RATE_SLOT,
    LimitCandidate,
    LimitDefaults,
    TenantLimits,
    Usage,
    plan_limits,
)
from onbeat.store.rows import from_us, to_us
from onbeat.store.sql_store.base import Connection, Row, SQLBase, retried


@dataclass
class ClaimLimits:
    """What the limits make of the runs a claim would start."""

    start: set[str]
    held: list[tuple[str, datetime]] = field(default_factory=list)
    """Hand back to the queue, due then (slotted ones included)."""
    tat: dict[str, datetime] = field(default_factory=dict)
    """New arrival times, to write with the counters."""
    held_back: int = 0
    """Runs the limits held back (not those beyond the caller's free places)."""


class LimitTransactions(SQLBase):
    """Per-tenant limits and the counters the claim decides on."""

    @retried
    def tenant_limits_set(self, tenant: str, limits: TenantLimits) -> None:
        with self._tx(settle=True) as c:
            c.execute(
                self._q["tenant_limits_put"],
                {
                    "tenant": tenant,
                    "max_in_flight": limits.max_in_flight,
                    "max_starts_per_second": limits.max_starts_per_second,
                    "now": self._now_us(),
                },
            )

    def tenant_limits_get(self, tenant: str) -> TenantLimits:
        with self._read() as c:
            overrides = self._overrides(c, [tenant])
        return overrides.get(tenant, TenantLimits())

    def tenant_usage(self, tenant: str) -> Usage:
        with self._read() as c:
            row = c.execute(self._q["tenant_usage_get"], {"tenant": tenant}).fetchone()
        if row is None:
            return Usage()
        return Usage(row["running"], None if row["tat"] is None else from_us(row["tat"]))

    def _overrides(self, c: Connection, tenants: Sequence[str]) -> dict[str, TenantLimits]:
        rows = c.execute(self._q["tenant_limits_of"], {"tenants": batch_json(sorted(tenants))})
        return {
            r["tenant"]: TenantLimits(r["max_in_flight"], r["max_starts_per_second"]) for r in rows
        }

    def _rules(
        self, c: Connection, tenants: Sequence[str], defaults: LimitDefaults
    ) -> dict[str, TenantLimits]:
        """tenant -> the limits in force for it: its overrides, else the fleet's defaults."""
        names = sorted(set(tenants))
        overrides = self._overrides(c, names) if names else {}
        return {t: defaults.of(overrides.get(t)) for t in names}

    def _unlimited(
        self, c: Connection, tenants: Sequence[str], defaults: LimitDefaults
    ) -> set[str]:
        """The tenants no limit applies to: a claim may start their runs ahead of time."""
        if defaults.max_in_flight is not None:
            return set()
        return {
            t
            for t, rule in self._rules(c, tenants, defaults).items()
            if rule.max_in_flight is None and rule.max_starts_per_second is None
        }

    def _claim_limits(
        self,
        c: Connection,
        rows: Sequence[Row],
        frees: Mapping[str, int],
        defaults: LimitDefaults,
        now: datetime,
        max_starts: int | None,
    ) -> ClaimLimits:
        """Decide the limits of the runs a claim would start (``rows``, claim candidates;
        ``frees``: run id -> runs of its tenant its start cancels; at most ``max_starts`` start).
        Reads the tenants' overrides; locks and reads the counters only if a limit applies."""
        limits = self._rules(c, [r["tenant"] for r in rows], defaults)
        limited = [
            t
            for t, rule in limits.items()
            if rule.max_in_flight is not None or rule.max_starts_per_second is not None
        ]
        usage: dict[str, Usage] = {}
        if limited or defaults.max_in_flight is not None:
            # The fleet's row first, always: tenant_usage_add writes it first too (lock order).
            locked = batch_json([GLOBAL, *limited])
            usage = {
                r["tenant"]: Usage(r["running"], None if r["tat"] is None else from_us(r["tat"]))
                for r in c.execute(self._q["tenant_usage_lock"], {"tenants": locked})
            }
        elif (max_starts is None or len(rows) <= max_starts) and not any(
            r["reason"] == RATE_SLOT for r in rows
        ):
            return ClaimLimits({r["id"] for r in rows})  # nothing to decide
        candidates = [
            LimitCandidate(
                r["id"],
                r["tenant"],
                r["priority"],
                from_us(r["due_at"]),
                from_us(max(r["due_at"], r["queued_at"] or 0)),
                from_us(r["queued_at"]) if r["reason"] == RATE_SLOT and r["queued_at"] else None,
                frees.get(r["id"], 0),
            )
            for r in rows
        ]
        plan = plan_limits(candidates, limits, defaults.max_in_flight, usage, now, max_starts)
        if plan.slotted:
            c.executemany(
                self._q["execution_hold_for_slot"],
                [{"id": i, "slot": to_us(slot), "reason": RATE_SLOT} for i, slot in plan.slotted],
            )
        return ClaimLimits(
            set(plan.start),
            [*plan.held, *plan.slotted, *plan.spare],
            plan.tat,
            len(plan.held) + len(plan.slotted),
        )

    def _usage_add(
        self,
        c: Connection,
        running: Mapping[str, int],
        tat: Mapping[str, datetime] | None = None,
    ) -> None:
        """Apply changes of the counters (tenant -> change of runs in flight; ``GLOBAL`` is
        derived when missing) and new arrival times, in one statement, in lock order."""
        changes = dict(running)
        if GLOBAL not in changes:
            changes[GLOBAL] = sum(changes.values())
        tats = tat or {}
        keys = sorted(set(changes) | set(tats))
        if all(changes.get(k, 0) == 0 for k in keys) and not tats:
            return
        c.execute(
            self._q["tenant_usage_add"],
            {
                "changes": batch_json(
                    [
                        {
                            "tenant": k,
                            "running": changes.get(k, 0),
                            "tat": to_us(tats[k]) if k in tats else None,
                        }
                        for k in keys
                    ]
                )
            },
        )

    def _usage_end(self, c: Connection, tenants: Sequence[str]) -> None:
        """Runs of these tenants (one entry per run) stopped running."""
        if tenants:
            ended = Counter(tenants)
            self._usage_add(c, {t: -n for t, n in ended.items()})
