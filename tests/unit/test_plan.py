"""The pure decisions of plan.py about the end of an attempt (the store applies them)."""

from __future__ import annotations

from onbeat.model import ExecutionStatus, RetryPolicy
from onbeat.plan import plan_finish, plan_reap


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
