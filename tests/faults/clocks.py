"""S7, clock skew and jumps: one scheduler and one worker run under libfaketime, whose wall clock
the nemesis moves at run time (+30 s, -30 s, then jumps of +1 h and -1 h) while their monotonic
clock stays real. onbeat tells time by the database server (docs/architecture.md, "Clock"), so
none of it may show: no early start, no false rescue, no shard takeover, no twin run.

How it is done:

- libfaketime (``LD_PRELOAD``) reads the skew from ``FAKETIME_TIMESTAMP_FILE`` at every call
  (``FAKETIME_NO_CACHE=1``) and leaves ``CLOCK_MONOTONIC`` alone
  (``FAKETIME_DONT_FAKE_MONOTONIC=1``); ``faketime_site/`` works around its bug with Python's
  ``time.sleep`` under that setting. The nemesis rewrites the file (atomically), waits, writes
  ``+0`` back, then watches ``shard_leases`` settle for a shard lease TTL + 1 s.
- The first fault of the plan is ``clock +0``: the same window with no skew, the baseline the
  shard takeovers are held against.
- Judging starts: a skewed worker's ledger ``wall`` is its own skewed clock, so the checker
  re-derives every ledger line's wall time from its ``mono_ns`` (``CLOCK_MONOTONIC``: one clock
  for every process of the box, real under libfaketime here) on the harness's unskewed clock,
  through the (wall, monotonic) pair the harness recorded nearest to it (each fault event holds
  one): early starts, delays and rescues are all judged on one true clock. The line's own wall
  is kept (``own_wall_ns``) and the lines it puts more than ``SKEW_SEEN`` away from the true one
  are counted. A worker whose claims lose the race to the others may run nothing in a window, so
  the proof that the skew reached each skewed process, both ways, is its clock probe: a line of
  its two clocks every 0.2 s (``faketime_site``), re-derived the same way.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from tests.faults.nemesis import FaultEvent, PlannedFault, ServiceFault
from tests.faults.process import FLEET_PYTHONPATH, wait_until

if TYPE_CHECKING:
    from tests.faults.runner import FleetContext

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
"""Debian's ``faketime`` package (``.ci/run`` installs it)."""
FAKETIME_SITE = Path(__file__).parent / "faketime_site"
CLOCK_FAULT = "clock "
SKEWS = ("+0", "+30", "-30", "+1h", "-1h")
"""libfaketime offsets in the order the nemesis sets them; ``+0`` first is the baseline."""
SKEWED = (("scheduler", 0), ("worker", 0))
"""The processes (role, index among the role's) that run under libfaketime."""
SKEW_LASTS = 5.0
"""Each skew lasts longer than a shard lease (4 s) plus a renewal: a scheduler that judged
leases by its own clock would take the other's shards (ahead) or lose its own (behind)."""
SETTLE = 5.0
"""After a skew is undone, its effects are watched this long (shard lease TTL + 1 s)."""
PLAN_SECONDS = 2.0 + len(SKEWS) * (SKEW_LASTS + SETTLE)
"""The load lasts as long as the plan (52 s)."""
PROBE = "clock-"
"""The skewed processes' clock probes (``faketime_site``) write ``logs/clock-<role>-<pid>.jsonl``."""
SKEW_SEEN = 20.0
"""A ledger line whose own wall clock is this far from the true one was written under skew."""


def require_libfaketime() -> None:
    """Fails (does not skip): S7 without libfaketime would prove nothing."""
    if not FAKETIME_LIB.exists():
        raise AssertionError(
            f"S7 needs libfaketime ({FAKETIME_LIB}): apt-get install -y faketime (.ci/run does)"
        )


def skew_file(artifacts: Path) -> Path:
    return artifacts / "faketime.rc"


def write_skew(path: Path, offset: str) -> None:
    """Replace the file whole: libfaketime, reading it at every call, never sees half of it."""
    part = path.with_suffix(".part")
    part.write_text(offset + "\n")
    os.replace(part, path)


def skewed_env(role: str, index: int, artifacts: Path) -> dict[str, str]:
    """A process's additions to the fleet's env: libfaketime for the ``SKEWED`` ones."""
    if (role, index) not in SKEWED:
        return {}
    require_libfaketime()
    path = skew_file(artifacts)
    if not path.exists():
        write_skew(path, "+0")
    return {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME_TIMESTAMP_FILE": str(path),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{FAKETIME_SITE}{os.pathsep}{FLEET_PYTHONPATH}",
        "ONBEAT_TEST_CLOCK_PROBE": str(artifacts / "logs" / f"{PROBE}{role}"),
    }


def skew_plan(_seed: int, _slots: list[int], _duration: float) -> list[PlannedFault]:
    """Every skew of ``SKEWS`` in turn, 2 s into the load, each after the last one settled."""
    step = SKEW_LASTS + SETTLE
    return [
        PlannedFault(2.0 + n * step, CLOCK_FAULT + offset, lasts=SKEW_LASTS)
        for n, offset in enumerate(SKEWS)
    ]


