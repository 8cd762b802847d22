"""Runtime settings, from arguments or ``ONBEAT_*`` environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONBEAT_", extra="ignore")

    database_url: str = "sqlite:///onbeat.db"
    queue_url: str = "memory://"

    lease_ttl: float = Field(60.0, gt=0, description="Seconds a worker's lease on a run lasts.")
    heartbeat_interval: float = Field(10.0, gt=0, description="Seconds between lease renewals.")
    concurrency: int = Field(64, ge=1, description="Runs one worker process executes at once.")
    claim_batch: int = Field(256, ge=1, description="Most runs a worker claims per store call.")
    shutdown_grace: float = Field(10.0, ge=0, description="Seconds in-flight runs get to finish.")
    loop_stall_warning: float = Field(
        1.0,
        gt=0,
        description="Seconds the event loop may go unanswered before the watchdog logs what holds it.",
    )
    pool: Literal["threads", "processes"] = Field(
        "threads",
        description="Where sync tasks run: daemon threads, or child processes (hard timeouts, "
        "crash isolation). See docs/executors.md.",
    )

    shards: int = Field(16, ge=1, description="Shard count, fixed when the store is created.")
    shard_lease_ttl: float = Field(15.0, gt=0)
    shard_renew_interval: float = Field(5.0, gt=0)
    poll_interval: float = Field(
        0.2,
        gt=0,
        description="Seconds between reads for newly due work: how soon new work is noticed.",
    )
    window: float = Field(
        10.0, ge=0, description="Seconds ahead of due time that runs are handed to the delay queue."
    )
    dispatch_batch: int = Field(5000, ge=1)
    misfire_grace: float = Field(
        60.0,
        ge=0,
        description="A fire time later than this when first dispatched counts as missed.",
    )
    sweep_interval: float = Field(5.0, gt=0)
    sweep_overdue: float = Field(
        15.0, ge=0, description="A queued run this overdue and not started is re-enqueued."
    )
    sweep_batch: int = Field(
        5000,
        ge=1,
        description="Most queued runs one sweep pass reads; the next pass goes on from there.",
    )
    reap_interval: float = Field(1.0, gt=0)
    reconcile_interval: float = Field(
        60.0, gt=0, description="Seconds between checks that every cron job has its next run."
    )
