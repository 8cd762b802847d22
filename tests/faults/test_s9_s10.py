"""S9 (API fuzz, invalid cron/TZ corpus, auth matrix against a live ``onbeat api`` on
PostgreSQL) and S10 (the DST oracle, no infrastructure) as tests: the checker's table is
printed and every pass line must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import s9_api, s10_dst

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(240)]


@pytest.mark.external_service
def test_s9__malformed_input_is_refused_cleanly(tmp_path: Path) -> None:
    report = s9_api.run(seed=7, artifacts=tmp_path / "S9")
    print("\n" + report.table())
    assert report.passed, report.table() + f"\n{report.config['details']}"


def test_s10__cron_engine_agrees_with_the_dst_oracle(tmp_path: Path) -> None:
    report = s10_dst.run(seed=7, artifacts=tmp_path / "S10")
    print("\n" + report.table())
    assert report.passed, report.table() + f"\n{report.config['details']}"
