"""The overview's figures, from the store's range reads: the last hour per minute (throughput,
start delay p50/p99, queue depth), runs in flight, failures, dead letters, shards per scheduler
and workers alive."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup

from onbeat.app import App
from onbeat.dashboard import charts
from onbeat.dashboard.render import duration
from onbeat.model import ExecutionStatus
from onbeat.store.base import ActivityBucket, SchedulerShards, WorkerLoad, delay_class_floor

WINDOW = timedelta(hours=1)
BUCKET = timedelta(minutes=1)
DEAD_LETTER_COUNT_LIMIT = 10_000
"""Dead letters are counted up to this many (the page says "10,000+")."""


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    since: datetime
    finished: Counter[ExecutionStatus]
    """Runs that ended in the window, by final status."""
    delay_p50: float | None
    delay_p99: float | None
    """Seconds, over the whole window; None without a started run."""
    queue_depth: int
    in_flight: int
    expired_leases: int
    dead_letters: int
    workers: list[WorkerLoad]
    schedulers: list[SchedulerShards]
    throughput_chart: Markup
    delay_chart: Markup
    depth_chart: Markup

    @property
    def dead_letters_capped(self) -> bool:
        return self.dead_letters >= DEAD_LETTER_COUNT_LIMIT


def overview(onbeat: App, tenant: str | None) -> Overview:
    """Everything the overview shows, for ``tenant`` (None: every tenant). The window is the last
    hour in whole minutes, so a refresh a few seconds later keeps the same buckets."""
    store = onbeat.store
    now = store.now()
    since = now.replace(second=0, microsecond=0) - WINDOW + BUCKET
    until = now + timedelta(microseconds=1)  # what ended at this very instant counts
    buckets = store.execution_activity(tenant=tenant, since=since, until=until, bucket=BUCKET)
    workers = store.execution_running_by_owner(tenant=tenant)
    finished: Counter[ExecutionStatus] = Counter()
    delays: Counter[int] = Counter()
    for bucket in buckets:
        finished.update(bucket.finished)
        delays.update(bucket.start_delays)
    return Overview(
        now=now,
        since=since,
        finished=finished,
        delay_p50=percentile(delays, 0.5),
        delay_p99=percentile(delays, 0.99),
        queue_depth=buckets[-1].queue_depth if buckets else 0,
        in_flight=sum(w.running + w.expired for w in workers),
        expired_leases=sum(w.expired for w in workers),
        dead_letters=store.dead_letter_count(tenant=tenant, limit=DEAD_LETTER_COUNT_LIMIT),
        workers=workers,
        schedulers=store.scheduler_shards(),
        **_charts(buckets),
    )


def percentile(delays: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (seconds) of delays counted per ``store.base.delay_class``: the class it
    falls in, interpolated linearly inside that class by rank."""
    total = sum(delays.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for cls in sorted(delays):
        count = delays[cls]
        if count and seen + count >= rank:
            low, high = delay_class_floor(cls), delay_class_floor(cls + 1)
            return (low + (high - low) * (rank - seen) / count) / 1e6
        seen += count
    return delay_class_floor(max(delays) + 1) / 1e6  # unreachable: ranks stop at total


_SHOWN_APART = {
    ExecutionStatus.SUCCEEDED: ("succeeded", "s-succeeded"),
    ExecutionStatus.FAILED: ("failed", "s-failed"),
}
"""Statuses with their own colour in the throughput chart; the rest are stacked as one."""


def _charts(buckets: Sequence[ActivityBucket]) -> dict[str, Markup]:
    times = [b.start for b in buckets]
    apart = [
        charts.Series(label, css, [b.finished.get(status, 0) for b in buckets])
        for status, (label, css) in _SHOWN_APART.items()
    ]
    others = [sum(n for s, n in b.finished.items() if s not in _SHOWN_APART) for b in buckets]
    throughput = charts.stacked_bars(
        times,
        [*apart, charts.Series("skipped or cancelled", "s-other", others)],
        empty="No run ended in the last hour",
        fmt=lambda v: f"{v:,.0f}",
    )
    delays = charts.lines(
        times,
        [
            charts.Series("p50", "p50", [percentile(b.start_delays, 0.5) for b in buckets]),
            charts.Series("p99", "p99", [percentile(b.start_delays, 0.99) for b in buckets]),
        ],
        empty="No run started and ended in the last hour",
        fmt=duration,
        log=True,
    )
    depth = charts.lines(
        times,
        [charts.Series("due, not started", "depth", [b.queue_depth for b in buckets])],
        empty="Nothing was waiting to start in the last hour",
        fmt=lambda v: f"{v:,.0f}",
    )
    return {"throughput_chart": throughput, "delay_chart": delays, "depth_chart": depth}
