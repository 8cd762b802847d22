"""No statement of the scheduler's or the worker's hot path reads more of the store as the store
grows: each pass costs the same with 2,000 cron jobs as with 8,000.

Two plans that read the whole store stalled a fleet of 100,000 cron jobs (the reconciler's page,
25 s; the claim's look-up of a backlog's earliest run, 190 ms a claim), and both looked harmless
at the sizes the contract suite uses. Here every statement the passes send runs once more under
``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction rolled back, and the buffers each statement
touched at both sizes are compared: a statement that reads 4 times the store reads about 4 times
the buffers (the two sizes keep the indexes at one depth). Buffers, not seconds: the same on a busy box. Tables never analyzed (autovacuum off),
as a fleet finds them right after ``onbeat migrate`` and a bulk load, and analyzed.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from onbeat.queue.base import QueueItem
from onbeat.schedule import Schedule
from onbeat.store import open_store, postgres_session
from onbeat.store.base import Completion, DispatchParams, JobCursor, NewJob, Store
from onbeat.testing import FakeClock
from onbeat.testing.postgres import fresh_schema, store_schema

SMALL, LARGE = 2_000, 8_000
SHARDS = 64
BATCH = 256
"""Runs a claim takes (a worker's ``claim_batch``)."""
GROWTH = 2.0
"""At 4 times the jobs, a statement may touch at most this many times the buffers (+ SLACK): a
page's rows spread over more of a bigger table; a read of the whole store is ~4 times."""
SLACK = 40
OUT_OF_SCOPE = {"shard_held", "shard_renew", "scheduler_live"}
"""Bounded by the shard count and the schedulers, not by the work stored."""

ID_LISTS = ("ids", "job_ids", "held", "heads")
"""Parameters that carry a list of keys, or an object keyed by them (a batch's runs or jobs):
read through the keys' index, never through a scan of the table (queries.sql, "Lists of ids")."""
WHOLE_STORE = {"runs", "jobs"}


@dataclass
class Explained:
    buffers: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Statement name -> the most shared buffers (hit + read) one call of it touched."""
    seq_scans: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Statement name -> the tables its plans read by a sequential scan."""


def _nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


_WRITE = re.compile(r"(?<!FOR )(?<!KEY )\b(UPDATE|INSERT|DELETE)\b")


def _writes(sql: str) -> bool:
    """Whether a statement writes rows (``FOR UPDATE`` only locks them)."""
    return _WRITE.search(sql) is not None


@contextmanager
def _explained(names: Mapping[str, str], writes: bool) -> Iterator[Explained]:
    """While inside, every statement of the store that writes rows (``writes``) or that does
    not also runs under EXPLAIN (ANALYZE, BUFFERS) first, in a savepoint (or a transaction)
    rolled back, and its buffers and sequential scans are noted by name.

    Never both in one pass: a write explained and rolled back leaves a dead version of each row
    it wrote, which production never has, and the reads after it would be measured through
    them (the reconciler's page read 3 times the buffers at 4 times the store once the
    dispatch's next fire times were one statement, explained, not one per job, which was not)."""
    seen = Explained()
    original = postgres_session.StoreConnection.execute

    def execute(self: Any, sql: str, parameters: Mapping[str, Any] | None = None, /) -> Any:
        name = names.get(sql)
        if name is not None and _writes(sql) == writes:
            conn: psycopg.Connection[Any] = self._conn
            with conn.transaction(force_rollback=True):
                plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", parameters)
                [[explained]] = plan.fetchall()
            top = explained[0]["Plan"]
            used = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
            seen.buffers[name] = max(seen.buffers[name], used)
            seen.seq_scans[name] |= {
                node["Relation Name"] for node in _nodes(top) if node["Node Type"] == "Seq Scan"
            }
        return original(self, sql, parameters)

    postgres_session.StoreConnection.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        postgres_session.StoreConnection.execute = original  # type: ignore[method-assign]


def _fill(store: Store, jobs: int) -> None:
    every_minute = Schedule.parse(cron="* * * * *")
    for first in range(0, jobs, 1000):
        store.job_create_many(
            [NewJob("record", {"n": n}, every_minute) for n in range(first, first + 1000)]
        )


def _passes(store: Store, clock: FakeClock) -> None:
    """A scheduler's and a worker's passes over a store whose cron jobs fell behind: dispatch,
    reconcile, sweep, claim (a backlog: the claim's look-up of each job's earliest run),
    heartbeat, finish, reap."""
    clock.advance(3 * 60)  # every job's first fire is minutes late
    leases = store.shard_acquire("scheduler", 30.0)
    queued: list[QueueItem] = []
    while page := store.execution_dispatch(DispatchParams(leases, 10.0, 3600.0, 1000)):
        queued += page
    cursor: JobCursor | None = None
    while True:
        _, cursor = store.job_repair_next_runs(leases, cursor, 1000)
        if cursor is None:
            break
    store.execution_sweep(leases, sorted(leases.epochs), 0.0, 1000)
    claimed = store.execution_claim([q.execution_id for q in queued[:BATCH]], "w", 30.0, 3600.0)
    started = claimed.started
    assert len(started) == BATCH, "the claim started nothing to measure"
    held = {run.execution.id: run.execution.fencing_token for run in started}
    store.execution_heartbeat("w", held, 30.0)
    half = len(started) // 2
    store.execution_finish_many(
        [Completion(run.execution.id, run.execution.fencing_token, True) for run in started[:half]]
    )
    clock.advance(60)
    store.execution_reap(1000)


def _buffers(
    jobs: int,
    analyzed: bool,
    work: Callable[[Store, FakeClock], None] = _passes,
    names: Mapping[str, str] | None = None,
) -> Explained:
    """The buffers and scans of ``work``'s statements (by default every statement of the store,
    by name) on a store of ``jobs`` cron jobs: its reads in one pass, its writes in another."""
    seen = Explained()
    for writes in (False, True):
        clock = FakeClock()
        with _store_never_vacuumed(clock) as (store, admin):
            _fill(store, jobs)
            if analyzed:
                admin.execute("ANALYZE")
            if names is None:
                names = {sql: name for name, sql in store._q.items()}  # type: ignore[attr-defined]
            with _explained(names, writes) as one_pass:
                work(store, clock)
        seen.buffers.update(one_pass.buffers)
        seen.seq_scans.update(one_pass.seq_scans)
    return seen


@contextmanager
def _store_never_vacuumed(clock: FakeClock) -> Iterator[tuple[Store, psycopg.Connection[Any]]]:
    """A store on an empty schema whose hot tables autovacuum leaves alone (never analyzed
    unless a test says so), and an admin connection to it."""
    with store_schema() as url:
        store = open_store(url, clock, shard_count=SHARDS)
        try:
            with psycopg.connect(url, autocommit=True) as admin:
                for table in ("jobs", "runs"):
                    admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                yield store, admin
        finally:
            store.close()


@pytest.mark.parametrize("analyzed", [False, True], ids=["never analyzed", "analyzed"])
def test_hot_path__no_statement_reads_more_as_the_store_grows(analyzed: bool) -> None:
    """Also: no statement given a list of ids reads runs or jobs whole. At these sizes that
    costs about as many buffers as the look-ups it replaces (so the buffers alone pass it), but
    a claim's three look-ups of 16 runs took 1-3 ms each against 0.3-0.4 ms by the index."""
    small_seen, large_seen = _buffers(SMALL, analyzed), _buffers(LARGE, analyzed)
    queries = postgres_session.postgres_queries()
    listed = {name for name, sql in queries.items() if any(f"%({p})s" in sql for p in ID_LISTS)}
    for seen in (small_seen, large_seen):
        scans = {n: sorted(t & WHOLE_STORE) for n, t in seen.seq_scans.items() if n in listed}
        assert {n: t for n, t in scans.items() if t} == {}, "a list of ids read by a scan"
    small, large = small_seen.buffers, large_seen.buffers
    measured = sorted(set(small) & set(large) - OUT_OF_SCOPE)
    for needed in ("jobs_cron_page", "execution_earliest_due_of_jobs",
                   "execution_dispatch_candidates", "execution_start_many"):  # fmt: skip
        assert needed in measured, f"{needed} was not run: the passes miss what they test"
    grown = {
        name: (small[name], large[name])
        for name in measured
        if large[name] > GROWTH * small[name] + SLACK
    }
    assert grown == {}, f"buffers at {SMALL:,} -> {LARGE:,} cron jobs: {json.dumps(grown)}"


def test_explained__measures_a_statement_that_reads_the_whole_store() -> None:
    """The harness itself: a statement that reads every run is caught."""
    whole = "SELECT count(*) FROM runs WHERE due_at > -1"

    def read_whole(store: Store, _: FakeClock) -> None:
        with store._read() as c:  # type: ignore[attr-defined]
            c.execute(whole)

    small, large = (
        _buffers(jobs, False, read_whole, {whole: "whole"}).buffers for jobs in (SMALL, LARGE)
    )
    assert large["whole"] > GROWTH * small["whole"] + SLACK, (small, large)


HERD = 2_000


@contextmanager
def _stats_flushed_after(name: str) -> Iterator[None]:
    """While inside, a session that sends statement ``name`` reports its table statistics as
    soon as its transaction ends (PostgreSQL 15 otherwise holds them up to a second)."""
    sql = postgres_session.postgres_queries()[name]
    original = postgres_session.StoreConnection.execute

    def execute(self: Any, text: str, parameters: Mapping[str, Any] | None = None, /) -> Any:
        cursor = original(self, text, parameters)  # its rows are on the client already
        if text == sql:
            self._conn.execute("SELECT pg_stat_force_next_flush()")
        return cursor

    postgres_session.StoreConnection.execute = execute  # type: ignore[method-assign]
    try:
        yield
    finally:
        postgres_session.StoreConnection.execute = original  # type: ignore[method-assign]


def _rows_scanned(admin: psycopg.Connection[Any], table: str) -> int:
    row = admin.execute(
        "SELECT seq_tup_read FROM pg_stat_user_tables"
        " WHERE relname = %s AND schemaname = current_schema()",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_dispatch__a_herd_after_polls_of_an_empty_store_reads_each_job_once_at_most() -> None:
    """A scheduler polls for due runs from its start, on a store still empty; psycopg prepares a
    statement on its sixth call, and from its own sixth call of it the server keeps a generic
    plan, made then. The herd that follows (S8-full: 6,000 runs due at one instant, 6 s to dispatch) must meet a plan made for
    the tables it finds: the one kept from the empty store scanned every job once per run."""
    clock = FakeClock()
    with _store_never_vacuumed(clock) as (store, admin):
        params = DispatchParams(store.shard_acquire("scheduler", 30.0), 10.0, 60.0, 5000)
        for _ in range(20):  # prepared on the 6th; generic from the server's 6th on
            assert store.execution_dispatch(params) == []
        due = Schedule.parse(at=clock.now() + timedelta(seconds=5))
        for _ in range(HERD // 1000):
            store.job_create_many([NewJob("record", {}, due) for _ in range(1000)])
        before = _rows_scanned(admin, "jobs")
        with _stats_flushed_after("execution_dispatch_candidates"):
            assert len(store.execution_dispatch(params)) == HERD
        scanned = _rows_scanned(admin, "jobs") - before
    assert scanned <= HERD, f"the dispatch of {HERD:,} runs scanned {scanned:,} job rows"


def _history_of(store: Store, admin: psycopg.Connection[Any], runs: int, now_us: int) -> None:
    """``runs`` final runs in the history of the clock's day (written as the finish writes them:
    its partition, one row each), and the day partitions a fleet keeps."""
    store.history_maintain(30, 7)
    admin.execute(
        "INSERT INTO execution_history (id, job_id, shard, trigger, scheduled_for, due_at,"
        " status, priority, created_at, finished_at)"
        " SELECT 'done-' || g, 'gone-' || g, 0, 'schedule', %(now)s - g, %(now)s - g,"
        " 'succeeded', 0, %(now)s, %(now)s FROM generate_series(1, %(runs)s) AS g",
        {"now": now_us, "runs": runs},
    )


@pytest.mark.parametrize("analyzed", [False, True], ids=["never analyzed", "analyzed"])
def test_run_insert__reads_no_more_as_the_days_history_grows(analyzed: bool) -> None:
    """A new run is checked against the history (a fire time there gets no second run) by one
    probe of its day's partition. As an anti-join planned for the 100 rows PostgreSQL assumes
    of a JSON recordset, the check hashed the whole day's history for each insert (one
    ``POST /jobs``: 10 ms with 9,000 runs ended that day): the cost of a create grew with the
    day's work until about 80,000 runs, or whatever the statistics last said."""
    buffers = []
    for runs in (SMALL, LARGE):
        clock = FakeClock()
        with _store_never_vacuumed(clock) as (store, admin):
            _history_of(store, admin, runs, int(clock.now().timestamp() * 1_000_000))
            if analyzed:
                admin.execute("ANALYZE")
            names = {store._q["executions_insert_many"]: "insert"}  # type: ignore[attr-defined]
            with _explained(names, writes=True) as seen:
                store.job_create_many([NewJob("record", {}, Schedule.parse())])
            buffers.append(seen.buffers["insert"])
    small, large = buffers
    assert large <= GROWTH * small + SLACK, f"buffers at {SMALL:,} -> {LARGE:,} runs: {buffers}"


def _plan_scans(admin: psycopg.Connection[Any], statement: str) -> set[str]:
    """The tables the generic plan of prepared ``statement`` reads by a sequential scan."""
    row = admin.execute(f"EXPLAIN (FORMAT JSON) EXECUTE {statement}").fetchone()
    assert row is not None
    return {n["Relation Name"] for n in _nodes(row[0][0]["Plan"]) if n["Node Type"] == "Seq Scan"}


def test_statistics_refresh__plans_made_on_an_empty_store_are_made_again() -> None:
    """A worker started on a new store prepares its claim's statements while ``jobs`` and
    ``runs`` are empty, and PostgreSQL keeps their generic plans until the tables are next
    analyzed: under W5 the claim's lock of the jobs read all 9,000 jobs a call (4-8 ms) until
    autovacuum came by. The scheduler's pass analyzes the tables that outgrew their statistics,
    which makes every session plan them again; a table a vacuum holds waits for a later pass (a
    longer wait would cancel the vacuum); a pass after them finds nothing to do."""
    with (
        fresh_schema() as url,
        psycopg.connect(url, autocommit=True) as admin,
        closing(open_store(url, FakeClock(), shard_count=SHARDS)) as store,  # tables never written
    ):
        for table in ("jobs", "runs"):
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        lock_jobs = store._q["jobs_lock_of_runs"].replace("%(ids)s", "$1")  # type: ignore[attr-defined]
        store.job_create_many([NewJob("record", {}, Schedule.parse()) for _ in range(20)])
        admin.execute("SET plan_cache_mode = force_generic_plan")
        admin.execute(f"PREPARE lock_jobs (text) AS {lock_jobs}")
        assert "jobs" in _plan_scans(admin, "lock_jobs('[\"x\"]')")  # planned for a page of jobs
        store.job_create_many([NewJob("record", {}, Schedule.parse()) for _ in range(3000)])
        assert "jobs" in _plan_scans(admin, "lock_jobs('[\"x\"]')")  # and kept for 3,020
        with psycopg.connect(admin.info.dsn, autocommit=True) as other, other.transaction():
            other.execute(store._q["statistics_lock"])  # type: ignore[attr-defined]  # held here
            assert store.statistics_refresh() == []
        with psycopg.connect(admin.info.dsn, autocommit=True) as other, other.transaction():
            other.execute("LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE")  # as a vacuum does
            analyzed = store.statistics_refresh()  # waits 0.5 s for jobs, then leaves it
        assert "runs" in analyzed and "jobs" not in analyzed
        assert "jobs" in store.statistics_refresh()
        assert _plan_scans(admin, "lock_jobs('[\"x\"]')") == set()
        assert store.statistics_refresh() == []


def test_statistics_refresh__two_schedulers_at_once() -> None:
    """Two schedulers' passes at the same instant, each on its own connections: neither fails,
    the tables behind are analyzed (by either), and a pass after them finds nothing to do."""
    with (
        fresh_schema() as url,
        closing(open_store(url, FakeClock(), shard_count=SHARDS)) as first,
        closing(open_store(url, FakeClock(), shard_count=SHARDS)) as second,
    ):
        first.job_create_many([NewJob("record", {}, Schedule.parse()) for _ in range(3000)])
        start = threading.Barrier(2)

        def one_pass(store: Store) -> list[str]:
            start.wait()
            return store.statistics_refresh()

        with ThreadPoolExecutor(2) as pool:
            passes = list(pool.map(one_pass, (first, second)))
        assert {"jobs", "runs"} <= set(passes[0]) | set(passes[1])
        assert first.statistics_refresh() == second.statistics_refresh() == []


def test_statistics_refresh__leaves_the_tables_its_role_may_not_analyze() -> None:
    """A fleet may run as a role that does not own the tables (`onbeat migrate` ran as their
    owner), opening the store with ``--no-migrate``: it once ran the migrations' bookkeeping all
    the same and could not open the store. ANALYZE skips a table the role does not own with a
    warning, so it would stay behind and be tried, and logged, at every pass: it is left to
    autovacuum."""
    role = f"onbeat_fleet_{uuid.uuid4().hex[:8]}"
    with (
        fresh_schema() as url,
        psycopg.connect(url, autocommit=True) as admin,
        closing(open_store(url, FakeClock(), shard_count=SHARDS)) as owner,
    ):
        owner.job_create_many([NewJob("record", {}, Schedule.parse()) for _ in range(3000)])
        schema = admin.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
            admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
            parts = urlsplit(url)
            as_role = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}").geturl()
            with closing(open_store(as_role, FakeClock(), migrate=False)) as fleet:
                assert fleet.statistics_refresh() == []
            assert {"jobs", "runs"} <= set(owner.statistics_refresh())
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
