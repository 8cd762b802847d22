"""The worker: claims due runs, runs them through an executor, heartbeats, records outcomes."""

from onbeat.worker.worker import Worker, WorkerStats

__all__ = ["Worker", "WorkerStats"]
