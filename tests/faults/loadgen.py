"""The load generator: one-shot jobs through ``POST /jobs/batch`` at a steady pace and a few
every-second cron jobs, with every acknowledged (2xx) create appended to an *ack log* as it is
answered (Jepsen's acknowledged writes); the checker proves each one exists afterwards."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.faults.fleet import ApiCalls, MakeBody
from tests.faults.oracle import JobKind, SubmittedJob


@dataclass(frozen=True, slots=True)
class Special:
    """``count`` once jobs of a task of the ledger app's other than ``work``, submitted with the
    first batch, each due U(``due_within``) seconds later."""

    task: str
    params: dict[str, Any]
    count: int
    due_within: tuple[float, float]
    policy: str | None = None
    """See ``SubmittedJob.policy``."""


@dataclass(frozen=True, slots=True)
class Workload:
    batches: int
    """``POST /jobs/batch`` requests of one-shot jobs, ``pace`` seconds apart."""
    batch: int
    pace: float
    due_within: tuple[float, float]
    """A one-shot job falls due this many seconds after it is submitted."""
    crons: int
    """Every-second cron jobs, cancelled when the load ends."""
    short_task: tuple[float, float] = (0.001, 0.2)
    long_task: tuple[float, float] = (2.0, 5.0)
    long_share: float = 0.02
    specials: tuple[Special, ...] = ()
    schedules: tuple[tuple[str, int], ...] = ()
    """More cron jobs, as (expression of ``oracle.CRON_PERIODS``, count), cancelled with the rest."""
    keyed: bool = False
    """Each batch carries an ``Idempotency-Key`` and is sent again when its connection is cut (a
    long load meets keep-alive connections the API closes as they are reused), not given up."""
    due_at_next: float | None = None
    """If set, every one-shot falls due at one instant instead: the first multiple of this many
    seconds of Unix time at least ``due_within[0]`` after the load generator is made."""


class AckLog:
    """Append-only JSON lines, one ``write()`` each: what the API acknowledged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def record(self, answer: dict[str, Any], kind: JobKind, **extra: Any) -> None:
        line = {"id": answer["id"], "kind": kind, "created_at": answer["created_at"], **extra}
        with self._lock:
            os.write(self._fd, (json.dumps(line) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read_acks(path: Path) -> list[SubmittedJob]:
    """The acknowledged jobs; a cron job's last line (its cancel) wins."""
    jobs: dict[str, SubmittedJob] = {}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        at = line.get("at")
        cancelled = line.get("cancelled_at")
        jobs[line["id"]] = SubmittedJob(
            line["id"],
            line["kind"],
            datetime.fromisoformat(line["created_at"]),
            datetime.fromisoformat(at) if at else None,
            datetime.fromisoformat(cancelled) if cancelled else None,
            line.get("policy"),
            line.get("expression", "* * * * * *"),
        )
    return list(jobs.values())


class LoadGenerator:
    """Submits ``workload`` (seeded) to ``api_url``, logging acknowledgements to ``acks``."""

    def __init__(self, api_url: str, workload: Workload, seed: int, acks: AckLog) -> None:
        self.api_url, self.workload, self.acks = api_url, workload, acks
        rng = random.Random(seed)
        self.due_at: datetime | None = None
        if workload.due_at_next is not None:
            step = workload.due_at_next
            self.due_at = datetime.fromtimestamp(
                math.ceil((time.time() + workload.due_within[0]) / step) * step, UTC
            )
        batches: list[tuple[str, MakeBody]] = []
        for _ in range(workload.batches):
            jobs = [
                (rng.uniform(*workload.due_within), self._duration(rng))
                for _ in range(workload.batch)
            ]
            batches.append(("/jobs/batch", functools.partial(_once_batch, jobs, self.due_at)))
        self.submission = ApiCalls(
            api_url,
            "POST",
            batches,
            pace=workload.pace,
            idempotent=workload.keyed,
            key_prefix=f"load-{seed}-{time.time_ns()}-" if workload.keyed else "",
            on_answer=self._ack,
        )
        self.cron_answers: list[dict[str, Any]] = []
        self._expressions: dict[str, str] = {}
        """Cron job id -> its expression."""
        self._thread = threading.Thread(target=self._submit, name="load", daemon=True)

    def _duration(self, rng: random.Random) -> float:
        w = self.workload
        return rng.uniform(*(w.long_task if rng.random() < w.long_share else w.short_task))

    def _ack(self, _index: int, answer: dict[str, Any]) -> None:
        for job in answer["items"]:
            self.acks.record(job, "once", at=job["schedule"]["at"])

    def start(self) -> None:
        crons = [("* * * * * *", self.workload.crons), *self.workload.schedules]
        for expression, count in crons:
            cron = {
                "task": "work_sync",
                "schedule": {"type": "cron", "expression": expression},
                "overlap": "allow",  # a run held by a killed worker must not skip the next ones
            }
            chunks = [min(CRON_BATCH, count - i) for i in range(0, count, CRON_BATCH)]
            requests = [("/jobs/batch", functools.partial(_jobs, cron, n)) for n in chunks]
            for answer in ApiCalls(self.api_url, "POST", requests).run().answers:
                for job in answer["items"]:
                    self.cron_answers.append(job)
                    self._expressions[job["id"]] = expression
                    self.acks.record(job, "cron", expression=expression)
        self._submit_specials()
        self._thread.start()

    def _submit_specials(self) -> None:
        rng = random.Random(len(self.workload.specials))
        for special in self.workload.specials:
            now = datetime.now(UTC)
            body = {
                "jobs": [
                    {
                        "task": special.task,
                        "params": special.params,
                        "schedule": {
                            "type": "once",
                            "at": _at(now, rng.uniform(*special.due_within)),
                        },
                    }
                    for _ in range(special.count)
                ]
            }
            answer = ApiCalls(
                self.api_url, "POST", [("/jobs/batch", functools.partial(dict, body))]
            ).run()
            for job in answer.answers[0]["items"]:
                self.acks.record(job, "once", at=job["schedule"]["at"], policy=special.policy)

    def _submit(self) -> None:
        with contextlib.suppress(BaseException):
            self.submission.run()

    def check(self) -> None:
        """Raise the error that stopped the submission, if one did: the scenario is void then,
        and an hour-long one should not run on without its load."""
        if self.submission.error is not None:
            raise self.submission.error

    def stop_submitting(self) -> None:
        self.submission.abort()
        self._thread.join()
        self.check()

    def cancel_crons(self, cancel_phase: float) -> None:
        """Cancel the cron jobs ``cancel_phase`` into the next second (the runs of that second
        have had that long to start) and log each cancel instant."""
        if not self.cron_answers:
            return
        time.sleep(max(0.0, math.ceil(time.time()) + cancel_phase - time.time()))
        deletes = [(f"/jobs/{j['id']}", lambda: None) for j in self.cron_answers]
        cancels = ApiCalls(self.api_url, "DELETE", deletes, ok=200).run()
        for job, cancelled in zip(self.cron_answers, cancels.answers, strict=True):
            self.acks.record(
                job,
                "cron",
                cancelled_at=cancelled["updated_at"],
                expression=self._expressions[job["id"]],
            )


CRON_BATCH = 250
"""Cron jobs per ``POST /jobs/batch`` (the API takes up to 1,000)."""


def _jobs(job: dict[str, Any], count: int) -> dict[str, Any]:
    return {"jobs": [job] * count}


def _once_batch(jobs: list[tuple[float, float]], due_at: datetime | None) -> dict[str, Any]:
    """Once jobs due ``delay`` from now (or all at ``due_at``), lasting ``duration``."""
    now = datetime.now(UTC)
    return {
        "jobs": [
            {
                "task": "work",
                "params": {"duration": duration},
                "schedule": {
                    "type": "once",
                    "at": due_at.isoformat() if due_at else _at(now, delay),
                },
            }
            for delay, duration in jobs
        ]
    }


def _at(now: datetime, delay: float) -> str:
    return (now + timedelta(seconds=delay)).isoformat()