def _shard_query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` on ``shard_leases``; a refused connection (a busy shared server: "too many
    clients") is tried again for up to 20 s."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with psycopg.connect(database_url) as conn:
                return conn.execute(sql).fetchall()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def shard_epochs(database_url: str) -> int:
    """The sum of the shards' lease epochs: every takeover (``shard_take``) adds one."""
    return int(_shard_query(database_url, "SELECT coalesce(sum(epoch), 0) FROM shard_leases")[0][0])


def shards_settled(database_url: str, schedulers: int) -> bool:
    """Every shard held, in shares that differ by one at most among ``schedulers`` owners."""
    rows = _shard_query(database_url, "SELECT owner, count(*) FROM shard_leases GROUP BY owner")
    counts = [n for owner, n in rows if owner is not None]
    unheld = sum(n for owner, n in rows if owner is None)
    return not unheld and len(counts) == schedulers and max(counts) - min(counts) <= 1


def clock_faults(context: FleetContext) -> dict[str, ServiceFault]:
    """The skews by name. Made once the fleet is up, it waits until the schedulers have shared
    the shards out first: the baseline window must not count the start-up hand-over."""
    schedulers = len(context.supervisor.slots_of("scheduler"))
    wait_until(
        lambda: shards_settled(context.database_url, schedulers),
        30,
        "the schedulers to share the shards out",
    )
    return {CLOCK_FAULT + offset: functools.partial(_skew, context, offset) for offset in SKEWS}


def _skew(context: FleetContext, offset: str, fault: PlannedFault) -> FaultEvent:
    """Skew the libfaketime processes' wall clock by ``offset`` for ``fault.lasts`` seconds,
    undo it, and count the shard takeovers until ``SETTLE`` seconds later."""
    path = skew_file(context.artifacts)
    before = _epochs_or_none(context.database_url)
    # pid 0: the processes keep running; the fault explains no duplicate and no rescue.
    event = FaultEvent(fault.kind, "scheduler+worker", -1, 0, time.time(), time.monotonic_ns())
    write_skew(path, offset)
    time.sleep(fault.lasts)  # the fault's duration
    write_skew(path, "+0")
    event.ended = time.time()
    time.sleep(SETTLE)  # the window its effects are watched in
    after = _epochs_or_none(context.database_url)
    if before is not None and after is not None:
        event.shard_changes = after - before
    return event


def _epochs_or_none(database_url: str) -> int | None:
    """None if the shared server refuses us for longer than ``_shard_query`` tries: the window
    goes unmeasured (and S7 fails for it) instead of the nemesis dying mid-plan."""
    try:
        return shard_epochs(database_url)
    except psycopg.OperationalError:
        return None


def on_harness_clock(entries: list[dict[str, Any]], timeline: Sequence[FaultEvent]) -> None:
    """Each ledger line's ``wall``/``wall_ns`` re-derived from its ``mono_ns`` on the harness's
    clock, through the harness's (wall, monotonic) reading nearest to it; its own is kept as
    ``own_wall_ns``."""
    anchors = [(e.mono_ns, round(e.wall * 1e9)) for e in timeline]
    anchors.append((time.monotonic_ns(), time.time_ns()))
    for entry in entries:
        mono, wall = min(anchors, key=lambda a: abs(a[0] - entry["mono_ns"]))
        entry.setdefault("own_wall_ns", entry["wall_ns"])  # a second pass keeps the first's
        entry["wall_ns"] = wall + entry["mono_ns"] - mono
        entry["wall"] = entry["wall_ns"] / 1e9


def read_clock_probes(logs: Path) -> dict[str, list[dict[str, Any]]]:
    """The clock probes' complete lines by role (every ``SKEWED`` role has an entry)."""
    probes: dict[str, list[dict[str, Any]]] = {role: [] for role, _ in SKEWED}
    for path in sorted(logs.glob(f"{PROBE}*.jsonl")):
        role = path.name.removeprefix(PROBE).rsplit("-", 1)[0]
        lines = path.read_text().split("\n")[:-1]  # the last one may be half written
        probes.setdefault(role, []).extend(json.loads(line) for line in lines)
    return probes


def _skews(lines: Sequence[dict[str, Any]]) -> list[float]:
    """Own wall clock minus true wall clock, seconds, of lines ``on_harness_clock`` re-derived."""
    return [(e["own_wall_ns"] - e["wall_ns"]) / 1e9 for e in lines]


def skew_metrics(
    entries: Sequence[dict[str, Any]],
    probes: dict[str, list[dict[str, Any]]],
    timeline: Sequence[FaultEvent],
) -> tuple[dict[str, Any], dict[str, bool]]:
    """S7's own metrics and checks: the skew reached every skewed process both ways (its clock
    probe says so; how many run lines it wrote under skew is told, not judged); no shard
    takeover in the skewed windows (the ``clock +0`` window's count is the baseline)."""
    for lines in probes.values():
        on_harness_clock(lines, timeline)
    probe_skews = [_skews(lines) for lines in probes.values()]
    skews = _skews(entries)
    changes = {e.fault: e.shard_changes for e in timeline if e.fault.startswith(CLOCK_FAULT)}
    baseline = changes.pop(CLOCK_FAULT + "+0", None)
    skewed = sum(n or 0 for n in changes.values())
    measured = sum(n is not None for n in changes.values())
    metrics: dict[str, Any] = {
        "skewed_lines_ahead": sum(s > SKEW_SEEN for s in skews),
        "skewed_lines_behind": sum(s < -SKEW_SEEN for s in skews),
        "skew_max_s": max((abs(s) for s in skews), default=0.0),
        "probed_ahead_min": min(sum(s > SKEW_SEEN for s in p) for p in probe_skews),
        "probed_behind_min": min(sum(s < -SKEW_SEEN for s in p) for p in probe_skews),
        "shard_takeovers_baseline": baseline,
        "shard_takeovers_skewed": skewed,
        "skew_windows_measured": measured,
    }
    checks = {
        "probed_ahead_min": metrics["probed_ahead_min"] > 0,
        "probed_behind_min": metrics["probed_behind_min"] > 0,
        "shard_takeovers_skewed": skewed == 0,
        "skew_windows_measured": measured == len(SKEWS) - 1,
    }
    return metrics, checks
