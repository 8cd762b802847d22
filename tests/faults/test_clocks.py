"""S7's tools checked on their own, fast: libfaketime really moves a Python process's wall clock
at run time while its monotonic clock stays the box's, and the checker judges ledger lines on
the harness's clock however skewed the line's own wall clock was."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.faults.clocks import (
    CLOCK_FAULT,
    SKEWS,
    on_harness_clock,
    read_clock_probes,
    skew_metrics,
    skew_plan,
    skewed_env,
    write_skew,
)
from tests.faults.nemesis import FaultEvent
from tests.faults.process import REPO, wait_until

READ_CLOCKS = """
import json, sys, time
for line in sys.stdin:  # one reading per line the test sends
    time.sleep(0.01)  # fails with EINVAL without faketime_site (libfaketime#426)
    print(json.dumps([time.time(), time.monotonic_ns()]), flush=True)
"""


def test_libfaketime__moves_a_python_processs_wall_clock_not_its_monotonic_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "logs").mkdir()
    env = os.environ | skewed_env("worker", 0, tmp_path)  # fails loudly without libfaketime
    with subprocess.Popen(
        [sys.executable, "-c", READ_CLOCKS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
        text=True,
    ) as child:
        stdin, stdout = child.stdin, child.stdout
        assert stdin is not None and stdout is not None
        for offset, expected in [
            ("+0", 0),
            ("+30", 30),
            ("-30", -30),
            ("+1h", 3600),
            ("-1h", -3600),
        ]:
            write_skew(tmp_path / "faketime.rc", offset)
            stdin.write("\n")
            stdin.flush()
            wall, mono_ns = json.loads(stdout.readline())
            assert abs(wall - time.time() - expected) < 1, (offset, wall)
            assert abs(mono_ns - time.monotonic_ns()) < 10**9, (offset, mono_ns)
            seen = functools.partial(probed, tmp_path / "logs", expected)
            wait_until(seen, 5, f"a probe line at {offset}")
        stdin.close()
        assert child.wait(10) == 0


def probed(logs: Path, skew: float) -> bool:
    """The child's clock probe wrote a line ``skew`` s off the true wall clock."""
    lines = read_clock_probes(logs)["worker"]
    on_harness_clock(lines, [])
    return any(abs((e["own_wall_ns"] - e["wall_ns"]) / 1e9 - skew) < 1 for e in lines)


def line(own_wall: float, mono_ns: int) -> dict[str, Any]:
    return {"event": "start", "wall": own_wall, "wall_ns": int(own_wall * 1e9), "mono_ns": mono_ns}


def test_on_harness_clock__a_skewed_line_gets_the_true_wall_time_of_its_monotonic_instant() -> None:
    now_wall, now_mono = time.time(), time.monotonic_ns()
    event = FaultEvent(CLOCK_FAULT + "+1h", "worker", -1, 0, now_wall - 20, now_mono - 20 * 10**9)
    entries = [
        line(now_wall - 10 + 3600, now_mono - 10 * 10**9),  # written 10 s ago, an hour ahead
        line(now_wall - 5 - 30, now_mono - 5 * 10**9),  # 5 s ago, 30 s behind
    ]
    on_harness_clock(entries, [event])
    assert abs(entries[0]["wall"] - (now_wall - 10)) < 0.05
    assert abs(entries[1]["wall"] - (now_wall - 5)) < 0.05
    probes = {"worker": [line(now_wall - 9 + 3600, now_mono - 9 * 10**9)], "scheduler": []}
    metrics, checks = skew_metrics(entries, probes, [event])
    assert (metrics["skewed_lines_ahead"], metrics["skewed_lines_behind"]) == (1, 1)
    assert metrics["probed_ahead_min"] == 0  # the scheduler's probe saw no skew
    assert not checks["probed_ahead_min"] and not checks["probed_behind_min"]
    probes["scheduler"] = [line(now_wall - 8 + 3600, now_mono - 8 * 10**9)]
    probes["worker"].append(line(now_wall - 4 - 30, now_mono - 4 * 10**9))
    assert not skew_metrics(entries, probes, [event])[1]["probed_behind_min"]
    probes["scheduler"].append(line(now_wall - 3 - 30, now_mono - 3 * 10**9))
    metrics, checks = skew_metrics(entries, probes, [event])
    assert (metrics["probed_ahead_min"], metrics["probed_behind_min"]) == (1, 1)
    assert checks["probed_ahead_min"] and checks["probed_behind_min"]


def test_skew_metrics__a_takeover_under_skew_fails_and_the_baseline_is_reported() -> None:
    events = [
        FaultEvent(f.kind, "scheduler+worker", -1, 0, 0.0, 0, shard_changes=n)
        for f, n in zip(skew_plan(7, [], 60.0), [1, 0, 0, 3, 0], strict=True)
    ]
    metrics, checks = skew_metrics([], {"worker": []}, events)
    assert [f.kind for f in skew_plan(7, [], 60.0)] == [CLOCK_FAULT + s for s in SKEWS]
    assert metrics["shard_takeovers_baseline"] == 1
    assert metrics["shard_takeovers_skewed"] == 3
    assert not checks["shard_takeovers_skewed"]
    assert checks["skew_windows_measured"]
    events[2].shard_changes = None  # the server refused the harness: that window is not proof
    assert not skew_metrics([], {"worker": []}, events)[1]["skew_windows_measured"]
    assert not checks["probed_ahead_min"]  # no probe line under skew: the fault never took
