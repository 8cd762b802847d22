"""The claim and finish transactions of ``PostgresStore``, one statement at a time, on any driver.

``claim_steps`` and ``finish_steps`` are generators: each yields a ``Step`` (a named statement
and its parameters) and is sent back the rows it returned, so the same sequence of statements,
with the same parameters and the same little Python between them, runs on psycopg (sync or
async) and on asyncpg. Only the driver differs, which is what ``bench/store_drivers.py``
measures; ``StoreDriver`` runs the real ``PostgresStore`` methods beside them.

Statements come from ``src/onbeat/store/sql/postgres/queries.sql``, in its one shape (``json``:
lists of ids and batches as one JSON parameter). The ``arrays`` and ``unnest`` shapes of issue 7
(``bench/store_drivers.sql``, on the ``executions`` table of before migration 0005) were dropped:
queries.sql took up their lessons (ids matched by ``= ANY``, one statement per batch).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from onbeat.store.base import Completion
from onbeat.store.postgres import PostgresStore
from onbeat.store.queries import load_queries

SHAPES = ("json",)
OWNER = "bench-worker"
LEASE_TTL = 60.0
MISFIRE_GRACE = 60.0
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_TYPED = {"now": "bigint"}
"""Parameters asyncpg cannot type from their place alone (``CASE ... ELSE :now END`` resolves to
text); psycopg sends a Python int as int8, so queries.sql needs no cast."""
Claimed = list[tuple[str, int]]
"""(execution id, fencing token) of each run a claim started."""


def named_statements(shape: str) -> dict[str, str]:
    """The statements of one shape, with ``:name`` parameters."""
    assert shape in SHAPES, shape
    return load_queries("postgres")


def psycopg_statements(shape: str) -> dict[str, str]:
    """As ``PostgresStore`` converts them: ``%(name)s`` placeholders, ``%`` doubled."""
    return {
        name: _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))
        for name, sql in named_statements(shape).items()
    }


def asyncpg_statements(shape: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``$n`` placeholders (one per distinct name) and the parameter names in ``$n`` order."""
    converted = {}
    for name, sql in named_statements(shape).items():
        order: list[str] = []

        def number(match: re.Match[str], order: list[str] = order) -> str:
            if match[1] not in order:
                order.append(match[1])
            n = order.index(match[1]) + 1
            return f"CAST(${n} AS {_TYPED[match[1]]})" if match[1] in _TYPED else f"${n}"

        converted[name] = (_PARAM.sub(number, sql), tuple(order))
    return converted


# --- the two transactions, as statements --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Step:
    name: str
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    many: bool = False
    """executemany: ``params`` is one mapping per run."""
    rows: bool = True
    """The caller reads the rows it returns."""


Transaction = Generator[Step, list[Any], Any]


def _ids(shape: str, ids: Sequence[str]) -> Any:
    return json.dumps(list(ids)) if shape == "json" else list(ids)


def claim_steps(shape: str, ids: Sequence[str], now_us: int) -> Transaction:
    """``PostgresStore.execution_claim`` for runs of jobs with nothing running and no tenant
    limits (what a backlog of ``now`` jobs is): lock the jobs, lock and read the runs, check what
    runs for their jobs, read the tenants' overrides, start the runs, count them in flight.
    Returns ``Claimed``."""
    yield Step("jobs_lock_of_runs", {"ids": _ids(shape, ids)}, rows=False)
    rows = yield Step("execution_claim_candidates", {"ids": _ids(shape, ids)})
    queued = [r for r in rows if r["status"] == "queued"]
    job_ids = sorted({r["job_id"] for r in queued})
    busy = {
        r["job_id"]
        for r in (yield Step("execution_running_of_jobs", {"job_ids": _ids(shape, job_ids)}))
    }
    to_start = [r for r in queued if r["job_id"] not in busy]
    tenants = sorted({r["tenant"] for r in to_start})
    yield Step("tenant_limits_of", {"tenants": _ids(shape, tenants)})
    started = yield Step(
        "execution_start_many",
        {
            "ids": _ids(shape, [r["id"] for r in to_start]),
            "owner": OWNER,
            "lease_expires_at": now_us + int(LEASE_TTL * 1_000_000),
            "now": now_us,
            "waited": False,
        },
    )
    yield _usage_step(shape, [r["tenant"] for r in to_start], +1)
    return [(r["id"], r["fencing_token"]) for r in started]


