"""The quick profile: each scenario of this slice as a test (real processes, PostgreSQL, a
private Redis); the checker's table is printed and every pass line must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.runner import run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.external_service,
    pytest.mark.faults,
    pytest.mark.timeout(240),
]


@pytest.mark.parametrize("scenario", ["S0", "S1", "S2", "S3", "S4", "S8", "S11"])
def test_fault_scenario__pass_lines_hold(scenario: str, tmp_path: Path) -> None:
    report = run(scenario, seed=7, artifacts=tmp_path / scenario)
    print("\n" + report.table())
    assert report.passed, report.table() + f"\n{report.config['details']}"
