"""The Python API over a real SQLite file, across App instances (a restart, another process)."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from onbeat import App, TaskContext, ValidationError, validation
from onbeat.store import Store, open_store
from onbeat.testing import FakeClock
from tests.faults.process import wait_until


def make_app(path: Path, clock: FakeClock) -> App:
    app = App(f"sqlite:///{path}", clock=clock)

    @app.task(name="noop")
    def noop(ctx: TaskContext, **params: Any) -> None:
        return None

    return app


def test_app__idempotency_key_survives_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    first_app = make_app(tmp_path / "onbeat.db", clock)
    job = first_app.schedule("noop", {"n": 1}, idempotency_key="order-42")
    first_app.close()
    restarted = make_app(tmp_path / "onbeat.db", clock)
    assert restarted.schedule("noop", {"n": 1}, idempotency_key="order-42").id == job.id
    with pytest.raises(ValidationError, match="Idempotency-Key"):
        restarted.schedule("noop", {"n": 2}, idempotency_key="order-42")
    assert len(restarted.list_jobs()) == 1
    restarted.close()


def test_app__params_stored_are_those_checked(tmp_path: Path, clock: FakeClock) -> None:
    """Params are checked once (the REST API's schema checks them before ``prepare`` does) and
    stored as the JSON they were checked as: a change to the dict after ``prepare`` is neither
    stored nor able to slip an unchecked value in."""
    app = make_app(tmp_path / "onbeat.db", clock)
    checked = validation.params({"name": "zoë", "n": 1})
    assert validation.params(checked) is checked  # not checked again
    new = app.prepare("noop", {"name": "zoë", "n": 1})
    new.params["n"] = float("nan")  # would be refused by the check
    [created] = app.submit_many([new])
    assert created.job.params == app.get_job(created.job.id).params == {"name": "zoë", "n": 1}
    app.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 31 2 *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"at": "2026-12-01T08:00:00"}, "at"),
        ({"params": {"x": float("nan")}}, "params"),
        ({"params": {"blob": "x" * 70_000}}, "params"),
        ({"jitter": -1}, "jitter"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"idempotency_key": ""}, "Idempotency-Key"),
        ({"idempotency_key": 42}, "Idempotency-Key"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"priority": True}, "priority"),
        ({"backoff": "1"}, "backoff"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": 5}, "tenant"),
        ({"params": {"pair": (1, 2)}}, "params"),
        ({"params": {"ids": {1, 2}}}, "params"),
        ({"params": {"by_id": {1: "a"}}}, "params"),
        ({"params": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}, "params"),
    ],
)
def test_app__bad_input_is_refused_naming_the_field_and_stores_nothing(
    tmp_path: Path, clock: FakeClock, kwargs: dict[str, Any], field: str
) -> None:
    app = make_app(tmp_path / "onbeat.db", clock)
    kept = app.schedule("noop", {"keep": True})
    with pytest.raises(ValidationError) as refused:
        app.schedule("noop", **kwargs)
    assert refused.value.field == field
    assert [j.id for j in app.list_jobs()] == [kept.id]
    assert app.get_job(kept.id).params == {"keep": True}
    app.close()


def test_app__unknown_task_is_refused(tmp_path: Path, clock: FakeClock) -> None:
    app = make_app(tmp_path / "onbeat.db", clock)
    with pytest.raises(ValidationError, match="unknown task 'nope'") as refused:
        app.schedule("nope")
    assert refused.value.field == "task"
    assert app.list_jobs() == []
    app.close()


def test_app__unknown_option_is_a_type_error(tmp_path: Path, clock: FakeClock) -> None:
    app = make_app(tmp_path / "onbeat.db", clock)
    with pytest.raises(TypeError, match="colour"):
        app.schedule("noop", colour="red")  # type: ignore[call-arg]
    app.close()


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("max_attempts", 2.5),
        ("max_attempts", True),
        ("max_attempts", 0),
        ("timeout", 0),
        ("timeout", "5"),
        ("backoff", float("nan")),
        ("backoff_max", -1),
    ],
)
def test_task__registration_refuses_what_schedule_refuses_with_the_same_message(
    tmp_path: Path, clock: FakeClock, arg: str, value: Any
) -> None:
    app = make_app(tmp_path / "onbeat.db", clock)
    with pytest.raises(ValidationError) as at_schedule:
        app.schedule("noop", **{arg: value})
    with pytest.raises(ValidationError) as at_registration:
        app.task(name="other", **{arg: value})(lambda ctx: None)
    assert (at_registration.value.field, at_registration.value.message) == (
        at_schedule.value.field,
        at_schedule.value.message,
    )
    assert "other" not in app.registry
    app.close()


@pytest.mark.parametrize("name", ["", 5, "x" * 201, "\ud800"])
def test_task__registration_refuses_a_bad_name(tmp_path: Path, clock: FakeClock, name: Any) -> None:
    app = make_app(tmp_path / "onbeat.db", clock)
    with pytest.raises(ValidationError) as refused:
        app.task(name=name)(lambda ctx: None)
    assert refused.value.field == "name"
    app.close()


def test_app__threads_first_using_the_store_at_once_share_one(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads reach ``App.store`` before it is open. An opening waits (up to 1 s) for a
    second one to begin: without the lock both open a store, with it the second waits and
    gets the first's."""
    app = make_app(tmp_path / "onbeat.db", clock)
    opened: list[Store] = []
    both_opening = threading.Barrier(2, timeout=1)

    def opening(*args: Any, **kwargs: Any) -> Store:
        # No second opening within the timeout: the lock held it back.
        with contextlib.suppress(threading.BrokenBarrierError):
            both_opening.wait()
        opened.append(open_store(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr("onbeat.app.open_store", opening)
    with ThreadPoolExecutor(2) as pool:
        stores = list(pool.map(lambda _: app.store, range(2)))
    try:
        assert len(opened) == 1
        assert stores == [opened[0], opened[0]]
    finally:
        for store in opened:
            store.close()


def test_app__submissions_at_once_share_a_transaction_and_each_gets_its_own_answer(
    tmp_path: Path, clock: FakeClock
) -> None:
    """While one submission is being stored, five more arrive from other threads: they are
    stored together (one ``job_create_many``), and each caller gets what it would have got
    alone: a job of its own, the same job for a key submitted twice, and the refusal of a key
    reused for another submission (to its caller only, the others stored all the same)."""
    app = make_app(tmp_path / "onbeat.db", clock)
    app.schedule("noop", {"n": 0}, idempotency_key="taken")
    store = app.store
    original = store.job_create_many
    batches: list[int] = []
    writing, release = threading.Event(), threading.Event()

    def held_first(news: Any, queue_within: float | None = None) -> Any:
        batches.append(len(news))
        if len(batches) == 1:
            writing.set()
            assert release.wait(10)
        return original(news, queue_within)

    store.job_create_many = held_first  # type: ignore[method-assign]
    submissions: list[dict[str, Any]] = [
        {"params": {"n": 2}},
        {"params": {"n": 3}, "idempotency_key": "twice"},
        {"params": {"n": 3}, "idempotency_key": "twice"},
        {"params": {"n": 4}, "idempotency_key": "taken"},  # "taken" was {"n": 0}
        {"params": {"n": 5}},
    ]
    with ThreadPoolExecutor(len(submissions) + 1) as pool:
        first = pool.submit(app.schedule, "noop", {"n": 1})
        assert writing.wait(10)
        later = [pool.submit(partial(app.schedule, "noop", **s)) for s in submissions]
        wait_until(lambda: len(app._creates._waiting) == len(submissions), 10, "the five to queue")
        release.set()
    try:
        assert batches[:2] == [1, 5], "the five did not share one transaction"
        two, twice, again, reused, five = later
        with pytest.raises(ValidationError, match="Idempotency-Key"):
            reused.result()
        assert twice.result().id == again.result().id
        created = [first.result(), two.result(), twice.result(), five.result()]
        assert [job.params for job in created] == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 5}]
        assert len({job.id for job in created}) == 4
        stored = {job.id: job.params for job in app.list_jobs()}
        assert len(stored) == 5 and all(stored[job.id] == job.params for job in created)
    finally:
        app.close()
