"""GroupCommit: callers at once share a write, and each sees what a write of its own gave."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from onbeat.errors import StoreUnavailableError, ValidationError
from onbeat.group_commit import GroupCommit
from tests.faults.process import wait_until

WAIT = 10.0
"""Seconds a test waits for a thread to reach a point before it fails."""


class GatedWrite:
    """A ``write`` that records each batch and holds its first call until ``release``: callers
    that arrive meanwhile wait for the next batch. ``bad`` items raise ``ValidationError``."""

    def __init__(self, bad: frozenset[str] = frozenset(), gone: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._bad, self._gone = bad, gone

    def __call__(self, items: Sequence[str]) -> list[str]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(WAIT)
        if self._gone:
            raise StoreUnavailableError("PostgreSQL: connection refused")
        if self._bad & set(items):
            raise ValidationError("Idempotency-Key", f"{sorted(self._bad & set(items))} reused")
        return [f"stored {item}" for item in items]


def _first_then_others(
    write: GatedWrite, commit: GroupCommit[str, str], others: list[str]
) -> tuple[Future[str], list[Future[str]]]:
    """``first`` is written alone and held; ``others`` arrive while it is written."""
    pool = ThreadPoolExecutor(len(others) + 1)
    first = pool.submit(commit.submit, "first")
    assert write.entered.wait(WAIT)
    later = [pool.submit(commit.submit, item) for item in others]
    wait_until(lambda: len(commit._waiting) == len(others), WAIT, "the others to queue")
    write.release.set()
    pool.shutdown(wait=True)
    return first, later


def test_a_caller_alone_is_written_at_once_alone() -> None:
    write = GatedWrite()
    write.release.set()
    commit = GroupCommit(write)
    assert commit.submit("a") == "stored a"
    assert commit.submit("b") == "stored b"
    assert write.batches == [["a"], ["b"]]


def test_callers_arriving_during_a_write_share_the_next_one_in_order() -> None:
    write = GatedWrite()
    commit = GroupCommit(write)
    first, later = _first_then_others(write, commit, ["b", "c", "d"])
    assert first.result() == "stored first"
    assert [f.result() for f in later] == ["stored b", "stored c", "stored d"]
    assert write.batches[0] == ["first"]
    assert sorted(write.batches[1]) == ["b", "c", "d"]
    assert len(write.batches) == 2


def test_a_batch_holds_at_most_most_items() -> None:
    write = GatedWrite()
    commit = GroupCommit(write, most=2)
    _, later = _first_then_others(write, commit, ["b", "c", "d", "e", "f"])
    assert [f.result() for f in later] == [f"stored {x}" for x in "bcdef"]
    assert [len(batch) for batch in write.batches] == [1, 2, 2, 1]


def test_one_items_error_is_its_callers_only_and_the_others_are_stored() -> None:
    write = GatedWrite(bad=frozenset({"c"}))
    commit = GroupCommit(write)
    _, (b, c, d) = _first_then_others(write, commit, ["b", "c", "d"])
    assert (b.result(), d.result()) == ("stored b", "stored d")
    with pytest.raises(ValidationError, match="reused"):
        c.result()
    together, *alone = write.batches[1:]
    assert sorted(together) == ["b", "c", "d"]
    assert sorted(alone) == [["b"], ["c"], ["d"]]  # the shared write was rolled back


def test_the_store_gone_fails_every_caller_of_the_batch_and_writes_nothing_again() -> None:
    write = GatedWrite(gone=True)
    commit = GroupCommit(write)
    first, later = _first_then_others(write, commit, ["b", "c"])
    for future in [first, *later]:
        with pytest.raises(StoreUnavailableError):
            future.result()
    assert len(write.batches) == 2  # the held first, then b and c together: none retried alone


def test_a_keyboard_interrupt_reaches_every_caller_of_its_batch_and_the_next_still_write() -> None:
    calls: list[list[str]] = []

    def interrupted_once(items: Sequence[str]) -> list[str]:
        calls.append(list(items))
        if len(calls) == 1:
            raise KeyboardInterrupt
        return list(items)

    commit = GroupCommit(interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        commit.submit("a")
    assert commit.submit("b") == "b"  # the writing ended with the interrupted batch


async def _queued(commit: GroupCommit[str, str], count: int) -> None:
    """Until ``count`` callers wait (the loop runs the async ones meanwhile)."""
    queued = lambda: len(commit._waiting) >= count  # noqa: E731
    await asyncio.to_thread(wait_until, queued, WAIT, f"{count} callers to queue")


async def _async_during_a_held_write(
    write: GatedWrite, commit: GroupCommit[str, str], others: list[str], first: str = "first"
) -> tuple[asyncio.Future[str], list[asyncio.Task[str]]]:
    """``first`` is written by the writer thread (an async caller alone) and held; ``others``
    arrive on the loop while it is written."""
    held = asyncio.ensure_future(commit.submit_async(first))
    assert await asyncio.to_thread(write.entered.wait, WAIT)
    later = [asyncio.create_task(commit.submit_async(item)) for item in others]
    await _queued(commit, len(others))
    write.release.set()
    return held, later


async def test_async_callers_share_a_write_made_by_the_writer_thread() -> None:
    write = GatedWrite()
    commit = GroupCommit(write)
    first, later = await _async_during_a_held_write(write, commit, ["b", "c", "d"])
    assert await asyncio.wait_for(first, WAIT) == "stored first"
    assert await asyncio.wait_for(asyncio.gather(*later), WAIT) == [
        "stored b",
        "stored c",
        "stored d",
    ]
    assert write.batches == [["first"], ["b", "c", "d"]]
    assert commit._writer is not None and commit._writer.name == "onbeat-group-commit"
    assert not commit._writing


async def test_an_async_callers_error_is_its_own_and_the_others_are_stored() -> None:
    write = GatedWrite(bad=frozenset({"c"}))
    commit = GroupCommit(write)
    _, (b, c, d) = await _async_during_a_held_write(write, commit, ["b", "c", "d"])
    assert list(await asyncio.wait_for(asyncio.gather(b, d), WAIT)) == ["stored b", "stored d"]
    with pytest.raises(ValidationError, match="reused"):
        await asyncio.wait_for(c, WAIT)


async def test_the_lead_passes_between_thread_and_async_callers() -> None:
    """A thread's caller writes a batch with async callers in it, then an async caller at the
    head of those waiting hands the next to the writer thread, and back: each caller gets its
    own result and no batch is written twice."""
    write = GatedWrite()
    commit = GroupCommit(write, most=2)
    pool = ThreadPoolExecutor(2)
    loop = asyncio.get_running_loop()
    first = loop.run_in_executor(pool, commit.submit, "first")  # a thread leads
    assert await asyncio.to_thread(write.entered.wait, WAIT)
    a1 = asyncio.create_task(commit.submit_async("a1"))
    await _queued(commit, 1)
    t1 = loop.run_in_executor(pool, commit.submit, "t1")
    await _queued(commit, 2)
    a2 = asyncio.create_task(commit.submit_async("a2"))
    await _queued(commit, 3)
    write.release.set()
    results = list(await asyncio.wait_for(asyncio.gather(first, a1, t1, a2), WAIT))
    assert results == ["stored first", "stored a1", "stored t1", "stored a2"]
    assert write.batches == [["first"], ["a1", "t1"], ["a2"]]
    pool.shutdown(wait=True)


async def test_an_async_caller_that_stops_waiting_leaves_the_others_their_results() -> None:
    """A request that goes away (its task cancelled) is still written, as a thread's would be,
    and the callers sharing its batch get their results."""
    write = GatedWrite()
    commit = GroupCommit(write)
    _, (b, c) = await _async_during_a_held_write(write, commit, ["b", "c"])
    b.cancel()
    assert await asyncio.wait_for(c, WAIT) == "stored c"
    assert write.batches == [["first"], ["b", "c"]]
    assert await asyncio.wait_for(commit.submit_async("d"), WAIT) == "stored d"
