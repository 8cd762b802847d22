"""The seeded nemesis: injects faults on a timeline drawn from the seed up front, and writes down
what it did (``timeline.json``), including the runs the victim held when it was hit, which is what
the checker bounds duplicates by."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.faults.supervisor import Supervisor


@dataclass(frozen=True, slots=True)
class PlannedFault:
    offset: float
    """Seconds after the nemesis starts."""
    slot: int


@dataclass(slots=True)
class FaultEvent:
    fault: str
    role: str
    slot: int
    pid: int
    wall: float
    mono_ns: int
    held: list[str] = field(default_factory=list)
    """Runs the victim held when it was hit (store's ``running`` rows and the ledger's starts without an end)."""


def kill_plan(
    seed: int, slots: list[int], interval: tuple[float, float], duration: float, limit: int = 1000
) -> list[PlannedFault]:
    """``kill -9`` a random one of ``slots`` every U(``interval``) seconds within ``duration``."""
    rng = random.Random(seed)
    plan: list[PlannedFault] = []
    at = rng.uniform(*interval)
    while at < duration and len(plan) < limit:
        plan.append(PlannedFault(at, rng.choice(slots)))
        at += rng.uniform(*interval)
    return plan


class Nemesis:
    """Carries out a plan of ``kill -9`` in a thread; ``held(pid)`` says what the victim held."""

    def __init__(
        self,
        supervisor: Supervisor,
        plan: list[PlannedFault],
        held: Callable[[int], set[str]],
    ) -> None:
        self.supervisor, self.plan, self.held = supervisor, plan, held
        self.timeline: list[FaultEvent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def write(self, path: Path) -> None:
        path.write_text(json.dumps([asdict(e) for e in self.timeline], indent=1) + "\n")

    def _run(self) -> None:
        for fault in self.plan:
            if self._stop.wait(max(0.0, self._began + fault.offset - time.monotonic())):
                return
            proc = self.supervisor.proc(fault.slot)
            if proc.process.poll() is not None:
                continue  # still down from the previous kill: nothing to hit
            event = FaultEvent(
                "kill -9", proc.role, fault.slot, proc.pid, time.time(), time.monotonic_ns()
            )
            proc.process.send_signal(signal.SIGKILL)
            proc.process.wait()
            event.held = sorted(self.held(proc.pid))
            self.timeline.append(event)
