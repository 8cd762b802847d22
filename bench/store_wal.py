"""WAL written per execution on PostgreSQL, and the share of HOT updates (issue 7, "schema for growth").

``--runs`` (20,000) ``now`` runs go through the store's own transactions, phase by phase, on a
fresh schema of the test server (``ONBEAT_TEST_POSTGRES_URL``): create (``job_create_many``, 1,000
jobs per call), dispatch (``execution_dispatch``), claim (``execution_claim``, ``--batch`` ids per
call) and finish (``execution_finish_many``, succeeded). Per phase: the WAL the server wrote
(``pg_current_wal_lsn()`` before and after) divided by the runs. Then, per table of the schema:
updates, HOT updates (``pg_stat_user_tables``) and size at rest. ``--history-partitions`` first
creates the day partitions (``history_maintain``), as a running fleet has them; without it the
final runs land in the DEFAULT partition.

The WAL position is the whole server's: other work on it during a round is counted too. With
``--waldump`` (the path of ``pg_waldump``; it needs to read the server's ``pg_wal``, so run it on
the server's host as a user that may) each phase's records are read back and only those of this
schema's relations, and of the transactions that wrote them (their commit records), are counted:
the figure then holds whatever else the server does. Without it, the smallest of ``--repeat``
rounds is the figure (other work only adds).
Each round also counts the runs through each phase (created, dispatched, claimed, finished) and,
read back from the schema at the end, the runs, attempts and jobs by status; all go into the
``BENCH_JSON {...}`` line, and the script exits 1 unless every run went through every phase once
and ended succeeded. It uses the Store API only, so the same script measures an older checkout:

    .venv/bin/python -m bench.store_wal --repeat 3
    git archive <commit> src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src .venv/bin/python -m bench.store_wal --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

import onbeat
from onbeat.schedule import Schedule
from onbeat.store import postgres_session
from onbeat.store.base import Completion, DispatchParams, NewJob
from onbeat.store.postgres import PostgresStore
from onbeat.testing.postgres import fresh_schema

APP_NAME = "onbeat-store-wal"
"""application_name of the store's connections: their backends' CPU is read from /proc."""

PHASES = ("create", "dispatch", "claim", "finish")
PHASE_COUNTS = ("created", "dispatched", "claimed", "finished")
"""Runs through each phase, as the store's calls returned them."""


def _lsn(url: str) -> int:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
    assert row is not None
    return int(row[0])


def _lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


_RECORD = re.compile(r"len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+),")
_RELATION = re.compile(r"rel \d+/(\d+)/(\d+)")


