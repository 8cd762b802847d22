"""The dashboard's reads: each an index range, never a scan."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

from onbeat.batch_json import batch_json
from onbeat.model import (
    Execution,
    ExecutionStatus,
    Job,
    JobStatus,
)
from onbeat.store.base import (
    MAX_SEARCH_TASKS,
    ActivityBucket,
    SchedulerShards,
    WorkerLoad,
)
from onbeat.store.rows import (
    TEXT_MAX,
    after_last,
    execution_of,
    from_us,
    job_of,
    prefix_end,
    to_us,
    unique,
)
from onbeat.store.sql_store.base import Connection, SQLBase


class DashboardReads(SQLBase):
    """The dashboard's reads: each an index range, never a scan."""

    def job_search(
        self,
        *,
        tenant: str | None,
        status: JobStatus | None = None,
        text: str | None = None,
        after_id: str | None = None,
        limit: int = 50,
    ) -> list[Job]:
        # One covering-index range per (tenant, status) and per (tenant, task, status), each in
        # id order and at most ``limit`` long, merged: no filter combination scans the table.
        id_from = "" if after_id is None else after_last([after_id])
        statuses = [status] if status is not None else list(JobStatus)
        with self._read() as c:
            tenants = [tenant] if tenant is not None else self._tenants(c)
            pages: list[list[str]] = []
            for owner in tenants:
                ranges = [("", TEXT_MAX)]
                tasks: list[str] = []
                if text:
                    ranges = [(text.lower(), prefix_end(text.lower()))]
                    tasks = self._tasks_from(c, owner, text)
                for state, (low, high) in itertools.product(statuses, ranges):
                    args = {"tenant": owner, "status": state.value, "limit": limit}
                    args |= {"id_from": max(id_from, low), "id_to": high}
                    pages.append([r[0] for r in c.execute(self._q["job_search_ids"], args)])
                for state, task in itertools.product(statuses, tasks):
                    args = {"tenant": owner, "task": task, "status": state.value}
                    args |= {"id_from": id_from, "limit": limit}
                    pages.append([r[0] for r in c.execute(self._q["job_search_ids_of_task"], args)])
            ids = list(itertools.islice(unique(heapq.merge(*pages)), limit))
            return [job_of(r) for r in c.execute(self._q["jobs_by_ids"], {"ids": batch_json(ids)})]

    def _tenants(self, c: Connection) -> list[str]:
        """Every tenant that has a job, one index seek each."""
        found: list[str] = []
        while (
            tenant := c.execute(self._q["job_tenant_from"], {"from": after_last(found)}).fetchone()[
                0
            ]
        ) is not None:
            found.append(tenant)
        return found

    def _tasks_from(self, c: Connection, tenant: str, prefix: str) -> list[str]:
        """The first ``MAX_SEARCH_TASKS`` task names of ``tenant`` that start with ``prefix``."""
        found: list[str] = []
        args = {"tenant": tenant, "to": prefix_end(prefix)}
        while len(found) < MAX_SEARCH_TASKS:
            start = after_last(found) if found else prefix
            task = c.execute(self._q["job_task_from"], {**args, "from": start}).fetchone()[0]
            if task is None:
                break
            found.append(task)
        return found

    def execution_activity(
        self, *, tenant: str | None, since: datetime, until: datetime, bucket: timedelta
    ) -> list[ActivityBucket]:
        since_us, bucket_us = to_us(since), bucket // timedelta(microseconds=1)
        count = -(-(to_us(until) - since_us) // bucket_us)
        args = {
            "tenant": tenant,
            "since": since_us,
            "until": to_us(until),
            "bucket": bucket_us,
            "shards": batch_json(list(range(self.shard_count))),
        }
        finished: list[Counter[ExecutionStatus]] = [Counter() for _ in range(count)]
        delays: list[Counter[int]] = [Counter() for _ in range(count)]
        depth_change = [0] * count  # runs that joined the queue minus runs that left it
        with self._read() as c:
            for r in c.execute(self._q["execution_activity"], args):
                if r["ended"] is not None:
                    finished[r["ended"]][ExecutionStatus(r["status"])] += r["runs"]
                    if r["delay_class"] is not None:
                        delays[r["ended"]][r["delay_class"]] += r["runs"]
                if r["joined"] is not None:
                    depth_change[r["joined"]] += r["runs"]
                    if r["left_at"] is not None and r["left_at"] < count:
                        depth_change[r["left_at"]] -= r["runs"]
        depths = itertools.accumulate(depth_change)
        return [
            ActivityBucket(since + i * bucket, finished[i], delays[i], depth)
            for i, depth in enumerate(depths)
        ]

    def execution_running_by_owner(self, *, tenant: str | None) -> list[WorkerLoad]:
        args = {"tenant": tenant, "now": self._now_us()}
        with self._read() as c:
            return [
                WorkerLoad(r["owner"], r["running"], r["expired"])
                for r in c.execute(self._q["execution_running_by_owner"], args)
            ]

    def execution_backlog(self) -> dict[int, int]:
        with self._read() as c:
            rows = c.execute(self._q["execution_backlog"], {"now": self._now_us()})
            return {r["priority"]: r["runs"] for r in rows}

    def scheduler_shards(self) -> list[SchedulerShards]:
        with self._read() as c:
            return [
                SchedulerShards(r["owner"], r["shards"], from_us(r["last_seen"]))
                for r in c.execute(self._q["scheduler_shards"], {"now": self._now_us()})
            ]

    def dead_letter_count(self, *, tenant: str | None, limit: int) -> int:
        total = 0
        with self._read() as c:
            for owner in [tenant] if tenant is not None else self._tenants(c):
                args = {"tenant": owner, "limit": limit - total}
                total += c.execute(self._q["dead_letter_count_of_tenant"], args).fetchone()[0]
                if total >= limit:
                    break
        return total

    def execution_last_of_jobs(self, job_ids: Sequence[str]) -> dict[str, Execution]:
        with self._read() as c:
            rows = c.execute(self._q["execution_last_of_jobs"], {"ids": batch_json(list(job_ids))})
            last: dict[str, Execution] = {}
            for r in rows:  # a backend may answer a job's newest final and running runs apart
                run = execution_of(r, ())
                if run.job_id not in last or run.scheduled_for > last[run.job_id].scheduled_for:
                    last[run.job_id] = run
            return last
