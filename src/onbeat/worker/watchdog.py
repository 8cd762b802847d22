"""The event-loop watchdog: notices when the loop stops answering and names what holds it.

An ``async def`` task that blocks the loop (``time.sleep``, a CPU loop, a sync HTTP client) stalls
every other async run, the claim loop and the API of the process. The heartbeat has its own
thread, so leases survive it; but the culprit should be found. This thread pings the loop every
``HAND_BACK_AFTER / 2``; when a ping goes unanswered longer than the threshold, it logs a warning
naming the asyncio task running at that moment (a run's task is named ``onbeat-run-<execution
id>``), keeps noting who holds the loop until it answers, then logs how long the stall lasted.
Meanwhile the worker hands back the runs it claimed that the loop cannot start (``while_stalled``):
they start elsewhere instead of waiting for the task that blocks. A run's task seen holding the
loop at two looks is task code blocking: the hand-back begins ``HAND_BACK_AFTER`` into the block,
long before the warning, so the runs behind it start within about half a second elsewhere; any
other one task holding it that way is handed back for once the threshold passed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("onbeat.worker")

RUN_TASK_PREFIX = "onbeat-run-"
HAND_BACK_AFTER = 0.25
"""Seconds a ping goes unanswered before the watchdog looks who holds the loop, to hand back the
runs a blocking run's task keeps from starting (the precision a run's start is promised)."""


class LoopWatchdog:
    """``describe_run(execution_id)`` says what a run is (called from the watchdog thread);
    ``on_stall()`` is called once per stall (the loop unanswered for ``threshold``), and
    ``while_stalled()`` at each look while one asyncio task has held the loop since the last one
    (a run's task from ``HAND_BACK_AFTER`` on, any other task once ``threshold`` passed: the
    worker hands back the runs the loop cannot start), both from the watchdog thread."""

    def __init__(
        self,
        threshold: float,
        describe_run: Callable[[str], str],
        on_stall: Callable[[], None],
        while_stalled: Callable[[], None] = lambda: None,
    ) -> None:
        self._threshold = threshold
        self._hand_back_after = min(HAND_BACK_AFTER, threshold)
        self._tick = self._hand_back_after / 2
        """Between pings of a loop that answers, and between looks at one that does not."""
        self._describe_run = describe_run
        self._on_stall = on_stall
        self._while_stalled = while_stalled
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="onbeat-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop; it is a daemon, nothing waits for it."""
        self._stopping.set()

    def _run(self) -> None:
        assert self._loop is not None
        while not self._stopping.wait(self._tick):
            answered = threading.Event()
            sent = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed
                return
            if answered.wait(self._hand_back_after):
                continue
            try:
                self._stalled(answered, sent)
            except Exception:
                log.exception("event-loop watchdog failed; it goes on watching")

    def _stalled(self, answered: threading.Event, sent: float) -> None:
        """The ping sent at ``sent`` went unanswered for ``HAND_BACK_AFTER``: look until the loop
        answers, hand back while one task holds it, warn once the threshold passed."""
        assert self._loop is not None
        holders = [self._holder()]
        previous = asyncio.current_task(self._loop)
        warned = False
        while not answered.wait(self._tick):
            if self._stopping.is_set():
                return
            past_threshold = time.monotonic() - sent >= self._threshold
            if past_threshold and not warned:
                warned = True
                log.warning(
                    "event loop blocked for over %.1fs by %s: async tasks must not block "
                    "(await, or make the task sync so it runs in the pool)",
                    self._threshold,
                    holders[-1],
                )
                self._on_stall()
            current = asyncio.current_task(self._loop)
            if (
                current is not None
                and current is previous
                and (past_threshold or current.get_name().startswith(RUN_TASK_PREFIX))
            ):
                # One task still holds it: a block. A loop busy with many short steps (a burst
                # of runs starting) shows other tasks, or none, from one look to the next.
                self._while_stalled()
            previous = current
            holder = self._holder()
            if holder not in holders:
                holders.append(holder)
        if warned:
            log.warning(
                "event loop answered again after %.1fs; blocked by %s",
                time.monotonic() - sent,
                ", then ".join(holders),
            )

    def _holder(self) -> str:
        """What the loop is running now (read from this thread: the loop is stuck in it)."""
        assert self._loop is not None
        task = asyncio.current_task(self._loop)
        if task is None:
            return "a callback outside any asyncio task"
        name = task.get_name()
        if name.startswith(RUN_TASK_PREFIX):
            return self._describe_run(name.removeprefix(RUN_TASK_PREFIX))
        return f"asyncio task {name!r}"