def finish_steps(shape: str, claimed: Claimed, now_us: int) -> Transaction:
    """``PostgresStore.execution_finish_many`` for successful runs: lock the jobs, lock and read
    the runs' tokens, then one statement moves the runs whose token still holds to the history
    with their attempts (completing their one-shot jobs, waking runs waiting for them), and the
    counters. Returns how many it finished."""
    ids = [run_id for run_id, _ in claimed]
    yield Step("jobs_lock_of_runs", {"ids": _ids(shape, ids)}, rows=False)
    current = {
        r["id"]: r for r in (yield Step("execution_current_tokens", {"ids": _ids(shape, ids)}))
    }
    done = []
    for run_id, token in claimed:
        r = current.pop(run_id, None)
        if r is not None and r["status"] == "running" and r["fencing_token"] == token:
            done.append(r)
    finishes = [
        {
            "id": r["id"],
            "job_id": r["job_id"],
            "fencing_token": r["fencing_token"],
            "scheduled_for": r["scheduled_for"],
            "status": "succeeded",
            "outcome": "succeeded",
            "result": "null",
            "error": None,
            "reason": None,
            "uncount_attempt": 0,
        }
        for r in done
    ]
    if finishes:
        yield Step(
            "execution_finish_final",
            {"finishes": json.dumps(finishes), "now": now_us},
            rows=False,
        )
    yield _usage_step(shape, [r["tenant"] for r in done], -1)
    return len(done)


def _usage_step(shape: str, tenants: Sequence[str], sign: int) -> Step:
    """``tenant_usage_add``: runs in flight per tenant and for the fleet (``''``, first)."""
    counts: dict[str, int] = {"": sign * len(tenants)}
    for tenant in tenants:
        counts[tenant] = counts.get(tenant, 0) + sign
    changes = [{"tenant": t, "running": n, "tat": None} for t, n in sorted(counts.items())]
    return Step("tenant_usage_add", {"changes": json.dumps(changes)}, rows=False)


def _now_us() -> int:
    return time.time_ns() // 1000


# --- drivers ----------------------------------------------------------------------------------
class Driver(Protocol):
    """Runs the two transactions, ``concurrency`` at a time, on its own connections."""

    async def open(self) -> None: ...

    async def claim(self, ids: Sequence[str]) -> Claimed: ...

    async def finish(self, claimed: Claimed) -> int: ...

    async def close(self) -> None: ...


class StoreDriver:
    """The real ``PostgresStore`` methods, from threads, as the worker calls them."""

    def __init__(self, url: str, concurrency: int) -> None:
        self._url = url
        self._concurrency = concurrency
        self.store: PostgresStore | None = None

    async def open(self) -> None:
        self.store = await asyncio.to_thread(PostgresStore, self._url, None, 16, False)
        for _ in range(3):  # let the pool grow to the connections the phases will use
            await asyncio.gather(
                *(
                    asyncio.to_thread(self.store.execution_heartbeat, OWNER, {}, LEASE_TTL)
                    for _ in range(self._concurrency)
                )
            )

    async def claim(self, ids: Sequence[str]) -> Claimed:
        assert self.store is not None
        result = await asyncio.to_thread(
            self.store.execution_claim, ids, OWNER, LEASE_TTL, MISFIRE_GRACE
        )
        return [(r.execution.id, r.execution.fencing_token) for r in result.started]

    async def finish(self, claimed: Claimed) -> int:
        assert self.store is not None
        done = [Completion(run_id, token, succeeded=True) for run_id, token in claimed]
        return len(await asyncio.to_thread(self.store.execution_finish_many, done))

    async def close(self) -> None:
        if self.store is not None:
            await asyncio.to_thread(self.store.close)