def attributed_wal(
    waldump: str, url: str, start: int, end: int, without_page_images: bool = False
) -> dict[str, int]:
    """Bytes of WAL between ``start`` and ``end`` that this schema's relations caused, by
    relation: records touching them, and every other record (commits, locks of nothing of ours)
    of the transactions that wrote those, under ``(transaction)``."""
    with psycopg.connect(url) as c:
        database = c.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        files = {
            str(r[0]): str(r[1])
            for r in c.execute(
                "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema()"
                " AND pg_relation_filenode(c.oid) IS NOT NULL"
            )
        }
        wal_dir = c.execute("SELECT current_setting('data_directory') || '/pg_wal'").fetchone()
    assert database is not None and wal_dir is not None
    dump = subprocess.run(
        [waldump, "-p", wal_dir[0], "-s", _lsn_text(start), "-e", _lsn_text(end)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    ours_tx: set[str] = set()
    records: list[tuple[int, str, str | None]] = []
    for line in dump.splitlines():
        found = _RECORD.search(line)
        if found is None:
            continue
        relation = next(
            (
                files[node]
                for db, node in _RELATION.findall(line)
                if db == str(database[0]) and node in files
            ),
            None,
        )
        # tot: with full-page images (the first change of a page after a checkpoint, so it
        # depends on when checkpoints fall); rec: without them, the same every round.
        size = int(found.group(1 if without_page_images else 2))
        tx = found.group(3)
        if relation is not None and tx != "0":
            ours_tx.add(tx)
        records.append((size, tx, relation))
    by_relation: dict[str, int] = {}
    for size, tx, relation in records:
        if relation is not None or tx in ours_tx:
            key = relation or "(transaction)"
            by_relation[key] = by_relation.get(key, 0) + size
    return by_relation


class StatementCounter:
    """Counts the statements the store sends (an ``executemany`` of n rows is n statements,
    as the server executes them), by wrapping the PostgreSQL connection adapter."""

    def __init__(self) -> None:
        self.count = 0
        self.phase = ""
        self.seconds: dict[tuple[str, str], float] = {}
        """(phase, statement name) -> wall seconds in the statement (driver and server)."""
        names = {sql: name for name, sql in PostgresStore._q.items()}
        adapter = postgres_session.StoreConnection
        self._originals = (adapter.execute, adapter.executemany)
        counter = self

        def timed(sql: str, t0: float) -> None:
            key = (counter.phase, names.get(sql, sql[:30]))
            counter.seconds[key] = counter.seconds.get(key, 0.0) + time.perf_counter() - t0

        def execute(conn: Any, sql: str, parameters: Any = None, /) -> Any:
            counter.count += 1
            t0 = time.perf_counter()
            cursor = counter._originals[0](conn, sql, parameters)
            timed(sql, t0)
            return cursor

        def executemany(conn: Any, sql: str, parameters: Any, /) -> None:
            batch = list(parameters)
            counter.count += len(batch)
            t0 = time.perf_counter()
            counter._originals[1](conn, sql, batch)
            timed(sql, t0)

        adapter.execute = execute  # type: ignore[method-assign]
        adapter.executemany = executemany  # type: ignore[method-assign]

    def close(self) -> None:
        adapter = postgres_session.StoreConnection
        adapter.execute, adapter.executemany = self._originals  # type: ignore[method-assign]


def _backend_cpu(url: str) -> float:
    """CPU seconds used so far by the store's backends (``APP_NAME``), from /proc."""
    with psycopg.connect(url) as c:
        pids = [
            r[0]
            for r in c.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
            )
        ]
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _in_batches(ids: Sequence[str], size: int, work: Callable[[Sequence[str]], object]) -> None:
    for start in range(0, len(ids), size):
        work(ids[start : start + size])


def one_round(runs: int, batch: int, partitions: bool, waldump: str | None) -> dict[str, Any]:
    """One pass of ``runs`` executions through the four phases on a fresh schema."""
    with fresh_schema() as url:
        store = PostgresStore(f"{url}&application_name={APP_NAME}")
        wal: dict[str, int] = {}
        spans: dict[str, tuple[int, int]] = {}
        work: dict[str, dict[str, float]] = {}
        counter = StatementCounter()
        marks: list[tuple[int, float, float]] = []
        counts = dict.fromkeys(PHASE_COUNTS, 0)

        def mark() -> None:
            counter.phase = PHASES[len(marks) // 2] if len(marks) < 8 else ""
            marks.append((counter.count, time.process_time(), _backend_cpu(url)))

        def measured(phase: str) -> None:
            (n0, c0, b0), (n1, c1, b1) = marks[-2], marks[-1]
            work[phase] = {
                "statements": (n1 - n0) / runs,
                "client_us": (c1 - c0) / runs * 1e6,
                "server_us": (b1 - b0) / runs * 1e6,
            }

        try:
            if partitions and hasattr(store, "history_maintain"):
                store.history_maintain(0, 1)
            news = [NewJob(task="bench.noop", params={}, schedule=Schedule.parse())] * runs
            created: list[str] = []
            before = _lsn(url)
            mark()
            for start in range(0, runs, 1000):
                created += [c.job.id for c in store.job_create_many(news[start : start + 1000])]
            mark()
            counts["created"] = len(created)
            measured("create")
            spans["create"] = (before, _lsn(url))
            wal["create"] = spans["create"][1] - before

            leases = store.shard_acquire("bench-scheduler", 600)
            queued: list[str] = []
            before = _lsn(url)
            mark()
            while items := store.execution_dispatch(DispatchParams(leases, 10.0, 60.0, 5000)):
                queued += [item.execution_id for item in items]
            mark()
            measured("dispatch")
            spans["dispatch"] = (before, _lsn(url))
            wal["dispatch"] = spans["dispatch"][1] - before
            counts["dispatched"] = len(queued)
            assert len(queued) == runs, (len(queued), runs)

            tokens: dict[str, int] = {}

            def claim(ids: Sequence[str]) -> None:
                result = store.execution_claim(list(ids), "bench-worker", 600, 600)
                counts["claimed"] += len(result.started)
                tokens.update((r.execution.id, r.execution.fencing_token) for r in result.started)

            before = _lsn(url)
            mark()
            _in_batches(queued, batch, claim)
            mark()
            measured("claim")
            spans["claim"] = (before, _lsn(url))
            wal["claim"] = spans["claim"][1] - before
            assert len(tokens) == runs

            def finish(ids: Sequence[str]) -> None:
                done = store.execution_finish_many([Completion(i, tokens[i], True) for i in ids])
                counts["finished"] += len(done)

            before = _lsn(url)
            mark()
            _in_batches(queued, batch, finish)
            mark()
            measured("finish")
            spans["finish"] = (before, _lsn(url))
            wal["finish"] = spans["finish"][1] - before
        finally:
            counter.close()
            store.close()
        relations: dict[str, dict[str, int]] = {}
        records_only: dict[str, int] = {}
        if waldump is not None:
            relations = {p: attributed_wal(waldump, url, *span) for p, span in spans.items()}
            wal = {p: sum(by_relation.values()) for p, by_relation in relations.items()}
            records_only = {
                p: sum(attributed_wal(waldump, url, *span, without_page_images=True).values())
                for p, span in spans.items()
            }
        time.sleep(1.5)  # the closed connections' table statistics reach the server
        with psycopg.connect(url) as c:
            tables = {
                r[0]: {"updates": r[1], "hot_updates": r[2], "bytes": r[3]}
                for r in c.execute(
                    "SELECT relname, n_tup_upd, n_tup_hot_upd,"
                    " pg_total_relation_size(relid) FROM pg_stat_user_tables"
                    " WHERE schemaname = current_schema() ORDER BY relname"
                )
            }
            final: dict[str, dict[str, int]] = {
                name: {r[0]: r[1] for r in c.execute(query)}
                for name, query in (
                    ("executions", "SELECT status, count(*) FROM executions GROUP BY status"),
                    ("attempts", "SELECT outcome, count(*) FROM attempts GROUP BY outcome"),
                    ("jobs", "SELECT status, count(*) FROM jobs GROUP BY status"),
                )
            }
    statement_us = {
        f"{phase} {name}": round(seconds / runs * 1e6, 1)
        for (phase, name), seconds in sorted(counter.seconds.items(), key=lambda kv: -kv[1])
        if phase
    }
    return {
        "statement_us": statement_us,
        "work": work,
        "wal": wal,
        "wal_without_page_images": records_only,
        "tables": tables,
        "wal_by_relation": relations,
        "counts": counts,
        "final": final,
    }


def counts_add_up(round_: dict[str, Any], runs: int) -> bool:
    """Every run created, dispatched, claimed and finished once, and in the store at the end one
    succeeded run, one succeeded attempt and one completed job each."""
    ended = {"executions": "succeeded", "attempts": "succeeded", "jobs": "completed"}
    return set(round_["counts"].values()) == {runs} and round_["final"] == {
        name: {status: runs} for name, status in ended.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--history-partitions", action="store_true")
    parser.add_argument("--waldump", help="path of pg_waldump: count this schema's WAL only")
    args = parser.parse_args()
    rounds = [
        one_round(args.runs, args.batch, args.history_partitions, args.waldump)
        for _ in range(args.repeat)
    ]
    print(f"onbeat from {onbeat.__file__}; {args.runs} runs, batches of {args.batch}")
    per_run = {p: min(r["wal"][p] for r in rounds) / args.runs for p in PHASES}
    rows = [f"  {p:<9} {per_run[p]:8.0f} B/run" for p in PHASES]
    rows.append(f"  {'total':<9} {sum(per_run.values()):8.0f} B/run (smallest of {len(rounds)})")
    totals = [sum(r["wal"].values()) / args.runs for r in rounds]
    rows.append(
        f"  rounds    {', '.join(f'{t:.0f}' for t in totals)} B/run; median {statistics.median(totals):.0f}"
    )
    if rounds[0]["wal_without_page_images"]:
        bare = {p: min(r["wal_without_page_images"][p] for r in rounds) / args.runs for p in PHASES}
        rows.append(
            "  without full-page images: "
            + ", ".join(f"{p} {bare[p]:.0f}" for p in PHASES)
            + f"; total {sum(bare.values()):.0f} B/run"
        )
    print("WAL per execution\n" + "\n".join(rows))
    print("statements / client CPU us / server CPU us per run (median of rounds)")
    for p in PHASES:
        cells = [
            statistics.median(r["work"][p][k] for r in rounds)
            for k in ("statements", "client_us", "server_us")
        ]
        print(f"  {p:<9} {cells[0]:6.2f} {cells[1]:8.0f} {cells[2]:8.0f}")
    print("wall us per run in each statement, by phase (last round; driver and server)")
    for key, us in list(rounds[-1]["statement_us"].items())[:25]:
        print(f"  {key:<60} {us:8.1f}")
    print("tables (last round): updates, HOT updates, bytes at rest per run")
    for name, t in rounds[-1]["tables"].items():
        if t["updates"] or t["bytes"] > 100_000:
            hot = f"{100 * t['hot_updates'] / t['updates']:.0f} %" if t["updates"] else "-"
            print(
                f"  {name:<28} {t['updates']:>8} {t['hot_updates']:>8} ({hot:>5})"
                f" {t['bytes'] / args.runs:8.0f}"
            )
    if rounds[-1]["wal_by_relation"]:
        print("WAL per run by relation and phase (last round)")
        by_phase = rounds[-1]["wal_by_relation"]
        names = sorted({n for phase in by_phase.values() for n in phase})
        print(f"  {'relation':<44}" + "".join(f"{p:>10}" for p in PHASES))
        for name in names:
            row = "".join(f"{by_phase[p].get(name, 0) / args.runs:10.0f}" for p in PHASES)
            print(f"  {name:<44}{row}")
    print("BENCH_JSON " + json.dumps({"per_run": per_run, "rounds": rounds}))
    if not all(counts_add_up(r, args.runs) for r in rounds):
        sys.exit(1)  # a run lost or not finished: the figures are not of every run


if __name__ == "__main__":
    main()
