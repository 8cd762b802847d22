"""Store contract, jobs through the API: create (with an idempotency key), get, list, the
executions of a job, and ``job_run_now``.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onbeat.errors import ValidationError
from onbeat.model import (
    PENDING_STATUSES,
    Execution,
    ExecutionStatus,
    JobEventKind,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    RetryPolicy,
    Trigger,
)
from onbeat.queue.base import QueueItem
from onbeat.store.base import NewJob, Store
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_SECOND,
    HOURLY,
    StoreFactory,
    _at,
    _claim,
    _cron,
    _dispatch,
    _get,
    _ids,
    _job,
    _leases,
    _new,
    _once,
    _only_run,
    _pending,
    _runs,
)
from onbeat.testing.strategies import submissions

__all__ = ["JobsContract"]


class JobsContract:
    """What the API reads and writes when a job is submitted and looked at."""

    # -- job_create, job_get, job_list, execution_list, execution_get -------------------------

    def test_job_create__idempotency_key_returns_the_first_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        first = store.job_create(_new(idempotency_key="k-1"))
        again = store.job_create(_new(idempotency_key="k-1"))
        assert again.job.id == first.job.id
        assert (first.replayed, again.replayed) == (False, True)
        assert [j.id for j in store.job_list()] == [first.job.id]
        assert len(_runs(store, first.job.id)) == 1

    def test_job_create_many__each_job_with_its_first_run_in_the_order_given(
        self, store: Store, clock: FakeClock
    ) -> None:
        news = [_new(), _cron(HOURLY), _once(_at(clock, 30)), _new(params={"n": 4})]
        created = store.job_create_many(news)
        assert [c.replayed for c in created] == [False] * 4
        assert [c.job.schedule for c in created] == [n.schedule for n in news]
        assert [c.job.params for c in created] == [n.params for n in news]
        assert [j.id for j in store.job_list()] == sorted(c.job.id for c in created)
        for made in created:
            assert _job(store, made.job.id) == made.job
            [run] = _runs(store, made.job.id)
            assert run.scheduled_for == made.job.next_fire_at or made.job.next_fire_at is None
            assert [e.kind for e in store.job_events(made.job.id)] == [JobEventKind.CREATED]
        assert store.job_create_many([]) == []

    def test_job_create_many__queue_within_creates_one_shots_on_time_queued(
        self, store: Store, clock: FakeClock
    ) -> None:
        """Runs nothing needs to plan are created queued, for the caller to enqueue: no dispatch
        returns them, a claim starts them, and the sweep finds one the caller never enqueued."""
        news = [
            _new(priority=7),
            _once(_at(clock, 10)),  # the window's edge: in
            _once(_at(clock, 11)),  # past the window: the dispatch's
            _once(_at(clock, -1)),  # late: the misfire policy's (the dispatch's)
            _cron(EVERY_SECOND),  # its dispatch plans the next fire
        ]
        created = store.job_create_many(news, queue_within=10.0)
        statuses = [_only_run(store, c.job.id).status for c in created]
        assert statuses == [ExecutionStatus.QUEUED] * 2 + [ExecutionStatus.SCHEDULED] * 3
        now_run, soon_run = (_only_run(store, c.job.id) for c in created[:2])
        assert [c.queued for c in created] == [
            QueueItem(now_run.id, now_run.due_at, 7, created[0].job.shard),
            QueueItem(soon_run.id, soon_run.due_at, 0, created[1].job.shard),
            None,
            None,
            None,
        ]
        assert not {now_run.id, soon_run.id} & _ids(_dispatch(store))
        leases = _leases(store)
        clock.advance(60)
        swept = store.execution_sweep(leases, sorted(leases.epochs), 30.0, 100).items
        assert {now_run.id, soon_run.id} <= _ids(swept)  # never enqueued: the sweep has them
        assert _claim(store, now_run.id).execution.status is ExecutionStatus.RUNNING

    def test_job_create_many__queue_within_leaves_a_replayed_job_unqueued(
        self, store: Store, clock: FakeClock
    ) -> None:
        """A submission replayed by its idempotency key created no run: nothing to enqueue."""
        first = store.job_create_many([_new(idempotency_key="k")], queue_within=10.0)[0]
        again = store.job_create_many([_new(idempotency_key="k")], queue_within=10.0)[0]
        assert first.queued is not None and again.replayed
        assert again.queued is None

    def test_job_create_many__a_key_used_twice_in_a_batch_makes_one_job(
        self, store: Store, clock: FakeClock
    ) -> None:
        earlier = store.job_create(_new(idempotency_key="k-0")).job
        created = store.job_create_many(
            [
                _new(idempotency_key="k-1"),
                _new(),
                _new(idempotency_key="k-1"),
                _new(idempotency_key="k-0"),
            ]
        )
        assert [c.replayed for c in created] == [False, False, True, True]
        assert created[2].job.id == created[0].job.id
        assert created[3].job.id == earlier.id
        assert len(store.job_list()) == 3
        with pytest.raises(ValidationError, match="Idempotency-Key"):
            store.job_create_many([_new(), _cron(HOURLY, idempotency_key="k-0")])
        with pytest.raises(ValidationError, match="Idempotency-Key"):  # within the batch
            store.job_create_many(
                [_new(idempotency_key="k-2"), _new(params={"other": 1}, idempotency_key="k-2")]
            )
        assert len(store.job_list()) == 3, "a refused batch left jobs behind"
        # One key, two tenants: two jobs; the batch's keys are looked up per tenant.
        both = store.job_create_many(
            [_new(idempotency_key="k-0", tenant="acme"), _new(idempotency_key="k-0")]
        )
        assert [c.replayed for c in both] == [False, True]
        assert both[1].job.id == earlier.id and both[0].job.tenant == "acme"

    def test_job_create_many__idempotency_keys_as_a_property(
        self, store_factory: StoreFactory
    ) -> None:
        """Random batches of keyed and unkeyed submissions, in two tenants, as time passes (a
        key lasts a day): each keyed submission makes a job only the first time its (tenant,
        key) is seen that day and replays that job after, within its batch or across batches;
        a batch that reuses a key for another submission is refused whole and stores nothing."""

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        )
        @given(
            st.lists(st.tuples(st.sampled_from(_KEY_AGES), _KEYED_BATCH), min_size=1, max_size=5)
        )
        def batches_keep_the_keys_promise(
            history: list[tuple[float, list[tuple[str, str | None, int]]]],
        ) -> None:
            clock = FakeClock()
            with (
                tempfile.TemporaryDirectory() as directory,
                store_factory(Path(directory), clock) as open_store,
            ):
                _check_keyed_batches(open_store(), clock, history)

        batches_keep_the_keys_promise()

    def test_job_create_many__answers_each_job_as_a_read_of_it_would(
        self, store_factory: StoreFactory
    ) -> None:
        """The created jobs are built from what was submitted, not read back: each must be the
        job a read of it gives, to the time zone of every instant (``repr``: equal datetimes in
        other zones would be written otherwise by the API)."""

        @settings(max_examples=30, deadline=None, database=None)
        @given(st.lists(submissions(), min_size=1, max_size=6))
        def created_as_stored(news: list[NewJob]) -> None:
            clock = FakeClock()
            with (
                tempfile.TemporaryDirectory() as directory,
                store_factory(Path(directory), clock) as open_store,
            ):
                store = open_store()
                for created in store.job_create_many(news):
                    stored = store.job_get(created.job.id)
                    assert repr(created.job) == repr(stored)

        created_as_stored()

    def test_job_create__idempotency_key_reused_for_another_submission_is_refused(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.job_create(_new(idempotency_key="k-1"))
        with pytest.raises(ValidationError) as refused:
            store.job_create(_new(params={"other": True}, idempotency_key="k-1"))
        assert refused.value.field == "Idempotency-Key"
        assert len(store.job_list()) == 1

    def test_job_create__idempotency_key_is_per_tenant_and_expires_after_a_day(
        self, store: Store, clock: FakeClock
    ) -> None:
        mine = store.job_create(_new(tenant="acme", idempotency_key="k")).job
        theirs = store.job_create(_new(tenant="globex", idempotency_key="k")).job
        assert mine.id != theirs.id
        clock.advance(24 * 3600 + 1)
        later = store.job_create(_new(tenant="acme", idempotency_key="k")).job
        assert later.id != mine.id

    def test_job_create__now_job_with_first_execution_due_now(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_new()).job
        assert job.status is JobStatus.ACTIVE
        assert job.next_fire_at == clock.now()
        assert 0 <= job.shard < store.shard_count
        run = _only_run(store, job.id)
        assert run.job_id == job.id
        assert run.shard == job.shard
        assert run.trigger is Trigger.SCHEDULE
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.scheduled_for == run.due_at == clock.now()
        assert run.attempt == 0
        assert run.lease_owner is None
        assert run.attempts == ()

    def test_job_create__once_job_first_execution_at_its_time(
        self, store: Store, clock: FakeClock
    ) -> None:
        at = _at(clock, 3600)
        job = store.job_create(_once(at)).job
        assert job.next_fire_at == at
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.scheduled_for == run.due_at == at

    def test_job_create__cron_job_first_execution_at_next_fire(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron("*/15 * * * *")).job
        fire = clock.now().replace(minute=15)
        assert job.next_fire_at == fire
        run = _only_run(store, job.id)
        assert run.status is ExecutionStatus.SCHEDULED
        assert run.trigger is Trigger.SCHEDULE
        assert run.scheduled_for == run.due_at == fire

    def test_job_create__jitter_puts_due_at_within_window(
        self, store: Store, clock: FakeClock
    ) -> None:
        jitter = 30.0
        runs = [
            _only_run(store, store.job_create(_cron(HOURLY, jitter=jitter)).job.id)
            for _ in range(8)
        ]
        for run in runs:
            assert run.scheduled_for == clock.now().replace(hour=13)
            assert run.scheduled_for <= run.due_at < run.scheduled_for + timedelta(seconds=jitter)
        assert any(run.due_at > run.scheduled_for for run in runs), "jitter never moved a run"

    def test_job_create__definition_is_stored(self, store: Store, clock: FakeClock) -> None:
        new = _cron(
            HOURLY,
            task="tasks.report",
            params={"to": "ops", "n": [1, 2]},
            retry=RetryPolicy(max_attempts=7, backoff_base=2.0, backoff_cap=60.0),
            timeout=12.5,
            overlap=OverlapPolicy.QUEUE,
            misfire=MisfirePolicy.RUN_ALL,
            catchup_window=600.0,
            priority=5,
            jitter=3.0,
            tenant="acme",
        )
        job = store.job_create(new).job
        for name in (
            "task",
            "params",
            "schedule",
            "retry",
            "timeout",
            "overlap",
            "misfire",
            "catchup_window",
            "priority",
            "jitter",
            "tenant",
        ):
            assert getattr(job, name) == getattr(new, name), name
        assert store.job_get(job.id) == job

    def test_job_get__unknown_is_none(self, store: Store, clock: FakeClock) -> None:
        assert store.job_get("no-such-job") is None

    def test_job_list__keyset_pages_in_id_order(self, store: Store, clock: FakeClock) -> None:
        created = {store.job_create(_new()).job.id for _ in range(5)}
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = [job.id for job in store.job_list(after_id=after, limit=2)]
            if not page:
                break
            pages.append(page)
            after = page[-1]
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [job_id for page in pages for job_id in page]
        assert listed == sorted(created)

    def test_job_list__filters(self, store: Store, clock: FakeClock) -> None:
        a = store.job_create(_new(task="tasks.a", tenant="t1")).job
        b = store.job_create(_new(task="tasks.b", tenant="t2")).job
        c = store.job_create(_new(task="tasks.a", tenant="t2")).job
        store.job_pause(c.id)
        assert {j.id for j in store.job_list(tenant="t1")} == {a.id}
        assert {j.id for j in store.job_list(tenant="t2")} == {b.id, c.id}
        assert {j.id for j in store.job_list(task="tasks.a")} == {a.id, c.id}
        assert {j.id for j in store.job_list(status=JobStatus.PAUSED)} == {c.id}
        assert {j.id for j in store.job_list(status=JobStatus.ACTIVE)} == {a.id, b.id}
        assert {j.id for j in store.job_list(tenant="t2", task="tasks.b")} == {b.id}
        assert store.job_list(tenant="nobody") == []

    def test_execution_list__newest_fire_first_with_keyset_pages(
        self, store: Store, clock: FakeClock
    ) -> None:
        job = store.job_create(_cron(EVERY_SECOND)).job
        _dispatch(store)  # fires at +1..+10 queued, +11 scheduled
        runs = _runs(store, job.id)
        assert len(runs) == 11
        fires = [r.scheduled_for for r in runs]
        assert fires == sorted(fires, reverse=True)
        assert len(set(fires)) == len(fires)
        paged: list[Execution] = []
        before: str | None = None
        while page := store.execution_list(job.id, before_id=before, limit=4):
            paged.extend(page)
            before = page[-1].id
        assert [r.id for r in paged] == [r.id for r in runs]
        queued = store.execution_list(job.id, status=ExecutionStatus.QUEUED)
        assert len(queued) == 10
        assert all(r.status is ExecutionStatus.QUEUED for r in queued)
        assert [r.id for r in store.execution_list(job.id, status=ExecutionStatus.SCHEDULED)] == [
            runs[0].id
        ]

    def test_execution_get__unknown_is_none(self, store: Store, clock: FakeClock) -> None:
        assert store.execution_get("no-such-execution") is None

    # -- job_run_now ---------------------------------------------------------------------------

    def test_job_run_now__manual_execution_due_now(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_cron(HOURLY)).job
        scheduled = _only_run(store, job.id)
        clock.advance(5)
        manual = store.job_run_now(job.id)
        assert manual.job_id == job.id
        assert manual.trigger is Trigger.MANUAL
        assert manual.status is ExecutionStatus.SCHEDULED
        assert manual.scheduled_for == manual.due_at == clock.now()
        assert _get(store, manual.id) == manual
        assert _ids(_dispatch(store)) == {manual.id}
        assert _claim(store, manual.id).execution.attempt == 1
        assert _get(store, scheduled.id).status is ExecutionStatus.SCHEDULED
        assert _job(store, job.id).next_fire_at == scheduled.scheduled_for

    def test_job_run_now__twice_at_same_instant(self, store: Store, clock: FakeClock) -> None:
        job = store.job_create(_cron(HOURLY)).job
        first = store.job_run_now(job.id)
        second = store.job_run_now(job.id)
        assert second.trigger is Trigger.MANUAL
        assert _get(store, second.id).status in PENDING_STATUSES
        assert {first.id, second.id} <= {r.id for r in _pending(store, job.id)}


# -- idempotency keys as a property -------------------------------------------------------------

_KEY_AGES = (0.0, 60.0, 24 * 3600 + 1.0)
"""Seconds the clock moves before a batch: none, a minute, past a key's day."""
_KEYED_BATCH = st.lists(
    st.tuples(
        st.sampled_from(["default", "acme"]), st.sampled_from([None, "k0", "k1"]), st.integers(0, 1)
    ),
    min_size=1,
    max_size=5,
)
"""Submissions as (tenant, idempotency key, which of two submissions)."""


