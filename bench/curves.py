"""How onbeat's cost grows: start delay and CPU with the burst size (W2) and the number of cron
jobs (W3), memory and CPU with the runs in flight (W4), three sizes each, plotted for
docs/performance.md::

    .venv/bin/python bench/curves.py                        # distributed, ~15 min, then plots
    .venv/bin/python bench/curves.py --mode embedded
    .venv/bin/python bench/curves.py --plot-only bench/results/curves/distributed-<stamp>.json

Each point is one run of the workload's own script (``bench/peers/run.py --peer onbeat --count N``
for W2 and W3, the harness the peers are measured by; ``bench/inflight.py --runs N`` for W4),
read back from its ``BENCH_JSON`` line. The points are saved to ``--out`` and plotted to
``--plot`` (matplotlib, from the ``bench`` extra). Nothing here checks a figure: the scripts
exit non-zero on a lost, duplicated or early run, and this one then stops.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIZES = {
    "W2": (1_000, 10_000, 100_000),
    "W3": (1_000, 10_000, 100_000),
    "W4": (1_000, 5_000, 10_000),
}
"""Burst sizes (runs due at one instant), cron jobs, runs in flight."""
PEER = {"distributed": "onbeat", "embedded": "onbeat-embedded"}


def command(mode: str, workload: str, size: int) -> list[str]:
    if workload == "W4":
        return [sys.executable, "bench/inflight.py", "--mode", mode, "--runs", str(size)]
    return [
        sys.executable, "bench/peers/run.py", "--peer", PEER[mode],
        "--workload", workload, "--count", str(size),
    ]  # fmt: skip


def measure(mode: str, workload: str, size: int) -> dict[str, Any]:
    """One point: the figures of the script's BENCH_JSON line."""
    argv = command(mode, workload, size)
    print(f"$ {' '.join(argv[1:])}", flush=True)
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("BENCH_JSON ")]
    if not lines:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(lines[-1].removeprefix("BENCH_JSON "))
    figures: dict[str, Any] = found["result"]["figures"]
    if done.returncode != 0:  # a size the fleet cannot hold is a point too: left out of the plot
        print(f"  failed (lost {figures.get('lost')}, timed out {figures.get('timed_out')})")
    return {"workload": workload, "size": size, "failed": done.returncode != 0, "figures": figures}


def point(workload: str, figures: dict[str, Any]) -> dict[str, float]:
    """What a curve plots of one run."""
    if workload == "W4":
        return {
            "worker KiB per run in flight": figures["worker_kib_per_run_in_flight"],
            # every process's and the fleet's PostgreSQL backends' (lease renewals)
            "CPU s per s holding": sum(figures.get("hold_cpu_per_s", {}).values()),
        }
    return {
        "start delay p50 (s)": figures["delay_p50_s"],
        "start delay p99 (s)": figures["delay_p99_s"],
        "start delay max (s)": figures["delay_max_s"],
        "CPU us per run": figures["cpu_us_per_run"],
    }


AXES = {
    "W2": ("runs due at one instant (W2)", ["start delay p50 (s)", "start delay p99 (s)",
                                            "start delay max (s)"], "CPU us per run"),
    "W3": ("every-minute cron jobs (W3)", ["start delay p50 (s)", "start delay p99 (s)",
                                           "start delay max (s)"], "CPU us per run"),
    "W4": ("runs in flight (W4)", ["worker KiB per run in flight"], "CPU s per s holding"),
}  # fmt: skip
"""Per workload: x label, the curves on the left axis, the one on the right axis."""


def plot(points: Sequence[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [w for w in AXES if any(p["workload"] == w for p in points)]
    fig, panels = plt.subplots(1, len(shown), figsize=(5 * len(shown), 4.2), squeeze=False)
    for ax, workload in zip(panels[0], shown, strict=True):
        xlabel, left, right = AXES[workload]
        mine = sorted(
            (p for p in points if p["workload"] == workload and not p.get("failed")),
            key=lambda p: p["size"],
        )
        sizes = [p["size"] for p in mine]
        values = [point(workload, p["figures"]) for p in mine]
        for name in left:
            ax.plot(sizes, [v[name] for v in values], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(left[0] if len(left) == 1 else "seconds")
        twin = ax.twinx()
        twin.plot(sizes, [v[right] for v in values], "k--", marker="s", label=right)
        twin.set_ylabel(right)
        twin.set_ylim(bottom=0)
        ax.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plotted {path}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mode", choices=sorted(PEER), default="distributed")
    p.add_argument("--workloads", nargs="+", choices=sorted(SIZES), default=sorted(SIZES))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "curves")
    p.add_argument("--plot", type=Path, default=None,
                   help="PNG to write (default: docs/performance-<mode>.png)")  # fmt: skip
    p.add_argument("--plot-only", type=Path, default=None, help="plot a saved run, run nothing")
    args = p.parse_args(argv)
    if args.plot_only is not None:
        saved = json.loads(args.plot_only.read_text())
        mode, points = saved["mode"], saved["points"]
    else:
        mode = args.mode
        points = [measure(mode, w, n) for w in args.workloads for n in SIZES[w]]
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        saved_to = args.out / f"{mode}-{stamp}.json"
        saved_to.write_text(json.dumps({"mode": mode, "points": points}, indent=1) + "\n")
        print(f"saved {saved_to}")
    for p_ in points:
        shown = "FAILED" if p_.get("failed") else point(p_["workload"], p_["figures"])
        print(p_["workload"], p_["size"], shown)
    plot(points, f"onbeat {mode}: cost by size", args.plot or REPO / f"docs/performance-{mode}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
