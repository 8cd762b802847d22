"""Store contract, dashboard reads: job search, the last hour's activity, who is running what,
dead-letter counts, API keys by id and the shared signing secret.

A mixin of the contract suite (see :mod:`onbeat.testing.store_contract` for the fixtures).
Only the Store protocol is used.
"""

from __future__ import annotations

from datetime import timedelta

from onbeat.auth import ApiKey, Role
from onbeat.model import ExecutionStatus, JobStatus, RetryPolicy
from onbeat.store.base import Store, delay_class, delay_class_floor
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import (
    EVERY_MINUTE,
    OTHER_SCHEDULER,
    OTHER_WORKER,
    RUN_TTL,
    SCHEDULER,
    SHARD_COUNT,
    WORKER,
    _at,
    _claim,
    _cron,
    _dispatch,
    _failed,
    _leases,
    _new,
    _ok,
    _once,
    _only_run,
    _start,
)

ONE_ATTEMPT = RetryPolicy(max_attempts=1)


class DashboardReadsContract:
    # -- job_search ---------------------------------------------------------------------------

    def test_job_search__one_tenant_in_id_order_and_every_tenant_without_one(
        self, store: Store, clock: FakeClock
    ) -> None:
        mine = [store.job_create(_new(tenant="acme")).job.id for _ in range(3)]
        theirs = store.job_create(_new(tenant="globex")).job.id
        mine.append(store.job_create(_new(tenant="acme")).job.id)
        assert [j.id for j in store.job_search(tenant="acme")] == sorted(mine)
        assert [j.id for j in store.job_search(tenant=None)] == sorted([*mine, theirs])
        assert store.job_search(tenant="nobody") == []

    def test_job_search__keyset_pages_cover_every_job_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        ids = sorted(store.job_create(_new(tenant=t)).job.id for t in ["a", "b"] * 4)
        seen: list[str] = []
        after = None
        while page := store.job_search(tenant=None, after_id=after, limit=3):
            assert len(page) <= 3
            seen += [j.id for j in page]
            after = page[-1].id
        assert seen == ids

    def test_job_search__status_filter(self, store: Store, clock: FakeClock) -> None:
        active = store.job_create(_cron(EVERY_MINUTE)).job.id
        paused = store.job_create(_cron(EVERY_MINUTE)).job.id
        store.job_pause(paused)
        cancelled = store.job_create(_cron(EVERY_MINUTE)).job.id
        store.job_cancel(cancelled)
        for status, expected in [
            (JobStatus.ACTIVE, [active]),
            (JobStatus.PAUSED, [paused]),
            (JobStatus.CANCELLED, [cancelled]),
            (JobStatus.COMPLETED, []),
        ]:
            found = store.job_search(tenant=None, status=status)
            assert [j.id for j in found] == expected, status
            assert all(j.status is status for j in found)

    def test_job_search__text_matches_an_id_prefix_or_a_task_name_prefix(
        self, store: Store, clock: FakeClock
    ) -> None:
        report = store.job_create(_new(task="report.send")).job.id
        hello = store.job_create(_new(task="hello")).job.id
        other_tenant = store.job_create(_new(task="report.send", tenant="globex")).job.id
        assert [j.id for j in store.job_search(tenant="default", text="rep")] == [report]
        assert [j.id for j in store.job_search(tenant="default", text="report.send")] == [report]
        assert [j.id for j in store.job_search(tenant="default", text=hello)] == [hello]
        assert [j.id for j in store.job_search(tenant=None, text=hello.upper())] == [hello]
        assert [j.id for j in store.job_search(tenant=None, text="report")] == sorted(
            [report, other_tenant]
        )
        assert store.job_search(tenant="default", text="nothing-like-it") == []

    def test_job_search__a_job_matched_by_id_and_by_task_is_listed_once(
        self, store: Store, clock: FakeClock
    ) -> None:
        first = store.job_create(_new()).job
        prefix = first.id[:6]
        both = store.job_create(_new(task=prefix + ".task")).job
        found = store.job_search(tenant=None, text=prefix)
        assert [j.id for j in found] == sorted({first.id, both.id})

    def test_job_search__filters_combine_with_pages(self, store: Store, clock: FakeClock) -> None:
        wanted = []
        for i in range(6):
            job = store.job_create(_cron(EVERY_MINUTE, task="mail.send" if i % 2 else "other")).job
            if i % 3:
                store.job_pause(job.id)
                if i % 2:
                    wanted.append(job.id)
        first = store.job_search(tenant=None, status=JobStatus.PAUSED, text="mail", limit=1)
        rest = store.job_search(
            tenant=None, status=JobStatus.PAUSED, text="mail", after_id=first[0].id
        )
        assert [j.id for j in first + rest] == sorted(wanted)

    # -- execution_activity -------------------------------------------------------------------

    def test_execution_activity__runs_that_ended_by_status_and_start_delay(
        self, store: Store, clock: FakeClock
    ) -> None:
        since = clock.now()
        ok = store.job_create(_new(tenant="acme")).job
        failing = store.job_create(_new(tenant="acme", retry=ONE_ATTEMPT)).job
        theirs = store.job_create(_new(tenant="globex")).job
        _dispatch(store)
        clock.advance(3)  # every run starts 3 s after it was due
        runs = {job.id: _claim(store, _only_run(store, job.id).id) for job in (ok, failing, theirs)}
        clock.advance(10)  # they end in the second bucket
        store.execution_finish_many(
            [_ok(runs[ok.id]), _failed(runs[failing.id]), _ok(runs[theirs.id])]
        )
        clock.advance(20)
        buckets = store.execution_activity(
            tenant="acme", since=since, until=clock.now(), bucket=timedelta(seconds=10)
        )
        assert [b.start for b in buckets] == [since + timedelta(seconds=s) for s in (0, 10, 20, 30)]
        three_seconds = delay_class(3_000_000)
        assert delay_class_floor(three_seconds) <= 3_000_000 < delay_class_floor(three_seconds + 1)
        assert buckets[1].finished == {ExecutionStatus.SUCCEEDED: 1, ExecutionStatus.FAILED: 1}
        assert buckets[1].start_delays == {three_seconds: 2}
        assert all(not b.finished and not b.start_delays for b in buckets if b is not buckets[1])
        every = store.execution_activity(
            tenant=None, since=since, until=clock.now(), bucket=timedelta(seconds=10)
        )
        assert every[1].finished == {ExecutionStatus.SUCCEEDED: 2, ExecutionStatus.FAILED: 1}

    def test_execution_activity__queue_depth_counts_runs_due_and_not_started(
        self, store: Store, clock: FakeClock
    ) -> None:
        since = clock.now()
        waits = store.job_create(_new()).job  # due now, starts 25 s later
        later = store.job_create(_new()).job
        paused = store.job_create(_new()).job
        store.job_pause(paused.id)  # held by its pause: not waiting in the queue
        _dispatch(store)
        clock.advance(25)
        _claim(store, _only_run(store, waits.id).id)
        clock.advance(10)
        _claim(store, _only_run(store, later.id).id)
        clock.advance(1)
        store.job_create(_new())  # due at 36 s, never started
        clock.advance(14)
        buckets = store.execution_activity(
            tenant=None, since=since, until=clock.now(), bucket=timedelta(seconds=10)
        )
        # Bucket ends: 10 s, 20 s (both waiting), 30 s (one started at 25 s), 40 s (the other
        # started at 35 s; `late` came due at 36 s), 50 s (`late` still waits).
        assert [b.queue_depth for b in buckets] == [2, 2, 1, 1, 1]

    def test_execution_activity__a_backlog_older_than_the_range_counts_from_its_start(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.job_create(_new())
        clock.advance(3600)
        since = clock.now()
        clock.advance(30)
        buckets = store.execution_activity(
            tenant=None, since=since, until=clock.now(), bucket=timedelta(seconds=10)
        )
        assert [b.queue_depth for b in buckets] == [1, 1, 1]

    # -- who runs what ------------------------------------------------------------------------

    def test_execution_running_by_owner__live_and_expired_leases(
        self, store: Store, clock: FakeClock
    ) -> None:
        _start(store, _new(tenant="acme"), owner=WORKER)
        _start(store, _new(tenant="acme"), owner=OTHER_WORKER)
        clock.advance(RUN_TTL + 1)  # both leases lapse; a third run starts with a fresh one
        _start(store, _new(tenant="acme"), owner=WORKER)
        _start(store, _new(tenant="globex"), owner=OTHER_WORKER)
        loads = store.execution_running_by_owner(tenant="acme")
        assert [(w.owner, w.running, w.expired) for w in loads] == [
            (WORKER, 1, 1),
            (OTHER_WORKER, 0, 1),
        ]
        every = store.execution_running_by_owner(tenant=None)
        assert [(w.owner, w.running, w.expired) for w in every] == [
            (WORKER, 1, 1),
            (OTHER_WORKER, 1, 1),
        ]

    def test_scheduler_shards__every_scheduler_with_the_shards_it_holds(
        self, store: Store, clock: FakeClock
    ) -> None:
        assert store.scheduler_shards() == []
        _leases(store, SCHEDULER)
        _leases(store, OTHER_SCHEDULER)
        for _ in range(3):
            _leases(store, SCHEDULER)
            _leases(store, OTHER_SCHEDULER)
        held = store.scheduler_shards()
        assert [s.owner for s in held] == sorted([SCHEDULER, OTHER_SCHEDULER])
        assert sum(s.shards for s in held) == SHARD_COUNT
        assert all(s.shards > 0 and s.last_seen == clock.now() for s in held)

    # -- dead letters, keys, secrets ----------------------------------------------------------

    def test_dead_letter_count__per_tenant_up_to_the_limit(
        self, store: Store, clock: FakeClock
    ) -> None:
        for tenant in ("acme", "acme", "globex"):
            run = _start(store, _new(tenant=tenant))
            store.execution_finish_many([_failed(run)])
        assert store.dead_letter_count(tenant="acme", limit=100) == 2
        assert store.dead_letter_count(tenant="globex", limit=100) == 1
        assert store.dead_letter_count(tenant="nobody", limit=100) == 0
        assert store.dead_letter_count(tenant=None, limit=100) == 3
        assert store.dead_letter_count(tenant=None, limit=2) == 2

    def test_execution_last_of_jobs__the_newest_run_that_started_or_ended(
        self, store: Store, clock: FakeClock
    ) -> None:
        cron = store.job_create(_cron(EVERY_MINUTE)).job
        never_ran = store.job_create(_cron(EVERY_MINUTE, task="other")).job
        failed = _start(store, _new())
        store.execution_finish_many([_failed(failed)])
        clock.advance(60)
        _dispatch(store)  # queues 12:01 of both cron jobs and plans their 12:02
        [first] = [r for r in store.execution_list(cron.id) if r.status is ExecutionStatus.QUEUED]
        store.execution_finish_many([_ok(_claim(store, first.id))])
        last = store.execution_last_of_jobs([cron.id, never_ran.id, failed.execution.job_id])
        assert set(last) == {cron.id, failed.execution.job_id}
        assert (last[cron.id].id, last[cron.id].status) == (first.id, ExecutionStatus.SUCCEEDED)
        assert last[failed.execution.job_id].status is ExecutionStatus.FAILED
        assert store.execution_last_of_jobs([]) == {}

    def test_api_key_get__active_keys_only(self, store: Store, clock: FakeClock) -> None:
        key = ApiKey("k1", "acme", Role.READER, clock.now())
        store.api_key_insert(key, "hash-1")
        assert store.api_key_get("k1") == key
        assert store.api_key_get("nope") is None
        store.api_key_revoke("k1")
        assert store.api_key_get("k1") is None

    def test_secret_get_or_create__the_first_value_stays(
        self, store: Store, clock: FakeClock
    ) -> None:
        assert store.secret_get_or_create("session", "first") == "first"
        assert store.secret_get_or_create("session", "second") == "first"
        assert store.secret_get_or_create("other", "third") == "third"

    def test_execution_backlog__due_runs_not_started_by_priority(
        self, store: Store, clock: FakeClock
    ) -> None:
        assert store.execution_backlog() == {}
        for priority in (0, 0, 5):
            store.job_create(_new(priority=priority))
        store.job_create(_once(_at(clock, 60), priority=5))  # not due yet
        started = _start(store, _new(priority=9))  # running: not in the queue any more
        assert started.execution.status is ExecutionStatus.RUNNING
        assert store.execution_backlog() == {0: 2, 5: 1}
        clock.advance(61)
        assert store.execution_backlog() == {0: 2, 5: 2}
