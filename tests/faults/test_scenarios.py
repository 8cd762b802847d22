"""The quick profile: each scenario of this slice as a test (real processes, PostgreSQL, a
private Redis); the checker's table is printed and every pass line must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.runner import run
from tests.faults.scenarios import PROFILES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.external_service,
    pytest.mark.faults,
    pytest.mark.timeout(240),
]


@pytest.mark.parametrize("scenario", PROFILES["quick"])
def test_fault_scenario__pass_lines_hold(scenario: str, tmp_path: Path) -> None:
    report = run(scenario, seed=7, artifacts=tmp_path / scenario)
    print("\n" + report.table())
    # What explains a failing line where it is not in the table: the details, and S5's rebuilds
    # (the trace of each, the load, when each scheduler heard), which CI's output keeps.
    explain = {
        key: report.config[key] for key in ("details", "redis_faults") if key in report.config
    }
    assert report.passed, report.table() + f"\n{explain}"
