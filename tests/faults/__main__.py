"""``python -m tests.faults --scenario S1 --seed 7``: run one scenario, print the checker's table;
the exit status is 0 on pass."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from tests.faults import s9_api, s10_dst
from tests.faults.checker import Report
from tests.faults.scenarios import SCENARIOS, run

OWN_MODULE: dict[str, Callable[[int, Path], Report]] = {"S9": s9_api.run, "S10": s10_dst.run}
"""Scenarios whose runner lives in a module of its own."""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--scenario", choices=sorted([*SCENARIOS, *OWN_MODULE]), required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--artifacts", type=Path, default=None)
    args = parser.parse_args()
    artifacts = args.artifacts or Path("artifacts/faults") / f"{args.scenario}-seed{args.seed}"
    own = OWN_MODULE.get(args.scenario)
    report = own(args.seed, artifacts) if own else run(args.scenario, args.seed, artifacts)
    print(report.table())
    print(f"artifacts: {artifacts}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
