"""A profile's results side by side: one markdown table (a row per metric, a column per
scenario, the pass lines marked) and one JSON file, for docs/faults.md and the closing notes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.checker import Report


def table(reports: list[Report]) -> str:
    keys: list[str] = []
    for report in reports:
        keys += [k for k in report.metrics if k not in keys]
    head = "| metric | " + " | ".join(r.scenario for r in reports) + " |"
    rule = "|---|" + "---|" * len(reports)
    rows = [head, rule]
    for key in keys:
        cells = [_cell(r, key) for r in reports]
        rows.append(f"| `{key}` | " + " | ".join(cells) + " |")
    verdicts = ["PASS" if r.passed else "**FAIL**" for r in reports]
    rows.append("| **result** | " + " | ".join(verdicts) + " |")
    return "\n".join(rows)


def _cell(report: Report, key: str) -> str:
    if key not in report.metrics:
        return "—"
    value = report.metrics[key]
    shown = f"{value:.3f}" if isinstance(value, float) else str(value)
    return f"**{shown}** ✗" if report.checks.get(key) is False else shown


def write(reports: list[Report], directory: Path, title: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.md").write_text(f"# {title}\n\n{table(reports)}\n")
    results = [
        {"scenario": r.scenario, "seed": r.seed, "passed": r.passed, "metrics": r.metrics,
         "checks": r.checks, "config": r.config}
        for r in reports
    ]  # fmt: skip
    (directory / "results.json").write_text(json.dumps(results, indent=1) + "\n")
