"""``onbeat.client.Client`` against a real node: every method, its typed result, and the typed
errors the API's problem documents become."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from onbeat import (
    ConflictError,
    ExecutionStatus,
    JobStatus,
    NotFoundError,
    OverlapPolicy,
    ScheduleKind,
    Trigger,
    ValidationError,
)
from onbeat.client import (
    ApiConflictError,
    ApiConnectionError,
    ApiNotFoundError,
    ApiValidationError,
    AuthenticationError,
    Client,
    DeadLetterInfo,
    ExecutionInfo,
    JobDetail,
    JobInfo,
    JobSpec,
    PermissionDeniedError,
)
from tests.client.conftest import LiveNode, free_port, wait_for

MISSING_ID = "0123456789abcdef0123456789abcdef"


def finished(client: Client, job_id: str) -> JobDetail:
    """The job once its latest execution has reached a final state."""
    return wait_for(
        lambda: client.get_job(job_id),
        lambda job: bool(job.executions) and job.executions[0].status.is_final,
        f"job {job_id} to finish a run",
    )


def dead_letter(client: Client) -> DeadLetterInfo:
    job = client.create_job("fail")
    finished(client, job.id)
    [dead] = [d for d in client.iter_dead_letters() if d.job_id == job.id]
    return dead


# --- jobs -----------------------------------------------------------------------------------
def test_create_job__cron_returns_a_typed_job_with_its_next_fire_times(client: Client) -> None:
    job = client.create_job(
        "echo",
        {"to": "ops@example.com"},
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        overlap=OverlapPolicy.QUEUE,
        priority=5,
        jitter=1.5,
    )
    assert isinstance(job, JobInfo)
    assert (job.task, job.params, job.status, job.overlap, job.priority, job.jitter) == (
        "echo",
        {"to": "ops@example.com"},
        JobStatus.ACTIVE,
        OverlapPolicy.QUEUE,
        5,
        1.5,
    )
    assert (job.schedule.type, job.schedule.expression, job.schedule.timezone) == (
        ScheduleKind.CRON,
        "30 2 * * *",
        "Europe/Berlin",
    )
    assert (job.max_attempts, job.timeout, job.backoff, job.backoff_max) == (5, 30.0, 2.0, 60.0)
    assert len(job.next_fire_times) == 5
    assert job.next_fire_at == job.next_fire_times[0].at
    assert job.next_fire_at is not None and job.next_fire_at.tzinfo is not None
    assert job.created_at <= datetime.now(UTC)
    assert job.raw["id"] == job.id


def test_create_job__once_at_a_datetime(client: Client) -> None:
    at = datetime(2099, 1, 1, 10, 0, tzinfo=UTC)
    job = client.create_job("echo", at=at + timedelta(hours=1) - timedelta(hours=1))
    assert (job.schedule.type, job.schedule.at, job.next_fire_at) == (ScheduleKind.ONCE, at, at)


def test_create_job__idempotency_key_returns_the_first_job(client: Client) -> None:
    first = client.create_job("echo", {"n": 1}, idempotency_key="order-17")
    again = client.create_job("echo", {"n": 1}, idempotency_key="order-17")
    assert again.id == first.id
    with pytest.raises(ApiValidationError) as refused:
        client.create_job("echo", {"n": 2}, idempotency_key="order-17")
    assert refused.value.field == "Idempotency-Key"


def test_create_job__unknown_task_is_a_validation_error_naming_task(client: Client) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.create_job("nope")
    error = raised.value
    assert isinstance(error, ValidationError)  # onbeat's own: code for the App works here too
    assert (error.status, error.field, error.problem.status) == (422, "task", 422)
    assert "nope" in error.message
    assert error.problem.type == "urn:onbeat:problem:validation"
    assert str(error).startswith("422 Invalid request: task: ")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "schedule.expression"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Base"}, "schedule.timezone"),
        ({"at": "2099-01-01T10:00:00"}, "schedule.at"),
        ({"cron": "0 3 * * *", "at": "2099-01-01T10:00:00Z"}, "schedule.at"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"overlap": "sometimes"}, "overlap"),
    ],
)
def test_create_job__invalid_input_names_the_field(
    client: Client, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.create_job("echo", **kwargs)  # type: ignore[arg-type]
    assert raised.value.status == 422
    assert field in [e.field for e in raised.value.errors], raised.value.problem


def test_create_job__every_invalid_field_is_listed(client: Client) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.create_job("echo", priority=101, timeout=0)
    assert sorted(e.field for e in raised.value.errors) == ["priority", "timeout"]
    assert all(e.message for e in raised.value.errors)


def test_create_jobs__stores_every_job_in_one_call_in_the_order_given(client: Client) -> None:
    at = datetime(2099, 1, 1, 10, 0, tzinfo=UTC)
    jobs = client.create_jobs(
        [
            JobSpec("echo", {"n": 1}, cron="30 2 * * *", timezone="Europe/Berlin", priority=3),
            JobSpec("echo", {"n": 2}, at=at, overlap=OverlapPolicy.QUEUE),
            JobSpec("echo", {"n": 3}),
        ]
    )
    assert all(isinstance(job, JobInfo) for job in jobs)
    assert [(job.params, job.schedule.type) for job in jobs] == [
        ({"n": 1}, ScheduleKind.CRON),
        ({"n": 2}, ScheduleKind.ONCE),
        ({"n": 3}, ScheduleKind.NOW),
    ]
    assert (jobs[0].schedule.timezone, jobs[0].priority, jobs[0].max_attempts) == (
        "Europe/Berlin",
        3,
        5,  # the task's default, as create_job gives
    )
    assert (jobs[1].next_fire_at, jobs[1].overlap) == (at, OverlapPolicy.QUEUE)
    assert [client.get_job(job.id).id for job in jobs] == [job.id for job in jobs]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (JobSpec("echo", cron="61 * * * *"), "jobs[1].schedule.expression"),
        (JobSpec("nope"), "jobs[1].task"),
        (JobSpec("echo", priority=101), "jobs[1].priority"),
    ],
)
def test_create_jobs__one_bad_job_is_named_by_its_index_and_none_is_stored(
    own_client: Client, bad: JobSpec, field: str
) -> None:
    with pytest.raises(ApiValidationError) as raised:
        own_client.create_jobs([JobSpec("echo"), bad, JobSpec("echo", cron="0 3 * * *")])
    assert raised.value.status == 422
    assert [e.field for e in raised.value.errors] == [field], raised.value.problem
    assert list(own_client.iter_jobs()) == []


def test_create_jobs__an_empty_batch_is_a_validation_error(client: Client) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.create_jobs([])
    assert raised.value.field == "jobs"


def test_get_job__with_recent_executions_and_their_attempts(client: Client) -> None:
    job = finished(client, client.create_job("echo", {"x": 1}).id)
    assert isinstance(job, JobDetail)
    [execution] = job.executions
    assert (execution.status, execution.trigger, execution.result) == (
        ExecutionStatus.SUCCEEDED,
        Trigger.SCHEDULE,
        {"x": 1},
    )
    [attempt] = execution.attempts
    assert attempt.attempt == 1 and attempt.finished_at is not None


def test_get_job__unknown_id_is_not_found(client: Client) -> None:
    with pytest.raises(ApiNotFoundError) as raised:
        client.get_job(MISSING_ID)
    assert isinstance(raised.value, NotFoundError)
    assert raised.value.status == 404 and MISSING_ID in raised.value.problem.detail


def test_get_job__ids_are_quoted_into_one_path_segment(client: Client) -> None:
    with pytest.raises(ApiNotFoundError):
        client.get_job("../tasks")  # not GET /tasks
    with pytest.raises(ValueError, match="job_id"):
        client.get_job("")


def test_list_jobs__pages_filters_and_iter_jobs_follows_the_cursors(own_client: Client) -> None:
    ids = [own_client.create_job("echo", cron="0 3 * * *").id for _ in range(5)]
    own_client.pause(ids[0])
    first = own_client.list_jobs(limit=2)
    assert [j.id for j in first.items] == ids[:2]
    assert first.next_cursor is not None
    second = own_client.list_jobs(limit=2, cursor=first.next_cursor)
    assert [j.id for j in second.items] == ids[2:4]
    assert [j.id for j in own_client.iter_jobs(page_size=2)] == ids
    assert [j.id for j in own_client.iter_jobs(status=JobStatus.PAUSED)] == ids[:1]
    assert [j.id for j in own_client.iter_jobs(task="fail")] == []


def test_list_jobs__a_cursor_it_did_not_issue_is_a_validation_error(client: Client) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.list_jobs(cursor="bogus")
    assert (raised.value.status, raised.value.field) == (400, "cursor")


def test_update_job__changes_schedule_params_and_policies(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    updated = client.update_job(
        job.id, cron="0 4 * * *", timezone="Asia/Tokyo", params={"v": 2}, priority=-3
    )
    assert (updated.schedule.expression, updated.schedule.timezone) == ("0 4 * * *", "Asia/Tokyo")
    assert (updated.params, updated.priority) == ({"v": 2}, -3)
    assert updated.next_fire_at is not None and updated.next_fire_at.hour == 19  # 04:00 JST


def test_update_job__invalid_value_names_the_field(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    with pytest.raises(ApiValidationError) as raised:
        client.update_job(job.id, cron="nope")
    assert raised.value.field == "schedule.expression"


def test_pause_resume_cancel__and_resuming_a_cancelled_job_is_a_conflict(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    assert client.pause(job.id).status is JobStatus.PAUSED
    assert client.resume(job.id).status is JobStatus.ACTIVE
    assert client.cancel(job.id).status is JobStatus.CANCELLED
    with pytest.raises(ApiConflictError) as raised:
        client.resume(job.id)
    assert isinstance(raised.value, ConflictError)
    assert raised.value.status == 409 and "cancelled" in raised.value.problem.detail
    with pytest.raises(ApiConflictError):
        client.run_now(job.id)


def test_run_now__creates_a_manual_execution(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    execution = client.run_now(job.id)
    assert isinstance(execution, ExecutionInfo)
    assert (execution.job_id, execution.trigger) == (job.id, Trigger.MANUAL)
    done = wait_for(
        lambda: client.get_execution(execution.id),
        lambda e: e.status.is_final,
        "the manual run",
    )
    assert done.status is ExecutionStatus.SUCCEEDED


# --- executions -----------------------------------------------------------------------------
def test_list_executions__newest_first_paged_filtered_and_iterated(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    runs = [client.run_now(job.id) for _ in range(3)]
    page = client.list_executions(job.id, limit=2)
    assert len(page.items) == 2 and page.next_cursor is not None
    every = list(client.iter_executions(job.id, page_size=2))
    assert {e.id for e in runs} <= {e.id for e in every}
    assert [e.scheduled_for for e in every] == sorted(
        (e.scheduled_for for e in every), reverse=True
    )
    manual = list(client.iter_executions(job.id, since=runs[0].scheduled_for))
    assert {e.id for e in runs} <= {e.id for e in manual}
    assert all(e.scheduled_for >= runs[0].scheduled_for for e in manual)


def test_list_executions__unknown_job_and_bad_status(client: Client) -> None:
    with pytest.raises(ApiNotFoundError):
        client.list_executions(MISSING_ID)
    job = client.create_job("echo", cron="0 3 * * *")
    with pytest.raises(ApiValidationError) as raised:
        client.list_executions(job.id, status="sleeping")
    assert raised.value.field == "status"


def test_get_execution__unknown_id_is_not_found(client: Client) -> None:
    with pytest.raises(ApiNotFoundError):
        client.get_execution(MISSING_ID)


# --- dead letters ---------------------------------------------------------------------------
def test_dead_letters__list_replay_and_drop(own_client: Client) -> None:
    dead = dead_letter(own_client)
    assert (dead.task, dead.attempts, dead.last_error) == ("fail", 1, "RuntimeError: boom 1")
    assert [d.id for d in own_client.list_dead_letters().items] == [dead.id]
    replayed = own_client.replay_dead_letter(dead.id)
    assert (replayed.id, replayed.status) == (dead.id, ExecutionStatus.SCHEDULED)
    again = wait_for(
        lambda: own_client.list_dead_letters().items, bool, "the replay to fail into the DLQ"
    )
    assert [d.id for d in again] == [dead.id]
    assert own_client.drop_dead_letter(dead.id) is None
    assert own_client.list_dead_letters().items == []
    with pytest.raises(ApiNotFoundError):
        own_client.drop_dead_letter(dead.id)
    with pytest.raises(ApiNotFoundError):
        own_client.replay_dead_letter(MISSING_ID)


# --- tasks, preview, audit, health ----------------------------------------------------------
def test_list_tasks__registered_tasks_with_their_defaults(client: Client) -> None:
    tasks = client.list_tasks()
    assert [t.name for t in tasks.items] == ["echo", "fail"]
    assert (tasks.items[0].max_attempts, tasks.items[0].timeout) == (5, 30.0)
    assert tasks.next_cursor is None


def test_preview__flags_the_dst_gap(client: Client) -> None:
    preview = client.preview(
        "30 2 * * *",
        timezone="Europe/Berlin",
        after=datetime(2026, 3, 27, 12, tzinfo=UTC),
        count=3,
    )
    assert [(f.at, f.dst) for f in preview.fire_times] == [
        (datetime(2026, 3, 28, 1, 30, tzinfo=UTC), None),
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), "gap"),
        (datetime(2026, 3, 30, 0, 30, tzinfo=UTC), None),
    ]


def test_preview__an_offset_with_plus_survives_the_query_string(client: Client) -> None:
    preview = client.preview("0 12 * * *", after="2026-06-01T13:00:00+02:00", count=1)
    assert preview.fire_times[0].at == datetime(2026, 6, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"expression": "0 3 * *"}, "expression"),
        ({"expression": "0 3 * * *", "timezone": "Mars/Base"}, "timezone"),
        ({"expression": "0 3 * * *", "count": 0}, "count"),
        ({"expression": "0 3 * * *", "after": "yesterday"}, "after"),
    ],
)
def test_preview__invalid_input_names_the_field(
    client: Client, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ApiValidationError) as raised:
        client.preview(**kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field


def test_audit__reconciles_fire_times_with_records(client: Client) -> None:
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    job = finished(client, client.create_job("echo", at=at).id)
    since = at - timedelta(minutes=1)
    report = client.audit(job.id, since=since)
    assert report.job_id == job.id
    assert (report.expected, report.missing, report.records) == (1, [], {"succeeded": 1})
    assert report.since == since
    assert report.until.tzinfo is not None


def test_audit__a_now_job_that_ran_is_not_missing(client: Client) -> None:
    job = finished(client, client.create_job("echo").id)
    report = client.audit(job.id)
    assert (report.expected, report.missing, report.records) == (1, [], {"succeeded": 1})


def test_audit__invalid_range_and_unknown_job(client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    with pytest.raises(ApiValidationError) as raised:
        client.audit(job.id, since="2026-01-02T00:00:00Z", until="2026-01-01T00:00:00Z")
    assert raised.value.field == "since"
    with pytest.raises(ApiValidationError) as raised:
        client.audit(job.id, until="noon")
    assert raised.value.field == "until"
    with pytest.raises(ApiNotFoundError):
        client.audit(MISSING_ID)


def test_health_and_ready(client: Client) -> None:
    assert client.health().status == "ok"
    ready = client.ready()
    assert (ready.status, ready.checks) == ("ready", {"store": "ok", "store_writes": "ok"})


# --- auth and connection --------------------------------------------------------------------
def test_auth__a_missing_or_wrong_key_is_401_and_a_reader_may_not_write(live: LiveNode) -> None:
    _, writer_key = live.app.create_api_key("acme", "writer")
    _, reader_key = live.app.create_api_key("acme", "reader")
    with Client(live.url) as anonymous, Client(live.url, "onb_x_wrong") as wrong:
        with pytest.raises(AuthenticationError) as raised:
            anonymous.list_jobs()
        assert raised.value.status == 401 and raised.value.errors[0].field == "Authorization"
        with pytest.raises(AuthenticationError):
            wrong.get_job(MISSING_ID)
        assert anonymous.health().status == "ok"  # public
    with Client(live.url, writer_key) as writer, Client(live.url, reader_key) as reader:
        job = writer.create_job("echo", cron="0 3 * * *")
        assert reader.get_job(job.id).id == job.id
        with pytest.raises(PermissionDeniedError) as denied:
            reader.pause(job.id)
        assert denied.value.status == 403


def test_auth__another_tenants_job_is_not_found(live: LiveNode) -> None:
    _, acme = live.app.create_api_key("acme", "admin")
    _, globex = live.app.create_api_key("globex", "admin")
    with Client(live.url, acme) as mine, Client(live.url, globex) as theirs:
        job = mine.create_job("echo", cron="0 3 * * *")
        with pytest.raises(ApiNotFoundError):
            theirs.get_job(job.id)
        assert list(theirs.iter_jobs()) == []


def test_connection__refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url) as client, pytest.raises(ApiConnectionError) as raised:
        client.get_job("abc")
    assert f"{url}/api/v1/jobs/abc" in str(raised.value)
    assert raised.value.url == f"{url}/api/v1/jobs/abc"
    assert isinstance(raised.value, ConnectionError)


def test_create_jobs__sent_again_with_its_key_returns_the_same_jobs(own_client: Client) -> None:
    specs = [JobSpec("echo", {"n": n}) for n in range(3)]
    first = own_client.create_jobs(specs, idempotency_key="import-7")
    again = own_client.create_jobs(specs, idempotency_key="import-7")
    assert [job.id for job in again] == [job.id for job in first]
    assert len(list(own_client.iter_jobs())) == 3


def test_tenant_limits__set_then_read_back_and_none_is_the_default(client: Client) -> None:
    limits = client.set_tenant_limits("acme", max_in_flight=4, max_starts_per_second=0.5)
    assert (limits.tenant, limits.max_in_flight, limits.max_starts_per_second) == ("acme", 4, 0.5)
    assert client.get_tenant_limits("acme") == limits
    cleared = client.set_tenant_limits("acme")
    assert (cleared.max_in_flight, cleared.max_starts_per_second, cleared.running) == (
        None,
        None,
        0,
    )
    with pytest.raises(ApiValidationError):
        client.set_tenant_limits("acme", max_in_flight=-1)
