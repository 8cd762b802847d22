"""The pure decisions of plan.py about the end of an attempt (the store applies them)."""

from __future__ import annotations

import os
import threading

from onbeat.model import ExecutionStatus, RetryPolicy
from onbeat.plan import new_id, new_ids, plan_finish, plan_reap


def test_plan_finish__each_way_an_attempt_ends() -> None:
    def end(**kw: object) -> tuple[ExecutionStatus, float | None, bool]:
        args: dict[str, object] = {
            "succeeded": False,
            "released": False,
            "job_cancelled": False,
            "attempt": 2,
            "retry_in": None,
        }
        verdict = plan_finish(**(args | kw))  # type: ignore[arg-type]
        return verdict.status, verdict.due_in, verdict.uncount

    assert end(succeeded=True, job_cancelled=True) == (ExecutionStatus.SUCCEEDED, None, False)
    assert end(released=True, job_cancelled=True) == (ExecutionStatus.SCHEDULED, 0.0, True)
    assert end(job_cancelled=True, retry_in=5.0) == (ExecutionStatus.CANCELLED, None, False)
    assert end(retry_in=5.0) == (ExecutionStatus.SCHEDULED, 5.0, False)
    assert end() == (ExecutionStatus.FAILED, None, False)


def test_plan_reap__a_lost_attempt_counts() -> None:
    retry = RetryPolicy(max_attempts=3, backoff_base=1.0, backoff_cap=4.0)
    again = plan_reap(job_cancelled=False, attempt=2, retry=retry)
    assert again.status is ExecutionStatus.QUEUED
    assert again.due_in is not None and 0 <= again.due_in <= 4.0
    assert again.reason == "retry after attempt 2 was lost"
    assert plan_reap(job_cancelled=False, attempt=3, retry=retry).status is ExecutionStatus.FAILED
    cancelled = plan_reap(job_cancelled=True, attempt=1, retry=retry)
    assert cancelled.status is ExecutionStatus.CANCELLED


def test_skip_cause__names_the_policy_that_skipped() -> None:
    from onbeat.plan import PAUSED_AT_FIRE_TIME, skip_cause

    assert skip_cause("misfire (skip): 3600 s late") == "misfire"
    assert skip_cause("overlap=skip: execution x of this job was still running") == "overlap"
    assert skip_cause(PAUSED_AT_FIRE_TIME) == "paused"
    assert skip_cause("skipped") == "other"


def test_new_id__sorts_by_creation_and_never_repeats_in_one_process() -> None:
    ids = [new_id() for _ in range(5_000)]  # more than one pool of random bytes
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert len({i[12:] for i in ids}) == len(ids)


def test_new_ids__a_batch_sorts_with_the_ids_made_around_it_from_many_threads() -> None:
    """A batch's ids are those of as many new_id calls in a row: after every id made before
    it, before every id made after it, none repeated, even while other threads make theirs."""
    made: list[list[str]] = []

    def make() -> None:
        made.extend([new_id(), *new_ids(7), new_id()] for _ in range(200))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(run == sorted(run) and len(run) == 9 for run in made)
    every = [i for run in made for i in run]
    assert len(set(every)) == len(every)
    assert new_ids(0) == []


def test_new_id__a_forked_child_and_its_parent_make_different_ids() -> None:
    """The child starts with the parent's last id and random bytes in memory: counting up from
    the one, or reading the other, it would make the very ids the parent makes next."""
    new_id()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(write_end, ",".join(new_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    parents = {new_id() for _ in range(100)}
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as pipe:
        childs = set(pipe.read().decode().split(","))
    assert len(childs) == 100
    assert not {i[12:] for i in parents} & {i[12:] for i in childs}