def _check_keyed_batches(
    store: Store, clock: FakeClock, history: list[tuple[float, list[tuple[str, str | None, int]]]]
) -> None:
    """Submit each batch after its clock move, and compare with a model of the keys."""
    keys: dict[tuple[str, str], tuple[int, str, float]] = {}
    """(tenant, key) -> (submission, its job's id, when the key was stored) for live keys."""
    jobs = 0
    elapsed = 0.0
    for age, batch in history:
        clock.advance(age)
        elapsed += age
        keys = {k: v for k, v in keys.items() if elapsed - v[2] <= 24 * 3600}
        seen: dict[tuple[str, str], tuple[int, int]] = {}
        """Keys first used in this batch: (tenant, key) -> (submission, index in the batch)."""
        expected: list[str | int | None] = []
        """Per submission: the id of the job it replays, the index of the earlier submission
        in the batch it repeats, or None for a new job."""
        refused = False
        for i, (tenant, key, which) in enumerate(batch):
            if key is None:
                expected.append(None)
            elif (tenant, key) in keys:
                refused |= keys[(tenant, key)][0] != which
                expected.append(keys[(tenant, key)][1])
            elif (tenant, key) in seen:
                refused |= seen[(tenant, key)][0] != which
                expected.append(seen[(tenant, key)][1])
            else:
                seen[(tenant, key)] = (which, i)
                expected.append(None)
        news = [
            _new(tenant=tenant, params={"which": which}, idempotency_key=key)
            for tenant, key, which in batch
        ]
        if refused:
            with pytest.raises(ValidationError) as refusal:
                store.job_create_many(news)
            assert refusal.value.field == "Idempotency-Key"
            assert len(store.job_list(limit=1000)) == jobs, "a refused batch stored jobs"
            continue
        created = store.job_create_many(news)
        for made, (tenant, _, which), expect in zip(created, batch, expected, strict=True):
            assert made.replayed == (expect is not None)
            assert made.job.tenant == tenant and made.job.params == {"which": which}
            if isinstance(expect, str):
                assert made.job.id == expect
            elif isinstance(expect, int):
                assert made.job.id == created[expect].job.id
        jobs += sum(expect is None for expect in expected)
        assert len(store.job_list(limit=1000)) == jobs
        for (tenant, key), (which, i) in seen.items():
            keys[(tenant, key)] = (which, created[i].job.id, elapsed)
