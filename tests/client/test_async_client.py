"""``onbeat.client.AsyncClient`` against a real node: the same methods as coroutines (the
``iter_*`` ones as async iterators), the same results and errors."""

from __future__ import annotations

import asyncio
import inspect
import re
from datetime import UTC, datetime, timedelta

import pytest

from onbeat import ExecutionStatus, JobStatus, Trigger, ValidationError
from onbeat.client import (
    ApiConflictError,
    ApiConnectionError,
    ApiNotFoundError,
    ApiValidationError,
    AsyncClient,
    Client,
    ExecutionInfo,
    JobDetail,
    JobSpec,
)
from tests.client.conftest import LiveNode, free_port

MISSING_ID = "0123456789abcdef0123456789abcdef"


async def finished(client: AsyncClient, job_id: str, timeout: float = 10) -> JobDetail:
    async with asyncio.timeout(timeout):
        while True:
            job = await client.get_job(job_id)
            if job.executions and job.executions[0].status.is_final:
                return job
            await asyncio.sleep(0.05)


def test_async_client__has_every_method_of_client_as_a_coroutine() -> None:
    names = {n for n in dir(Client) if not n.startswith("_") and n not in ("close",)}
    assert names == {n for n in dir(AsyncClient) if not n.startswith("_") and n != "aclose"}
    client = AsyncClient("http://127.0.0.1:1")
    try:
        for name in names:
            method = getattr(client, name)
            if name.startswith("iter_"):
                assert inspect.isasyncgenfunction(method), name
            else:
                assert inspect.iscoroutinefunction(method), name
            assert method.__doc__ and method.__name__ == name
            assert inspect.signature(method) == getattr(Client, name)._signature
    finally:
        asyncio.run(client.aclose())


async def test_async_client__jobs_lifecycle(shared_live: LiveNode) -> None:
    async with AsyncClient(shared_live.url) as client:
        job = await client.create_job(
            "echo", {"n": 1}, cron="0 9 * * MON-FRI", timezone="Europe/Berlin", priority=2
        )
        assert (job.status, job.priority, len(job.next_fire_times)) == (JobStatus.ACTIVE, 2, 5)
        [planned] = (await client.get_job(job.id)).executions
        assert (planned.status, planned.scheduled_for) == (
            ExecutionStatus.SCHEDULED,
            job.next_fire_at,
        )
        assert (await client.update_job(job.id, params={"n": 2})).params == {"n": 2}
        assert (await client.pause(job.id)).status is JobStatus.PAUSED
        with pytest.raises(ApiConflictError):
            await client.run_now(job.id)
        assert (await client.resume(job.id)).status is JobStatus.ACTIVE
        execution = await client.run_now(job.id)
        assert isinstance(execution, ExecutionInfo) and execution.trigger is Trigger.MANUAL
        assert (await client.get_execution(execution.id)).job_id == job.id
        page = await client.list_executions(job.id, status=ExecutionStatus.SCHEDULED, limit=1)
        assert [e.status for e in page.items] == [ExecutionStatus.SCHEDULED]
        executions = [e.id async for e in client.iter_executions(job.id, page_size=1)]
        assert execution.id in executions
        assert (await client.cancel(job.id)).status is JobStatus.CANCELLED


async def test_async_client__lists_and_iterates_every_page(live: LiveNode) -> None:
    async with AsyncClient(live.url) as client:
        ids = [(await client.create_job("echo", cron="0 3 * * *")).id for _ in range(3)]
        batch = await client.create_jobs(
            [JobSpec("echo", {"n": n}, cron="0 3 * * *") for n in (1, 2)]
        )
        assert [j.params for j in batch] == [{"n": 1}, {"n": 2}]
        ids += [j.id for j in batch]
        first = await client.list_jobs(limit=2)
        assert [j.id for j in first.items] == ids[:2] and first.next_cursor
        assert [j.id async for j in client.iter_jobs(page_size=2)] == ids
        assert [t.name for t in (await client.list_tasks()).items] == ["echo", "fail"]


async def test_async_client__dead_letters_preview_audit_and_health(live: LiveNode) -> None:
    async with AsyncClient(live.url) as client:
        failed = await finished(client, (await client.create_job("fail")).id)
        [dead] = [d async for d in client.iter_dead_letters(page_size=1)]
        assert (dead.job_id, dead.id) == (failed.id, failed.executions[0].id)
        assert (await client.list_dead_letters()).items == [dead]
        replayed = await client.replay_dead_letter(dead.id)
        assert replayed.status is ExecutionStatus.SCHEDULED
        await finished(client, failed.id)
        await client.drop_dead_letter(dead.id)
        assert (await client.list_dead_letters()).items == []

        preview = await client.preview("0 0 * * *", after="2026-01-01T00:00:00Z", count=2)
        assert [f.at.day for f in preview.fire_times] == [2, 3]

        at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
        once = await finished(client, (await client.create_job("echo", at=at)).id)
        report = await client.audit(once.id, since=at - timedelta(seconds=1), until=None)
        assert (report.expected, report.missing, report.records) == (1, [], {"succeeded": 1})

        assert (await client.health()).status == "ok"
        assert (await client.ready()).checks == {"store": "ok", "store_writes": "ok"}


async def test_async_client__typed_errors(shared_live: LiveNode) -> None:
    async with AsyncClient(shared_live.url) as client:
        with pytest.raises(ApiNotFoundError):
            await client.get_job(MISSING_ID)
        with pytest.raises(ApiValidationError) as raised:
            await client.create_job("echo", cron="0 0 30 2 *")
        assert isinstance(raised.value, ValidationError)
        assert raised.value.field == "schedule.expression"
        with pytest.raises(ApiValidationError) as raised:
            [j async for j in client.iter_jobs(page_size=0)]
        assert raised.value.field == "limit"


async def test_async_client__connection_refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncClient(url) as client:
        with pytest.raises(ApiConnectionError, match=re.escape(f"{url}/api/v1/healthz")):
            await client.health()
