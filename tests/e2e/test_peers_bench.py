"""``bench/peers/run.py`` for onbeat's two entries (``onbeat``: scheduler + 2 workers on
PostgreSQL; ``onbeat-embedded``: one node on SQLite) at the tiny size, so onbeat's place in the
peers' harness cannot rot: every workload counts every run started once (none lost, duplicated
or early) and the peer's database is dropped afterwards. Counts only, never times. The two run
side by side: each W3 waits for a minute boundary, the same one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.bench_runs import peer_databases
from tests.e2e.conftest import REPO

ENTRIES = ("onbeat", "onbeat-embedded")


def _run(peer: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "bench/peers/run.py", "--peer", peer, "--workload", "all",
         "--size", "tiny", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_peers_bench__onbeat_entries_count_every_run_once_in_every_workload(
    tmp_path: Path,
) -> None:
    before = peer_databases()
    runs = {peer: _run(peer, tmp_path / peer) for peer in ENTRIES}
    outputs = {peer: proc.communicate(timeout=240)[0] for peer, proc in runs.items()}
    for peer, proc in runs.items():
        assert proc.returncode == 0, f"{peer}:\n{outputs[peer][-4000:]}"
        lines = [x for x in outputs[peer].splitlines() if x.startswith("BENCH_JSON ")]
        results = [json.loads(x.removeprefix("BENCH_JSON "))["result"] for x in lines]
        assert [r["workload"] for r in results] == ["W1", "W2", "W3"]
        for result in results:
            f = result["figures"]
            assert result["peer"] == peer and f["runs"] > 0
            assert f["started"] == f["runs"], (peer, result["workload"])
            assert (f["lost"], f["duplicated"], f["early"]) == (0, 0, 0)
            assert f["peer_cpu_s"] > 0
            if result["workload"] != "W1":  # in W1 a worker may still be starting when it ends
                assert set(f["exit_statuses"].values()) == {0}, (peer, result["workload"])
        assert len(list((tmp_path / peer).glob(f"{peer}-W*-tiny-*.json"))) == 3
    assert peer_databases() <= before  # the fleet's databases were dropped
