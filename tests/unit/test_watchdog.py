"""The watchdog tells a blocked event loop (one task holds it) from a busy one (many short
steps): only a block makes the worker hand back the runs it claimed. Scripted: the loop's
current task at each of the watchdog's looks, no real stall needed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from onbeat.worker.watchdog import LoopWatchdog


@dataclass(frozen=True)
class FakeTask:
    name: str

    def get_name(self) -> str:
        return self.name


class Looks:
    """Stands for the ping's event: each ``wait`` is one look of the watchdog; the loop answers
    after the last scripted one."""

    def __init__(self, holders: list[FakeTask | None]) -> None:
        self.holders = holders
        self.looks = 0

    def current_task(self, _loop: object) -> FakeTask | None:
        return self.holders[min(self.looks, len(self.holders) - 1)]

    def wait(self, _timeout: float) -> bool:
        self.looks += 1
        return self.looks >= len(self.holders)


HOG, A, B, C = FakeTask("onbeat-run-hog"), FakeTask("a"), FakeTask("b"), FakeTask("c")


@pytest.mark.parametrize(
    ("holders", "hand_backs"),
    [
        ([HOG, HOG, HOG, HOG], 3),  # one task held it at every look after the first
        ([A, B, C, None, A, B], 0),  # busy: a burst of short steps, never one task twice
        ([A, B, HOG, HOG], 1),  # busy, then blocked
    ],
    ids=["blocked", "busy", "busy-then-blocked"],
)
def test_watchdog__hands_back_only_while_one_task_holds_the_loop(
    monkeypatch: pytest.MonkeyPatch, holders: list[FakeTask | None], hand_backs: int
) -> None:
    looks = Looks(holders)
    monkeypatch.setattr("onbeat.worker.watchdog.asyncio.current_task", looks.current_task)
    stalls: list[int] = []
    calls: list[int] = []
    dog = LoopWatchdog(1.0, lambda eid: eid, lambda: stalls.append(1), lambda: calls.append(1))
    dog._loop = object()  # type: ignore[assignment]
    dog._stalled(looks, sent=0.0)  # type: ignore[arg-type]
    assert (len(stalls), len(calls)) == (1, hand_backs)


@pytest.mark.parametrize(
    ("holder", "hand_backs"),
    [(HOG, 3), (A, 0)],
    ids=["a-run-hands-back-at-once", "another-task-waits-for-the-threshold"],
)
def test_watchdog__a_runs_task_holding_the_loop_hands_back_before_the_warning(
    monkeypatch: pytest.MonkeyPatch, holder: FakeTask, hand_backs: int
) -> None:
    """Task code that blocks is handed back for from ``HAND_BACK_AFTER``, so the runs behind it
    start elsewhere well within a second; onbeat's own steps are short and get the threshold."""
    looks = Looks([holder] * 4)
    monkeypatch.setattr("onbeat.worker.watchdog.asyncio.current_task", looks.current_task)
    stalls: list[int] = []
    calls: list[int] = []
    dog = LoopWatchdog(1.0, lambda eid: eid, lambda: stalls.append(1), lambda: calls.append(1))
    dog._loop = object()  # type: ignore[assignment]
    dog._stalled(looks, sent=time.monotonic())  # type: ignore[arg-type]
    assert (len(stalls), len(calls)) == (0, hand_backs)  # the looks take no time: no warning