class PsycopgSyncDriver:
    """The statements on psycopg's sync connections (a pool), from threads."""

    def __init__(
        self,
        url: str,
        concurrency: int,
        shape: str,
        statement_seconds: dict[str, float] | None = None,
    ) -> None:
        self._shape = shape
        self._sql = psycopg_statements(shape)
        self.statement_seconds = statement_seconds
        """If given, the wall time of each statement is added to it, by statement name."""
        self._pool: ConnectionPool[psycopg.Connection[dict[str, Any]]] = ConnectionPool(
            url,
            min_size=concurrency,
            max_size=concurrency,
            kwargs={"row_factory": dict_row, "autocommit": True},
            open=False,
        )

    async def open(self) -> None:
        await asyncio.to_thread(self._pool.open, True)

    def _run(self, tx: Transaction) -> Any:
        with self._pool.connection() as conn, conn.transaction():
            try:
                step = next(tx)
                while True:
                    sql = self._sql[step.name]
                    started = time.perf_counter()
                    rows = []
                    if step.many:
                        if step.params:
                            with conn.cursor() as cursor:
                                cursor.executemany(sql, step.params)
                    else:
                        cursor = conn.execute(sql, step.params)
                        rows = cursor.fetchall() if step.rows else []
                    if self.statement_seconds is not None:
                        elapsed = time.perf_counter() - started
                        self.statement_seconds[step.name] = (
                            self.statement_seconds.get(step.name, 0.0) + elapsed
                        )
                    step = tx.send(rows)
            except StopIteration as end:
                return end.value

    async def claim(self, ids: Sequence[str]) -> Claimed:
        claimed: Claimed = await asyncio.to_thread(
            self._run, claim_steps(self._shape, ids, _now_us())
        )
        return claimed

    async def finish(self, claimed: Claimed) -> int:
        done: int = await asyncio.to_thread(
            self._run, finish_steps(self._shape, claimed, _now_us())
        )
        return done

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.close)


class PsycopgAsyncDriver:
    """The statements on psycopg's ``AsyncConnection`` (an async pool), on the event loop."""

    def __init__(self, url: str, concurrency: int, shape: str) -> None:
        self._shape = shape
        self._sql = psycopg_statements(shape)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[dict[str, Any]]] = (
            AsyncConnectionPool(
                url,
                min_size=concurrency,
                max_size=concurrency,
                kwargs={"row_factory": dict_row, "autocommit": True},
                open=False,
            )
        )

    async def open(self) -> None:
        await self._pool.open(wait=True)

    async def _run(self, tx: Transaction) -> Any:
        async with self._pool.connection() as conn, conn.transaction():
            try:
                step = next(tx)
                while True:
                    sql = self._sql[step.name]
                    if step.many:
                        if step.params:
                            async with conn.cursor() as cursor:
                                await cursor.executemany(sql, step.params)
                        step = tx.send([])
                    else:
                        cursor = await conn.execute(sql, step.params)
                        step = tx.send(await cursor.fetchall() if step.rows else [])
            except StopIteration as end:
                return end.value

    async def claim(self, ids: Sequence[str]) -> Claimed:
        claimed: Claimed = await self._run(claim_steps(self._shape, ids, _now_us()))
        return claimed

    async def finish(self, claimed: Claimed) -> int:
        done: int = await self._run(finish_steps(self._shape, claimed, _now_us()))
        return done

    async def close(self) -> None:
        await self._pool.close()


class AsyncpgDriver:
    """The statements translated to ``$n`` parameters, on an asyncpg pool (asyncpg prepares and
    caches every statement; executemany sends a batch in one round trip)."""

    def __init__(self, dsn: str, server_settings: Mapping[str, str], concurrency: int, shape: str):
        self._dsn = dsn
        self._settings = dict(server_settings)
        self._concurrency = concurrency
        self._shape = shape
        self._sql = asyncpg_statements(shape)
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg  # the optional extra "bench"

        self._pool = await asyncpg.create_pool(
            self._dsn,
            min_size=self._concurrency,
            max_size=self._concurrency,
            server_settings=self._settings,
        )

    async def _run(self, tx: Transaction) -> Any:
        async with self._pool.acquire() as conn, conn.transaction():
            try:
                step = next(tx)
                while True:
                    sql, names = self._sql[step.name]
                    if step.many:
                        if step.params:
                            assert not isinstance(step.params, Mapping)
                            args = [tuple(p[n] for n in names) for p in step.params]
                            await conn.executemany(sql, args)
                        step = tx.send([])
                    else:
                        params = step.params
                        assert isinstance(params, Mapping)
                        args = [params[n] for n in names]
                        if step.rows:
                            step = tx.send(await conn.fetch(sql, *args))
                        else:
                            await conn.execute(sql, *args)
                            step = tx.send([])
            except StopIteration as end:
                return end.value

    async def claim(self, ids: Sequence[str]) -> Claimed:
        claimed: Claimed = await self._run(claim_steps(self._shape, ids, _now_us()))
        return claimed

    async def finish(self, claimed: Claimed) -> int:
        done: int = await self._run(finish_steps(self._shape, claimed, _now_us()))
        return done

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
