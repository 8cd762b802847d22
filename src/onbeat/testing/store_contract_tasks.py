"""``Store.task_publish`` / ``Store.task_catalog`` contract: the tasks workers publish, so that a
process without the user's code (``onbeat api``) knows which task names exist and their defaults.

A mixin for the contract suite (see :mod:`onbeat.testing.store_contract`): add
``TaskCatalogContract`` to the ``TestStore`` bases next to ``StoreContract``. Like lease expiry,
the instant a task's ``seen_within`` runs out is not tested: a backend may count it either way.
"""

from __future__ import annotations

from datetime import timedelta

from onbeat.model import RetryPolicy
from onbeat.store.base import PublishedTask, Store, TaskDefaults
from onbeat.testing.clock import FakeClock
from onbeat.testing.store_contract import OTHER_WORKER, WORKER

__all__ = ["TaskCatalogContract"]

TTL = 600.0
SEND = TaskDefaults("mail.send", RetryPolicy(5, 2.0, 60.0), timeout=30.0, is_async=True)
REPORT = TaskDefaults("reports.build", RetryPolicy(1, 0.5, 0.5), timeout=None, is_async=False)


def _names(found: list[PublishedTask]) -> list[str]:
    return [t.name for t in found]


class TaskCatalogContract:
    def test_task_catalog__empty_store_knows_no_task(self, store: Store) -> None:
        assert store.task_catalog(TTL) == []
        assert store.task_catalog(TTL, ["mail.send"]) == []

    def test_task_publish__catalog_has_the_defaults_the_worker_and_the_time(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.task_publish(WORKER, [SEND, REPORT])
        assert store.task_catalog(TTL) == [
            PublishedTask(
                "mail.send", SEND.retry, 30.0, is_async=True, worker=WORKER, seen_at=clock.now()
            ),
            PublishedTask(
                "reports.build",
                REPORT.retry,
                None,
                is_async=False,
                worker=WORKER,
                seen_at=clock.now(),
            ),
        ]

    def test_task_publish__nothing_to_publish_changes_nothing(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.task_publish(WORKER, [SEND])
        clock.advance(5)
        store.task_publish(OTHER_WORKER, [])
        [known] = store.task_catalog(TTL)
        assert (known.worker, known.seen_at) == (WORKER, clock.now() - timedelta(seconds=5))

    def test_task_catalog__only_the_names_asked_for(self, store: Store) -> None:
        store.task_publish(WORKER, [SEND, REPORT])
        assert _names(store.task_catalog(TTL, ["reports.build"])) == ["reports.build"]
        assert _names(store.task_catalog(TTL, ["reports.build", "nope", "mail.send"])) == [
            "mail.send",
            "reports.build",
        ]
        assert store.task_catalog(TTL, ["nope"]) == []
        assert store.task_catalog(TTL, []) == []

    def test_task_catalog__a_name_no_store_can_hold_is_simply_unknown(self, store: Store) -> None:
        """A name with NUL (PostgreSQL text cannot hold one) or a lone surrogate, as a fuzzed API
        request sends it, is a task nobody published: looking it up is not an error."""
        store.task_publish(WORKER, [SEND])
        names = ["mail\x00.send", "\x00", "r\x00F", "\ud98c", "mail.send"]
        assert _names(store.task_catalog(TTL, names)) == ["mail.send"]

    def test_task_catalog__a_task_nobody_published_lately_is_left_out(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.task_publish(WORKER, [SEND, REPORT])
        clock.advance(TTL - 1)
        store.task_publish(WORKER, [SEND])  # the worker's new code no longer has reports.build
        assert _names(store.task_catalog(TTL)) == ["mail.send", "reports.build"]
        clock.advance(2)
        assert _names(store.task_catalog(TTL)) == ["mail.send"]
        assert store.task_catalog(TTL, ["reports.build"]) == []
        assert _names(store.task_catalog(TTL + 2)) == ["mail.send", "reports.build"]

    def test_task_catalog__known_while_any_worker_that_has_it_is_seen(
        self, store: Store, clock: FakeClock
    ) -> None:
        store.task_publish(WORKER, [SEND])
        store.task_publish(OTHER_WORKER, [SEND])
        for _ in range(3):  # WORKER died; OTHER_WORKER keeps publishing
            clock.advance(TTL / 2)
            store.task_publish(OTHER_WORKER, [SEND])
        [known] = store.task_catalog(TTL)
        assert (known.worker, known.seen_at) == (OTHER_WORKER, clock.now())

    def test_task_publish__the_last_publisher_s_defaults_win(
        self, store: Store, clock: FakeClock
    ) -> None:
        """Two versions of a worker during a deploy: the catalog follows whichever published last."""
        store.task_publish(WORKER, [SEND])
        clock.advance(1)
        redeployed = TaskDefaults("mail.send", RetryPolicy(2, 1.0, 10.0), None, is_async=False)
        store.task_publish(OTHER_WORKER, [redeployed])
        [known] = store.task_catalog(TTL)
        assert (known.retry, known.timeout, known.is_async) == (redeployed.retry, None, False)
        assert (known.worker, known.seen_at) == (OTHER_WORKER, clock.now())
