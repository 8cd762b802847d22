"""``python -m tests.faults --scenario S1 --seed 7``: run one scenario, print the checker's table;
the exit status is 0 on pass."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.faults.runner import run
from tests.faults.scenarios import SCENARIOS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--artifacts", type=Path, default=None)
    args = parser.parse_args()
    artifacts = args.artifacts or Path("artifacts/faults") / f"{args.scenario}-seed{args.seed}"
    report = run(args.scenario, args.seed, artifacts)
    print(report.table())
    print(f"artifacts: {artifacts}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
