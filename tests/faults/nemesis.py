"""The seeded nemesis: injects faults on a timeline drawn from the seed up front, and writes down
what it did (``timeline.json``), including the runs the victim held when it was hit, which is what
the checker bounds duplicates by.

Process faults hit a supervised process by slot: ``kill -9``, ``kill -STOP`` (``kill -CONT``
``lasts`` seconds later) and ``kill -TERM`` (a graceful stop; the supervisor restarts it).
Service faults (Redis, PostgreSQL) are named actions the scenario hands in: each does its fault,
waits ``lasts`` if it has a duration, undoes it, and returns when it is over."""

from __future__ import annotations

import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.faults.supervisor import Supervisor

PROCESS_FAULTS = {
    "kill -9": signal.SIGKILL,
    "kill -STOP": signal.SIGSTOP,
    "kill -TERM": signal.SIGTERM,
}


@dataclass(frozen=True, slots=True)
class PlannedFault:
    offset: float
    """Seconds after the nemesis starts."""
    kind: str
    """A key of ``PROCESS_FAULTS``, or the name of one of the scenario's service faults."""
    slot: int = -1
    """The supervised victim of a process fault."""
    lasts: float = 0.0
    """How long a pause, lock or outage lasts."""


HELD_AGAIN = 1.0
"""Seconds after a process fault's signal that the victim's runs are looked at again."""


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
    ended: float | None = None
    """Wall time the fault was undone (``kill -CONT``, lock released, server back); None: at once."""
    shard_changes: int | None = None
    """Shard lease takeovers (``shard_leases.epoch`` increments) from the fault until its
    effects had settled (S7's clock faults); None: not measured."""
    recovered: float | None = None
    """Wall time the recovery a fault's scenario measures completed (S4: the victim's shards
    taken over; S5/S6: the queue rebuilt, the store back); None: not measured, or never."""
    shards: list[int] = field(default_factory=list)
    """Shards the victim held when it was hit (a scheduler fault)."""
    exit_code: int | None = None
    """The victim's exit status, if it died (0: a ``kill -TERM``'s victim stopped gracefully)."""

    @property
    def kills(self) -> bool:
        """The victim process is gone: what it held can only be finished by another."""
        return self.fault in ("kill -9", "kill -TERM")


def random_plan(
    seed: int,
    kind: str,
    slots: Sequence[int],
    interval: tuple[float, float],
    duration: float,
    limit: int = 1000,
    lasts: float = 0.0,
) -> list[PlannedFault]:
    """``kind`` to a random one of ``slots`` every U(``interval``) seconds within ``duration``."""
    return mixed_plan(seed, [(kind, lasts)], slots, interval, duration, limit)


def mixed_plan(
    seed: int,
    kinds: Sequence[tuple[str, float]],
    slots: Sequence[int],
    interval: tuple[float, float],
    duration: float,
    limit: int = 1000,
) -> list[PlannedFault]:
    """A random one of ``kinds`` (kind, lasts) to a random one of ``slots`` every
    U(``interval``) seconds within ``duration``: Jepsen's combined nemesis."""
    rng = random.Random(seed)
    plan: list[PlannedFault] = []
    at = rng.uniform(*interval)
    while at < duration and len(plan) < limit:
        kind, lasts = kinds[0] if len(kinds) == 1 else rng.choice(kinds)
        plan.append(PlannedFault(at, kind, rng.choice(slots), lasts))
        at += rng.uniform(*interval)
    return plan


def combined_plan(
    seed: int,
    process_kinds: Sequence[tuple[str, float]],
    service_kinds: Sequence[tuple[str, float]],
    slots: Sequence[int],
    interval: tuple[float, float],
    duration: float,
) -> list[PlannedFault]:
    """Process faults (kind, lasts) on a random one of ``slots`` and service faults (kind,
    lasts), half and half at random, one after the other: each starts U(``interval``) seconds
    after the previous one's ``lasts`` ran out, so no fault lands inside another's outage or the
    recovery that follows it (a lease TTL, the reaper's hold-off after a server start, a queue
    rebuild), which the checker's per-fault bounds and attribution assume."""
    rng = random.Random(seed)
    plan: list[PlannedFault] = []
    at = rng.uniform(*interval)
    while at < duration:
        if rng.random() < 0.5:
            kind, lasts = rng.choice(process_kinds)
            plan.append(PlannedFault(at, kind, rng.choice(slots), lasts))
        else:
            kind, lasts = rng.choice(service_kinds)
            plan.append(PlannedFault(at, kind, lasts=lasts))
        at += lasts + rng.uniform(*interval)
    return plan


ServiceFault = Callable[[PlannedFault], FaultEvent]
"""Does a service fault (and undoes it, after ``lasts``), returning what it did."""


class Nemesis:
    """Carries out a plan in a thread, one fault after the other; ``held(pid)`` says what a
    victim process held; ``services`` are the scenario's service faults by name."""

    def __init__(
        self,
        supervisor: Supervisor,
        plan: list[PlannedFault],
        held: Callable[[int], set[str]],
        services: dict[str, ServiceFault] | None = None,
    ) -> None:
        self.supervisor, self.plan, self.held = supervisor, plan, held
        self.services = services or {}
        unknown = {f.kind for f in plan} - PROCESS_FAULTS.keys() - self.services.keys()
        assert not unknown, f"no way to inject {unknown}"
        self.timeline: list[FaultEvent] = []
        self.errors: list[str] = []
        """Faults whose injection failed in the harness (a query before a Redis fault timed
        out): the plan goes on without them, and the report fails on them."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Inject nothing more; a fault under way is finished (a paused process continued)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def write(self, path: Path) -> None:
        path.write_text(json.dumps([asdict(e) for e in self.timeline], indent=1) + "\n")

    def _run(self) -> None:
        for fault in self.plan:
            if self._stop.wait(max(0.0, self._began + fault.offset - time.monotonic())):
                return
            try:
                event = (
                    self.services[fault.kind](fault)
                    if fault.kind in self.services
                    else self._hit_process(fault)
                )
            except Exception as exc:  # the harness's own call failed: go on with the plan
                self.errors.append(f"{time.strftime('%H:%M:%S')} {fault.kind}: {exc!r}")
                print(f"nemesis: {fault.kind} not injected as planned: {exc!r}", file=sys.stderr)
                continue
            if event is not None:
                self.timeline.append(event)

    def _hit_process(self, fault: PlannedFault) -> FaultEvent | None:
        proc = self.supervisor.proc(fault.slot)
        if proc.process.poll() is not None:
            return None  # still down from an earlier fault: nothing to hit
        event = FaultEvent(
            fault.kind, proc.role, fault.slot, proc.pid, time.time(), time.monotonic_ns()
        )
        proc.process.send_signal(PROCESS_FAULTS[fault.kind])
        sent = time.monotonic()
        if fault.kind == "kill -9":
            proc.process.wait()
        held = self.held(proc.pid)
        # Once more: a claim the server was committing for the victim when the signal came is
        # the victim's too (N1's first look missed runs claimed so, then started on kill -CONT).
        # Nothing is reaped that soon: a lease outlives HELD_AGAIN.
        self._stop.wait(max(0.0, sent + HELD_AGAIN - time.monotonic()))
        event.held = sorted(held | self.held(proc.pid))
        if fault.kind == "kill -STOP":
            # ``lasts`` from the signal, however long ``held`` took; a stop() cuts the pause
            # short: never leave it frozen.
            self._stop.wait(max(0.0, sent + fault.lasts - time.monotonic()))
            proc.process.send_signal(signal.SIGCONT)
            event.ended = time.time()
        return event
