"""The same workloads against Python peers, each in its own venv, on the same PostgreSQL and
a private Redis: one command reproduces the comparison table in bench/README.md ("Peers")::

    .venv/bin/python bench/peers/run.py --peer pgqueuer --workload W1 [--size small]
    .venv/bin/python bench/peers/run.py --peer all --workload all

- **W1 throughput**: ``--size``'s runs (20,000) due now, submitted in bulk through the peer's
  client, then the peer's workers are started; drain rate = first start -> last start, and
  launch -> last start.
- **W2 burst**: workers warm (a probe run has started); 10,000 one-off runs due at one whole
  second 30 s ahead; start delay p50/p95/p99/max, early, lost, duplicated.
- **W3 cron fan-out**: 10,000 every-minute cron jobs registered the peer's way; over two minute
  boundaries (the first at least 20 s after the peer took its first run), per boundary: start
  delay p50/p99/max, early, lost, duplicated. "n/a" for a peer without cron scheduling.

``--peer all`` runs onbeat first, in both its modes (``onbeat``: 1 scheduler + 2 workers on
PostgreSQL; ``onbeat-embedded``: one ``onbeat up`` node on SQLite), then every peer.

The task appends ``run_id planned started`` to a file of its process's own (``ledger.py``);
lost and duplicated runs come from those lines. CPU seconds of every process during the
workload: the peer's processes (with what they fork), their PostgreSQL backends, redis-server,
the submitting process (not counted as the peer's). Prints a table per run and a summary, one
``BENCH_JSON {...}`` line per run, and saves the results to ``--out`` (bench/results/peers).
Exit status 1 if a run was lost, duplicated, early or not started in time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: import bench.* and tests.* from the repo
    sys.path.insert(0, str(REPO))

from bench.fleet import environment  # noqa: E402
from bench.fleet_measure import Starts, drain_figures, start_figures  # noqa: E402
from bench.peers.processes import (  # noqa: E402
    NOT_PEER,
    PEER_NAMES,
    PeerRun,
    ensure_venv,
    load_spec,
)

WORKLOADS = ("W1", "W2", "W3")


@dataclass(frozen=True)
class Size:
    w1_runs: int
    w2_runs: int
    w2_lead_s: float
    w3_jobs: int
    w3_boundaries: int
    w3_lead_s: float = 20.0
    """W3: the first boundary measured is at least this long after the peer took its probe run
    (``tiny``, a smoke test, waits less for its one boundary)."""


SIZES = {
    "full": Size(20_000, 10_000, 30.0, 10_000, 2),
    "small": Size(2_000, 1_000, 10.0, 1_000, 2),
    "tiny": Size(200, 200, 4.0, 200, 1, w3_lead_s=5.0),
}


# --- workloads ------------------------------------------------------------------------------------
def w1(run: PeerRun, size: Size, timeout: float) -> dict[str, Any]:
    n = size.w1_runs
    submit_s = run.submit("w1", n, None)
    launched = time.time()
    run.monitor.mark()
    run.start_workers()
    starts = Starts(run.ledger)
    done = wait_for(run, starts, n, launched + timeout)
    figures = starts.figures(n)
    last = figures["last_start"]
    return {
        **drain_figures(figures, n, submit_s, launched),
        "launch_to_last_start_per_s": round(n / (last - launched)) if last else None,
        "launch_to_last_start_s": round(last - launched, 2) if last else None,
        "timed_out": not done,
        **figures,
    }


def w2(run: PeerRun, size: Size, timeout: float) -> dict[str, Any]:
    n = size.w2_runs
    run.start_workers()
    ready_s = run.wait_ready()
    run.adopt_children()
    run.monitor.mark()
    began = time.time()
    due = math.ceil(began + size.w2_lead_s)
    submit_s = run.submit("w2", n, due)
    starts = Starts(run.ledger)
    done = wait_for(run, starts, n, due + timeout)
    figures = starts.figures(n)
    last = figures["last_start"]
    return {
        "runs": n,
        "ready_after_s": round(ready_s, 2),
        "submit_per_s": round(n / submit_s),
        "submitted_before_due_s": round(due - began - submit_s, 2),
        "all_started_after_due_s": round(last - due, 3) if last else None,
        "timed_out": not done,
        **figures,
    }


def w3(run: PeerRun, size: Size, timeout: float) -> dict[str, Any]:
    n = size.w3_jobs
    run.start_workers(with_scheduler=True)
    ready_s = run.wait_ready(timeout=300)
    first = math.ceil((time.time() + size.w3_lead_s) / 60) * 60
    boundaries = [first + 60 * i for i in range(size.w3_boundaries)]
    pause_until(first - 5)
    run.adopt_children()
    run.monitor.mark()
    starts = Starts(run.ledger)
    deadline = boundaries[-1] + min(timeout, 55)
    while True:
        starts.read()
        counted = {b: sum(1 for _, planned, _ in starts.runs if planned == b) for b in boundaries}
        if all(c >= n for c in counted.values()) or time.time() > deadline:
            break
        run.check_alive()
        time.sleep(0.5)
    per_boundary = []
    for b in boundaries:
        figures = start_figures([r for r in starts.runs if r[1] == b], n)
        per_boundary.append({
            "at": datetime.fromtimestamp(b, UTC).strftime("%H:%M:%S"),
            **{k: v for k, v in figures.items() if k not in ("first_start", "last_start")},
            "all_started_after_s": round(figures["last_start"] - b, 3)
            if figures["last_start"] else None,
        })  # fmt: skip
    total = start_figures([r for r in starts.runs if r[1] in boundaries], n * len(boundaries))
    return {
        "runs": n * len(boundaries),
        "cron_jobs": n,
        "ready_after_s": round(ready_s, 2),
        "boundaries": per_boundary,
        "timed_out": any(b["started"] < n for b in per_boundary),
        **{k: total[k] for k in ("started", "lost", "duplicated", "early")},
        "delay_p50_s": max(b["delay_p50_s"] for b in per_boundary),
        "delay_p99_s": max(b["delay_p99_s"] for b in per_boundary),
        "delay_max_s": max((b["delay_max_s"] or 0) for b in per_boundary),
    }


def wait_for(run: PeerRun, starts: Starts, count: int, deadline: float) -> bool:
    while starts.read() < count:
        run.check_alive()
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    return True


def pause_until(at: float) -> None:
    """W3 waits for a wall-clock minute boundary: nothing else to wait on."""
    while (left := at - time.time()) > 0:
        time.sleep(min(left, 1.0))


WORKLOAD_FUNCTIONS = {"W1": w1, "W2": w2, "W3": w3}


def sized(name: str, count: int | None) -> Size:
    """Size ``name``, or with ``count`` runs (W1, W2) and cron jobs (W3) instead of its own; W2's
    lead then grows with the count so the submission ends before the due time (the cost curves
    of docs/performance.md)."""
    size = SIZES[name]
    if count is None:
        return size
    lead = max(size.w2_lead_s, count / 2_000)
    return dataclasses.replace(size, w1_runs=count, w2_runs=count, w2_lead_s=lead, w3_jobs=count)


def size_label(args: argparse.Namespace) -> str:
    return args.size if args.count is None else f"{args.size}-{args.count}"


def run_workload(peer: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(peer)
    size = sized(args.size, args.count)
    result: dict[str, Any] = {"peer": peer, "workload": workload, "size": size_label(args)}
    if workload == "W3" and spec.cron != "workers" and spec.cron != "scheduler":
        return {**result, "skipped": spec.cron.removeprefix("n/a: ")}
    venv = ensure_venv(peer)
    cron_jobs = size.w3_jobs if workload == "W3" else 0
    load_before = os.getloadavg()
    with PeerRun(spec, venv, cron_jobs, keep=args.keep) as run:
        try:
            figures = WORKLOAD_FUNCTIONS[workload](run, size, args.timeout)
            figures["cpu"] = run.cpu_report()
        except Exception:
            for name in run.procs:
                print(f"--- {name}\n{run.log_tail(name)}", file=sys.stderr)
            raise
        figures["exit_statuses"] = run.stop_all()
        if figures["timed_out"] or figures["lost"]:
            figures["logs"] = {name: run.log_tail(name, 10) for name in run.procs}
    peer_cpu = sum(v["cpu_s"] for k, v in figures["cpu"].items() if k not in NOT_PEER)
    figures["peer_cpu_s"] = round(peer_cpu, 2)
    figures["cpu_us_per_run"] = round(peer_cpu / figures["runs"] * 1e6)
    return {
        **result,
        "config": spec.config,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "figures": figures,
    }


# --- output ---------------------------------------------------------------------------------------
def cpu_split(cpu: dict[str, Any]) -> str:
    """``peer 12.3 + pg 4.5 + redis 1.2 (submit 0.8)``: the peer's processes, its PostgreSQL
    backends, redis-server; the submission apart."""
    peer = sum(v["cpu_s"] for k, v in cpu.items() if k not in NOT_PEER and ":" not in k
               and k != "redis")  # fmt: skip
    pg = sum(v["cpu_s"] for k, v in cpu.items() if k.startswith("postgres:") and k not in NOT_PEER)
    redis = cpu.get("redis", {}).get("cpu_s", 0.0)
    submit = sum(cpu.get(k, {}).get("cpu_s", 0.0) for k in ("submit", "postgres:submit"))
    return f"peer {peer:.1f} + pg {pg:.1f} + redis {redis:.1f} s (submit {submit:.1f})"


def headline(result: dict[str, Any]) -> str:
    f = result["figures"]
    if result["workload"] == "W1":
        return f"drain {f['drain_per_s']}/s, launch->last start {f['launch_to_last_start_s']} s"
    if result["workload"] == "W2":
        return ("delay p50/p95/p99/max {delay_p50_s}/{delay_p95_s}/{delay_p99_s}/{delay_max_s} s"
                .format(**f))  # fmt: skip
    return "; ".join(
        f"{b['at']} p50/p99/max {b['delay_p50_s']}/{b['delay_p99_s']}/{b['delay_max_s']} s"
        for b in f["boundaries"]
    )


def print_result(result: dict[str, Any]) -> None:
    title = f"== {result['peer']} {result['workload']} ({result['size']}) =="
    if "skipped" in result:
        print(f"\n{title}\n  n/a: {result['skipped']}")
        return
    f = result["figures"]
    print(f"\n{title}\n  {headline(result)}")
    print("  runs / started / lost / duplicated / early: "
          f"{f['runs']} / {f['started']} / {f['lost']} / {f['duplicated']} / {f['early']}"
          + ("  TIMED OUT" if f["timed_out"] else ""))  # fmt: skip
    print(f"  CPU {cpu_split(f['cpu'])}; {f['cpu_us_per_run']} us per run")
    print("  CPU s by process (peak RSS MiB): " + ", ".join(
        f"{group} {v['cpu_s']}" + (f" ({v['peak_rss_mib']})" if "peak_rss_mib" in v else "")
        for group, v in sorted(f["cpu"].items())
    ))  # fmt: skip
    print(f"  load average before {result['loadavg_before']}, after {result['loadavg_after']}")
    for name, tail in f.get("logs", {}).items():
        print(f"  --- {name}\n{tail}")


def print_summary(results: Sequence[dict[str, Any]]) -> None:
    print("\n| peer | workload | figures | lost / dup / early | CPU s | µs/run | load 1m |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "skipped" in r:
            print(f"| {r['peer']} | {r['workload']} | n/a: {r['skipped']} | | | | |")
            continue
        f = r["figures"]
        flags = " (timed out)" if f["timed_out"] else ""
        print(f"| {r['peer']} | {r['workload']} | {headline(r)}{flags} "
              f"| {f['lost']} / {f['duplicated']} / {f['early']} | {cpu_split(f['cpu'])} "
              f"| {f['cpu_us_per_run']} | {r['loadavg_before'][0]}-{r['loadavg_after'][0]} |")  # fmt: skip


def failed(result: dict[str, Any]) -> bool:
    f = result.get("figures")
    return f is not None and bool(f["lost"] or f["duplicated"] or f["early"] or f["timed_out"])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--peer", choices=[*PEER_NAMES, "all"], required=True)
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--count", type=int, default=None,
                   help="runs (W1, W2) or cron jobs (W3) instead of the size's")  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0,
                   help="W1: seconds after launch, W2: after the due time, to give up")  # fmt: skip
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "peers")
    p.add_argument("--keep", action="store_true", help="keep the peer's database")
    p.add_argument("--report", action="store_true",
                   help="run nothing: the summary of the latest saved result of each peer, "
                        "workload and size in --out")  # fmt: skip
    return p.parse_args(argv)


def saved_results(
    out: Path, peers: Sequence[str], workloads: Sequence[str], size: str
) -> list[dict[str, Any]]:
    """The latest result saved in ``out`` for each peer and workload (of ``size``)."""
    found: list[dict[str, Any]] = []
    for peer in peers:
        for workload in workloads:
            paths = sorted(out.glob(f"{peer}-{workload}-{size}-*.json"))
            if paths:
                found.append(json.loads(paths[-1].read_text())["result"])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    peers = PEER_NAMES if args.peer == "all" else (args.peer,)
    workloads = WORKLOADS if args.workload == "all" else (args.workload,)
    if args.report:
        print_summary(saved_results(args.out, peers, workloads, size_label(args)))
        return 0
    env = environment()
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for peer in peers:
        for workload in workloads:
            print(f"running {peer} {workload} ({size_label(args)}) ...", flush=True)
            try:
                result = run_workload(peer, workload, args)
            except Exception as e:  # one peer failing does not stop the others
                result = {"peer": peer, "workload": workload, "size": size_label(args),
                          "error": f"{type(e).__name__}: {e}"}  # fmt: skip
                print(f"  FAILED: {result['error'][:3000]}", flush=True)
                results.append(result)
                continue
            results.append(result)
            print_result(result)
            line = json.dumps({"bench": "peers", "env": env, "result": result}, sort_keys=True)
            print("BENCH_JSON " + line, flush=True)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            (args.out / f"{peer}-{workload}-{size_label(args)}-{stamp}.json").write_text(
                line + "\n"
            )
    done = [r for r in results if "error" not in r]
    if len(results) > 1:
        print_summary(done)
    return 1 if any("error" in r or failed(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
