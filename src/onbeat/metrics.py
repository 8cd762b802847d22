"""Prometheus metrics of one onbeat process (``prometheus_client``), served at ``/metrics``.

Each :class:`Metrics` owns its own registry, not the library's global one, so two nodes in one
process (or two tests) never share counts. Labels are bounded: task names, final statuses, route
templates and methods; never a job, execution or key id.

Skipped fire times are counted by the process whose store call skipped them (the store reports
them after each commit). Scheduler and worker processes serve theirs on ``metrics_port``; ``onbeat up`` and
``onbeat api`` with the API.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST

DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
CLAIM_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """Every metric a node exposes, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.start_delay = Histogram(
            "onbeat_start_delay_seconds",
            "Time from a run's due time to its start by a worker.",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.run_duration = Histogram(
            "onbeat_run_duration_seconds",
            "Time a run's task took, whatever its outcome.",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.executions = Counter(
            "onbeat_executions",
            "Executions finished, by final status (succeeded, or failed: dead-lettered).",
            ["task", "status"],
            registry=r,
        )
        self.claim_size = Histogram(
            "onbeat_claim_size_runs",
            "Runs a worker's store claim took from the delay queue: each claim costs a round trip "
            "to the queue and a transaction, however few it takes.",
            buckets=CLAIM_SIZE_BUCKETS,
            registry=r,
        )
        self.runs_in_flight = Gauge(
            "onbeat_runs_in_flight", "Runs this worker holds the lease of.", registry=r
        )
        self.retries = Counter(
            "onbeat_retries", "Failed attempts scheduled to run again.", ["task"], registry=r
        )
        self.lease_expiries = Counter(
            "onbeat_lease_expiries",
            "Running executions whose lease expired, taken back by the reaper (rescues).",
            registry=r,
        )
        self.fenced = Counter(
            "onbeat_fenced_results_discarded",
            "Runs stopped or outcomes refused because their lease had been taken away.",
            registry=r,
        )
        self.dead_letters = Counter(
            "onbeat_dead_letters", "Executions that exhausted their attempts.", registry=r
        )
        self.reconciler_repairs = Counter(
            "onbeat_reconciler_repairs",
            "Active cron jobs found without a planned next run, and repaired.",
            registry=r,
        )
        self.shard_takeovers = Counter(
            "onbeat_shard_takeovers", "Shard leases this scheduler acquired.", registry=r
        )
        self.shards_held = Gauge(
            "onbeat_shards_held", "Shards this scheduler holds the lease of.", registry=r
        )
        self.sweep_reenqueued = Counter(
            "onbeat_sweep_reenqueued",
            "Queued runs the sweep handed to the delay queue again (the queue had lost them).",
            registry=r,
        )
        self.queue_on_fallback = Gauge(
            "onbeat_queue_on_fallback",
            "1 while this process's delay queue uses its PostgreSQL fallback (Redis is down).",
            registry=r,
        )
        self.queue_failovers = Counter(
            "onbeat_queue_failovers",
            "Times this process's delay queue found Redis down and turned to its fallback.",
            registry=r,
        )
        self.loop_stalls = Counter(
            "onbeat_event_loop_stalls",
            "Times the event loop did not answer the watchdog in time.",
            registry=r,
        )
        self.stalled_sessions_ended = Counter(
            "onbeat_stalled_sessions_ended",
            "Database sessions of frozen processes ended mid-transaction (their locks released).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "onbeat_queue_depth",
            "Runs due and not yet started, by priority (the whole store: every scheduler reports "
            "the same value, so aggregate with max).",
            ["priority"],
            registry=r,
        )
        self.skipped = Counter(
            "onbeat_skipped_fire_times",
            "Fire times recorded as skipped, by cause (misfire, overlap, paused, other), by the "
            "store calls of this process.",
            ["cause"],
            registry=r,
        )
        self.alerts = Counter(
            "onbeat_alerts",
            "Webhook alerts by kind (dead_letter, skipped) and outcome (delivered, retried, "
            "given_up, ignored: a kind not configured to be sent).",
            ["kind", "outcome"],
            registry=r,
        )
        self.api_request_duration = Histogram(
            "onbeat_api_request_duration_seconds",
            "HTTP request latency, by route template and method.",
            ["route", "method"],
            buckets=API_BUCKETS,
            registry=r,
        )

    def exposition(self) -> bytes:
        """The text exposition format of every metric here."""
        return generate_latest(self.registry)
