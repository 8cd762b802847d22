"""The scheduler's transactions: shard leases, dispatch, repair, sweep and reap."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from onbeat.batch_json import batch_json
from onbeat.model import (
    AttemptOutcome,
    Execution,
    ExecutionStatus,
    JobStatus,
    RetryPolicy,
    Trigger,
)
from onbeat.plan import (
    PlannedExecution,
    plan_dispatch,
    plan_reap,
)
from onbeat.queue.base import QueueItem
from onbeat.schedule import ScheduleKind
from onbeat.store.base import (
    DispatchParams,
    JobCursor,
    ShardLeases,
    SweepCursor,
    SweepPage,
)
from onbeat.store.rows import (
    MAX_US,
    from_us,
    misfire_policy,
    opt_dt,
    schedule_of,
    to_us,
)
from onbeat.store.sql_store.base import Connection, Row, retried
from onbeat.store.sql_store.limits import LimitTransactions


class SchedulingTransactions(LimitTransactions):
    """The scheduler's transactions: shard leases, dispatch, repair, sweep and reap."""

    @retried
    def shard_acquire(self, owner: str, lease_ttl: float) -> ShardLeases:
        now = self._now_us()
        ttl_us = int(lease_ttl * 1_000_000)
        args = {"owner": owner, "now": now, "lease_expires_at": now + ttl_us}
        with self._tx() as c:
            self._lock_shard_map(c)
            c.execute(self._q["scheduler_register"], args)
            c.execute(self._q["scheduler_forget_dead"], {"dead_before": now - ttl_us})
            # As even as possible: the first (shards % live) owners, by name, hold one shard more.
            live = [r[0] for r in c.execute(self._q["scheduler_live"])]
            base, extra = divmod(self.shard_count, len(live))
            fair_share = base + (1 if live.index(owner) < extra else 0)
            held = {r["shard"]: r["epoch"] for r in c.execute(self._q["shard_renew"], args)}
            acquired: set[int] = set()
            if len(held) > fair_share:
                excess = sorted(held)[fair_share:]
                c.execute(self._q["shard_give_up"], {"owner": owner, "shards": batch_json(excess)})
                for shard in excess:
                    del held[shard]
            elif len(held) < fair_share:
                for r in c.execute(
                    self._q["shard_take"], {**args, "wanted": fair_share - len(held)}
                ):
                    held[r["shard"]] = r["epoch"]
                    acquired.add(r["shard"])
        return ShardLeases(owner, held, frozenset(acquired))

    @retried
    def shard_release(self, owner: str) -> None:
        with self._tx() as c:
            c.execute(self._q["shard_release"], {"owner": owner})
            c.execute(self._q["scheduler_unregister"], {"owner": owner})

    def _fenced_shards(self, c: Connection, leases: ShardLeases) -> list[int]:
        """The shards whose lease this owner still holds at the epoch it believes: a scheduler
        that stalled past its lease finds its shards gone and writes nothing to them."""
        current = c.execute(self._q["shard_held"], {"owner": leases.owner, "now": self._now_us()})
        return [r["shard"] for r in current if leases.epochs.get(r["shard"]) == r["epoch"]]

    @retried
    def execution_dispatch(self, params: DispatchParams) -> list[QueueItem]:
        now = self.now()
        now_us = to_us(now)
        out: list[QueueItem] = []
        with self._tx() as c:
            shards = self._fenced_shards(c, params.leases)
            if not shards:
                return []
            rows = c.execute(
                self._q["execution_dispatch_candidates"],
                {
                    "shards": batch_json(shards),
                    "horizon": to_us(now + timedelta(seconds=params.window)),
                    "limit": params.limit,
                },
            ).fetchall()
            to_queue: list[str] = []
            catchups: list[str] = []
            to_skip: list[tuple[Row, str]] = []
            new_runs: list[tuple[str, int, int, PlannedExecution]] = []
            next_fires: dict[str, tuple[Row, PlannedExecution]] = {}
            schedule_trigger = Trigger.SCHEDULE.value
            cron = ScheduleKind.CRON.value
            grace_line = to_us(now - timedelta(seconds=params.misfire_grace))
            for r in rows:
                first_dispatch = r["attempt"] == 0 and r["trigger"] == schedule_trigger
                due_at = from_us(r["due_at"])  # once: the plan's and the queue item's
                if r["schedule_kind"] != cron and (not first_dispatch or r["due_at"] >= grace_line):
                    # A one-shot run on time, or one late on purpose (a retry, a release, a run
                    # now): plan_dispatch would say "run" and plan nothing after it.
                    to_queue.append(r["id"])
                    out.append(QueueItem(r["id"], due_at, r["priority"], r["shard"]))
                    continue
                plan = plan_dispatch(
                    schedule=schedule_of(r),
                    misfire=misfire_policy(r["misfire"]),
                    catchup_window=r["catchup_window"],
                    jitter=r["jitter"],
                    scheduled_for=from_us(r["scheduled_for"]),
                    due_at=due_at,
                    first_dispatch=first_dispatch,
                    materialize_next=first_dispatch and r["scheduled_for"] == r["next_fire_at"],
                    now=now,
                    window=params.window,
                    misfire_grace=params.misfire_grace,
                    next_recorded=opt_dt(r["next_recorded"]),
                )
                if plan.current.run:
                    to_queue.append(r["id"])
                    if plan.current.catchup:
                        catchups.append(r["id"])
                    out.append(QueueItem(r["id"], due_at, r["priority"], r["shard"]))
                else:
                    to_skip.append((r, plan.current.reason or "skipped"))
                new_runs.extend((r["job_id"], r["shard"], r["priority"], run) for run in plan.also)
                if plan.next_fire is not None:
                    next_fires[r["job_id"]] = (r, plan.next_fire)
            c.execute(
                self._q["execution_mark_queued"], {"ids": batch_json(to_queue), "now": now_us}
            )
            if catchups:
                c.execute(self._q["execution_mark_catchup"], {"ids": batch_json(catchups)})
            if to_skip:
                self._end_pending(
                    c, [r for r, _ in to_skip], ExecutionStatus.SKIPPED, [w for _, w in to_skip]
                )
            heads = [
                (r["job_id"], r["shard"], r["priority"], run) for r, run in next_fires.values()
            ]
            inserted = self._insert_planned(c, [*new_runs, *heads])
            out.extend(
                QueueItem(run.id, run.due_at, priority, shard)
                for _, shard, priority, run in new_runs
                if run.status is ExecutionStatus.QUEUED and run.id in inserted
            )
            head_updates: dict[str, int | None] = {}
            for r, run in next_fires.values():
                head: datetime | None = run.scheduled_for
                if run.id not in inserted:  # the fire time has a run already: plan past it
                    head = self._plan_head(
                        c, r["job_id"], r["shard"], schedule_of(r), r["jitter"], r["priority"], head
                    )
                head_updates[r["job_id"]] = to_us(head) if head else None
            self._set_next_fires(c, head_updates, now_us)
        return out

    @retried
    def job_repair_next_runs(
        self, leases: ShardLeases, after: JobCursor | None, limit: int
    ) -> tuple[list[str], JobCursor | None]:
        """The page is read without a lock or a write transaction: almost every pass finds every
        job healthy, and 100,000 cron jobs locked a page at a time cost a minute's pass 1.8 s
        of PostgreSQL. Only the suspects it finds are locked, fenced and judged again."""
        start = JobCursor(-1, "") if after is None else after
        shards = sorted(s for s in leases.epochs if s >= start.shard)
        with self._read() as c:
            page = c.execute(
                self._q["jobs_cron_page"],
                {
                    "shards": batch_json(shards),
                    "after_shard": start.shard,
                    "after_id": start.job_id,
                    "limit": limit,
                },
            ).fetchall()
        suspects = [r for r in page if not r["has_next_run"]]
        repaired = self._repair_next_runs(leases, suspects) if suspects else []
        if len(page) < limit:
            return repaired, None
        return repaired, JobCursor(page[-1]["shard"], page[-1]["id"])

    def _repair_next_runs(self, leases: ShardLeases, suspects: Sequence[Row]) -> list[str]:
        """Plan the next run of each suspect that still lacks one once locked, in a shard this
        scheduler still holds."""
        now = self.now()
        repaired = []
        with self._tx() as c:
            fenced = set(self._fenced_shards(c, leases))
            ids = [r["id"] for r in suspects if r["shard"] in fenced]
            locked = c.execute(self._q["jobs_lock_active_cron"], {"ids": batch_json(ids)})
            ids = [r["id"] for r in locked]
            for r in c.execute(self._q["jobs_next_run_state"], {"ids": batch_json(ids)}):
                if r["has_next_run"]:
                    continue
                schedule = schedule_of(r)
                fire = opt_dt(r["next_fire_at"])
                if fire is None:
                    latest = opt_dt(r["latest_fire"])
                    fire = schedule.next_fire_after(max(latest, now) if latest else now)
                self._replan(c, r["id"], r["shard"], schedule, r["jitter"], r["priority"], fire)
                repaired.append(r["id"])
        return repaired

    def execution_sweep(
        self,
        leases: ShardLeases,
        shards: Sequence[int],
        overdue_by: float | None,
        limit: int,
        after: SweepCursor | None = None,
    ) -> SweepPage:
        """Range reads on executions_dispatch from the cursor's (shard, due_at, id) on, by the
        backend's ``_sweep_rows``."""
        now = self.now()
        before = to_us(now - timedelta(seconds=overdue_by)) if overdue_by is not None else MAX_US
        start = after.shard if after is not None else -1
        owned = sorted({s for s in shards if s in leases.epochs and s >= start})
        rows = self._sweep_rows(owned, before, limit, after)
        items = [QueueItem(r["id"], from_us(r["due_at"]), r["priority"], r["shard"]) for r in rows]
        if not rows or len(items) < limit:
            return SweepPage(items, None)
        last = rows[-1]
        return SweepPage(items, SweepCursor(last["shard"], from_us(last["due_at"]), last["id"]))

    def _sweep_rows(
        self, owned: list[int], before: int, limit: int, after: SweepCursor | None
    ) -> list[Row]:
        """One read per shard (SQLite: in-process, no round trips to save)."""
        found: list[Row] = []
        with self._read() as c:
            for shard in owned:
                if len(found) >= limit:
                    break
                after_due_at, after_id = -MAX_US, ""  # from the shard's first run
                if after is not None and shard == after.shard:
                    after_due_at, after_id = to_us(after.due_at), after.execution_id
                found += c.execute(
                    self._q["execution_sweep"],
                    {
                        "shard": shard,
                        "before": before,
                        "after_due_at": after_due_at,
                        "after_id": after_id,
                        "limit": limit - len(found),
                    },
                ).fetchall()
        return found

    @retried
    def execution_reap(self, limit: int, restart_grace: float = 0.0) -> list[Execution]:
        """Read the expired leases without a write transaction (most passes find none, and every
        scheduler of every process reaps every second), decide each run in Python, then apply the
        decisions with one conditional UPDATE and log the lost attempts (and dead letters) of
        exactly the runs it changed."""
        now_us = self._now_us()
        with self._read() as c:
            expired = {
                r["id"]: r
                for r in c.execute(
                    self._q["execution_expired_leases"],
                    {"now": now_us, "limit": limit, "restart_grace": restart_grace},
                )
            }
        if not expired:
            return []
        decisions = [_reap_decision(r, now_us) for r in expired.values()]
        with self._tx() as c:
            self._lock_jobs_of_runs(c, list(expired))
            reaped = c.execute(
                self._q["execution_reap"], {"decisions": batch_json(decisions), "now": now_us}
            ).fetchall()
            c.executemany(
                self._q["attempt_end"],
                [
                    {
                        "id": r["id"],
                        "fencing_token": r["fencing_token"],
                        "worker": expired[r["id"]]["lease_owner"],  # the reap cleared the row's
                        "outcome": AttemptOutcome.LOST.value,
                        "error": r["last_error"],
                        "now": now_us,
                    }
                    for r in reaped
                    if r["started_at"] is not None  # a run claimed ahead had no attempt yet
                ],
            )
            failed = [r for r in reaped if r["status"] == ExecutionStatus.FAILED.value]
            self._dead_letter(
                c,
                [
                    {
                        "id": r["id"],
                        "job_id": r["job_id"],
                        "tenant": expired[r["id"]]["tenant"],
                        "attempts": r["attempt"],
                        "error": r["last_error"],
                        "now": now_us,
                        "scheduled_for": r["scheduled_for"],
                    }
                    for r in failed
                ],
            )
            ended = [r for r in reaped if r["status"] != ExecutionStatus.QUEUED.value]
            self._archive(c, [r["id"] for r in ended])
            self._complete_one_shots(c, ended)
            self._wake_waiting(c, [r["job_id"] for r in reaped], now_us)
            self._usage_end(c, [expired[r["id"]]["tenant"] for r in reaped])  # last: lock order
            return self._with_attempts(c, reaped)


def _reap_decision(r: Row, now_us: int) -> dict[str, Any]:
    """``plan_reap``'s verdict on an expired lease, as the reap statement takes it. A run
    claimed ahead whose worker went before its due time never began: queued again, no attempt
    lost."""
    if r["started_at"] is None:
        return {
            "id": r["id"],
            "fencing_token": r["fencing_token"],
            "status": ExecutionStatus.QUEUED.value,
            "due_at": None,
            "error": None,
            "reason": None,
        }
    end = plan_reap(
        job_cancelled=r["job_status"] == JobStatus.CANCELLED.value,
        attempt=r["attempt"],
        retry=RetryPolicy(r["max_attempts"], r["backoff_base"], r["backoff_cap"]),
    )
    return {
        "id": r["id"],
        "fencing_token": r["fencing_token"],
        "status": end.status.value,
        "due_at": None if end.due_in is None else now_us + int(end.due_in * 1_000_000),
        "error": f"worker lost: lease expired during attempt {r['attempt']}",
        "reason": end.reason,
    }
