"""Store contract, alert outbox: a dead letter or a skip writes its alert in the same commit;
senders claim alerts under a hold, forget them once delivered and retry the others.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

from datetime import timedelta

from onbeat.model import ExecutionStatus, MisfirePolicy, RetryPolicy
from onbeat.store.base import Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    RUN_TTL,
    StoreFactory,
    _dispatch,
    _failed,
    _misfired,
    _new,
    _reap,
    _runs,
    _start,
)

__all__ = ["AlertContract"]

HOLD = 60.0


class AlertContract:
    """``alert_claim``, ``alert_done``, ``alert_retry`` and the writes that raise alerts."""

    def test_alert__a_dead_letter_writes_one_alert(self, store: Store, clock: FakeClock) -> None:
        assert store.alert_claim(10, HOLD) == []
        run = _start(store, _new(tenant="acme", retry=RetryPolicy(max_attempts=1)))
        store.execution_finish_many([_failed(run, "it broke")])
        [alert] = store.alert_claim(10, HOLD)
        assert (alert.kind, alert.job_id, alert.tenant, alert.task) == (
            "dead_letter",
            run.execution.job_id,
            "acme",
            "tasks.noop",
        )
        assert alert.payload == {
            "execution_id": run.execution.id,
            "attempts": 1,
            "error": "it broke",
        }
        assert alert.created_at == clock.now()
        assert alert.attempts == 1

    def test_alert__a_failed_attempt_that_retries_writes_none(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=2)))
        store.execution_finish_many([_failed(run, retry_in=5)])
        assert store.alert_claim(10, HOLD) == []

    def test_alert__a_reaped_last_attempt_writes_its_dead_letter_alert(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        clock.advance(RUN_TTL + 1)
        [reaped] = _reap(store)
        assert reaped.status is ExecutionStatus.FAILED
        [alert] = store.alert_claim(10, HOLD)
        assert alert.kind == "dead_letter"
        assert alert.payload["execution_id"] == run.execution.id
        assert "lease expired" in alert.payload["error"]

    def test_alert__skipped_fire_times_are_one_alert_per_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = _misfired(store, clock, MisfirePolicy.SKIP)
        _dispatch(store)
        skipped = [r for r in _runs(store, job.id) if r.status is ExecutionStatus.SKIPPED]
        assert skipped
        alerts = store.alert_claim(10, HOLD)
        assert {(a.kind, a.job_id) for a in alerts} == {("skipped", job.id)}
        assert len(alerts) <= 2  # one per batch of skips (the late head, the fire times after it)
        listed = [r for a in alerts for r in a.payload["runs"]]
        assert sum(a.payload["count"] for a in alerts) == len(skipped)
        assert sorted(r["execution_id"] for r in listed) == sorted(r.id for r in skipped)
        assert all(r["reason"] for r in listed)

    def test_alert_claim__holds_until_the_hold_ends_then_counts_another_attempt(
        self, store: Store, clock: FakeClock
    ) -> None:
        run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
        store.execution_finish_many([_failed(run)])
        [first] = store.alert_claim(10, HOLD)
        clock.advance(HOLD - 1)
        assert store.alert_claim(10, HOLD) == []  # a sender holds it
        clock.advance(1)
        [again] = store.alert_claim(10, HOLD)  # that sender died: another sends it
        assert again.id == first.id
        assert again.attempts == 2

    def test_alert_retry_and_done(self, store: Store, clock: FakeClock) -> None:
        for _ in range(2):
            run = _start(store, _new(retry=RetryPolicy(max_attempts=1)))
            store.execution_finish_many([_failed(run)])
        first, second = store.alert_claim(10, HOLD)
        store.alert_done([first.id])
        store.alert_retry({second.id: (clock.now() + timedelta(seconds=5), "HTTP 503")})
        clock.advance(4)
        assert store.alert_claim(10, HOLD) == []
        clock.advance(1)
        assert [a.id for a in store.alert_claim(10, HOLD)] == [second.id]
        store.alert_done([second.id, first.id])  # forgetting twice is harmless
        clock.advance(HOLD)
        assert store.alert_claim(10, HOLD) == []

    def test_alert_claim__two_senders_never_hold_one_alert(
        self, store_factory: StoreFactory, tmp_path: object, clock: FakeClock
    ) -> None:
        with store_factory(tmp_path, clock) as open_store:  # type: ignore[arg-type]
            a, b = open_store(), open_store()
            for _ in range(5):
                run = _start(a, _new(retry=RetryPolicy(max_attempts=1)))
                a.execution_finish_many([_failed(run)])
            took_a = {x.id for x in a.alert_claim(3, HOLD)}
            took_b = {x.id for x in b.alert_claim(10, HOLD)}
            assert len(took_a) == 3
            assert len(took_b) == 2
            assert not took_a & took_b

    def test_on_skipped__told_the_skips_by_cause_after_commit(
        self, store: Store, clock: FakeClock
    ) -> None:
        told: list[dict[str, int]] = []
        store.on_skipped = lambda skips: told.append(dict(skips))
        job = _misfired(store, clock, MisfirePolicy.SKIP)
        _dispatch(store)
        skipped = [r for r in _runs(store, job.id) if r.status is ExecutionStatus.SKIPPED]
        assert told == [{"misfire": len(skipped)}]  # one report for the one transaction
        store.job_pause(job.id)
        clock.advance(3 * 3600)
        store.job_resume(job.id, misfire_grace=60)
        assert told[1:] and set(told[1]) == {"paused"}
