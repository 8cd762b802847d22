"""``python -m tests.faults --scenario S1 --seed 7``: run one scenario, print the checker's table;
``--profile quick`` (or ``nightly``): run a profile's scenarios one after the other and write their
figures side by side (``summary.md``, ``results.json``). The exit status is 0 if all passed."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tests.faults import summary
from tests.faults.runner import OWN_RUNNERS, run
from tests.faults.scenarios import PROFILES, SCENARIOS


def main() -> int:
    # `kill` of the runner unwinds it, so the supervisor stops the fleet (and wakes any process
    # the nemesis froze) instead of leaving it running, orphaned, on the shared server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", choices=sorted([*SCENARIOS, *OWN_RUNNERS]))
    which.add_argument("--profile", choices=sorted(PROFILES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--artifacts", type=Path, default=None)
    parser.add_argument(
        "--load-seconds",
        type=float,
        default=None,
        help="the scenario's load (and faults) over this long at its pace: a short N1",
    )
    parser.add_argument(
        "--rate", type=float, default=1.0, help="times the scenario's once jobs per batch"
    )
    args = parser.parse_args()
    if (args.load_seconds is not None or args.rate != 1.0) and not args.scenario:
        parser.error("--load-seconds and --rate scale one --scenario")
    name = args.scenario or args.profile
    scale = "" if args.load_seconds is None else f"-{args.load_seconds:g}s"
    scale += "" if args.rate == 1.0 else f"-x{args.rate:g}"
    artifacts = args.artifacts or Path("artifacts/faults") / f"{name}{scale}-seed{args.seed}"
    names = [args.scenario] if args.scenario else list(PROFILES[args.profile])
    reports = []
    for scenario in names:
        where = artifacts / scenario if args.profile else artifacts
        report = run(scenario, args.seed, where, args.load_seconds, args.rate)
        print(report.table(), flush=True)
        reports.append(report)
    if args.profile:
        summary.write(reports, artifacts, f"Profile {args.profile}, seed {args.seed}")
        print(summary.table(reports))
    print(f"artifacts: {artifacts}")
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
