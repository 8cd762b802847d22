"""A tiny supervisor, like systemd or Kubernetes: a product process that dies is started again,
alike, ``restart_after`` seconds later. Processes are watched in *slots*, so the nemesis can name
its victims by slot and the same seed picks the same victims run after run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tests.faults.fleet import Fleet, Proc

RESTART_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class Restart:
    slot: int
    role: str
    died_pid: int
    new_pid: int
    died_at: float
    restarted_at: float
    returncode: int
    """The dead process's exit status (negative: the signal that ended it)."""


class Supervisor:
    """Watches ``slots`` of ``fleet`` from a thread of its own until ``stop``."""

    def __init__(self, fleet: Fleet, restart_after: float = RESTART_AFTER) -> None:
        self.fleet = fleet
        self.restart_after = restart_after
        self.slots: list[Proc] = []
        self.restarts: list[Restart] = []
        self._died_at: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def watch(self, proc: Proc) -> int:
        """Supervise ``proc``; returns its slot."""
        with self._lock:
            self.slots.append(proc)
            return len(self.slots) - 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Restart nothing more (the fleet is about to be stopped)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def slots_of(self, role: str) -> list[int]:
        return [slot for slot, proc in enumerate(self.slots) if proc.role == role]

    def proc(self, slot: int) -> Proc:
        with self._lock:
            return self.slots[slot]

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            for slot, proc in enumerate(list(self.slots)):
                if proc.process.poll() is None:
                    continue
                died_at = self._died_at.setdefault(proc.pid, time.time())
                if time.time() < died_at + self.restart_after or self._stop.is_set():
                    continue
                new = self.fleet.start(proc.role, *proc.args, env=proc.env)
                with self._lock:
                    self.slots[slot] = new
                self.restarts.append(
                    Restart(
                        slot,
                        proc.role,
                        proc.pid,
                        new.pid,
                        died_at,
                        time.time(),
                        proc.process.returncode,
                    )
                )
