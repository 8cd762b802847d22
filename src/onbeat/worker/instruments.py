"""Per-task loggers and metric children, looked up once per task instead of once per run: the
worker starts and ends thousands of runs a second, and ``logging.getLogger`` and
``prometheus_client``'s ``labels`` each take a lock and build a key on every call."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram

from onbeat.metrics import Metrics

__all__ = ["TaskInstruments"]


class TaskInstruments:
    """The ``onbeat.task.<name>`` logger, the run-duration histogram and the outcome counters
    of each task a worker runs (the same objects the lookups return, kept)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._loggers: dict[str, logging.Logger] = {}
        self._durations: dict[str, Histogram] = {}
        self._outcomes: dict[tuple[str, str], Counter] = {}

    def logger(self, task: str) -> logging.Logger:
        logger = self._loggers.get(task)
        if logger is None:
            logger = self._loggers[task] = logging.getLogger(f"onbeat.task.{task}")
        return logger

    def run_duration(self, task: str) -> Histogram:
        histogram = self._durations.get(task)
        if histogram is None:
            histogram = self._durations[task] = self._metrics.run_duration.labels(task)
        return histogram

    def outcomes(self, task: str, outcome: str) -> Counter:
        """``onbeat_executions{task, outcome}``."""
        counter = self._outcomes.get((task, outcome))
        if counter is None:
            counter = self._outcomes[task, outcome] = self._metrics.executions.labels(task, outcome)
        return counter
