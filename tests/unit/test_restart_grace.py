"""RestartGrace: after PostgreSQL restarts, the reaper's grace runs from when this process reached
the server again, not from the server's start (crash recovery keeps clients out meanwhile)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from onbeat.store.postgres import RestartGrace

STARTED = datetime(2026, 12, 1, 20, 0, 15, tzinfo=UTC)
GRACE = 4.0


def test_first_sight_of_the_server__holds_nothing_back() -> None:
    grace = RestartGrace()
    assert not grace.held(STARTED, 100.0, GRACE)
    assert not grace.held(STARTED, 100.1, GRACE)


def test_a_restart_seen__holds_reaping_for_the_grace_from_when_it_was_first_seen() -> None:
    """N1 20:00: the server started at 15.9 s, accepted connections at 20.2 s after replaying
    WAL, and a grace counted from 15.9 s had run out before any worker could renew."""
    grace = RestartGrace()
    grace.held(STARTED, 100.0, GRACE)
    restarted = STARTED + timedelta(minutes=5)
    assert grace.held(restarted, 120.0, GRACE)  # first reached after the restart
    assert grace.held(restarted, 120.0 + GRACE - 0.01, GRACE)
    assert not grace.held(restarted, 120.0 + GRACE, GRACE)
    assert not grace.held(restarted, 200.0, GRACE)
    assert not grace.held(restarted, 200.0, 0.0)
