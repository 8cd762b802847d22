"""S8's measurements: a thundering herd, no faults. 5,000 one-shots all fall due at one minute
boundary, where 1,000 every-minute cron jobs fire too; the start delays of the two are reported
apart (the burst's p99 has a bound), and the herd must cost no lease: an attempt the reaper
ended as ``lost`` means a worker too busy to heartbeat, or a claim too slow to start its runs
within the lease.

The claim statement's latency is not measured: ``pg_stat_statements`` is not loaded on the
shared server and onbeat has no claim-duration metric (``src/onbeat/metrics.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.faults.checker import percentile, query
from tests.faults.oracle import RunRecord, SubmittedJob


def herd_report(
    database_url: str,
    jobs: Sequence[SubmittedJob],
    runs: Sequence[RunRecord],
    first_starts: dict[str, float],
    bound: float,
) -> tuple[dict[str, Any], dict[str, bool]]:
    """The burst's (one-shots') and the cron fan-out's start delays, and the lost attempts."""
    once = {job.id for job in jobs if job.kind == "once"}
    cron = {job.id for job in jobs if job.kind == "cron"}

    def delays(of: set[str]) -> list[float]:
        return [
            first_starts[run.id] - run.scheduled_for.timestamp()
            for run in runs
            if run.job_id in of and run.id in first_starts
        ]

    burst, fan_out = delays(once), delays(cron)
    instants = {run.scheduled_for for run in runs if run.job_id in once}
    lost = query(database_url, "SELECT count(*) FROM attempts WHERE outcome = 'lost'")[0][0]
    metrics: dict[str, Any] = {
        "burst_runs": len(burst),
        "burst_instants": len(instants),
        "burst_start_delay_p50": percentile(burst, 0.5),
        "burst_start_delay_p99": percentile(burst, 0.99),
        "burst_start_delay_max": max(burst, default=0.0),
        "cron_fanout_runs": len(fan_out),
        "cron_fanout_start_delay_p50": percentile(fan_out, 0.5),
        "cron_fanout_start_delay_p99": percentile(fan_out, 0.99),
        "cron_fanout_start_delay_max": max(fan_out, default=0.0),
        "lost_attempts": int(lost),
        "claim_p99": "not measured",
    }
    checks = {
        "burst_instants": len(instants) == 1,
        "burst_start_delay_p99": metrics["burst_start_delay_p99"] <= bound,
        "lost_attempts": metrics["lost_attempts"] == 0,
    }
    return metrics, checks
