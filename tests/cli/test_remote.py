"""The real ``onbeat`` command (a subprocess) against a real ``onbeat up`` process: tables,
``--json``, exit codes and the messages for bad input and API errors.

Independent commands of a test run at once (``onbeat_all``): each is mostly interpreter start-up.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from onbeat.client import Client, JobDetail
from tests.cli.conftest import Node, onbeat, onbeat_all, running_node
from tests.client.conftest import free_port

pytestmark = pytest.mark.slow
T = TypeVar("T")
MISSING_ID = "0123456789abcdef0123456789abcdef"
ID = re.compile(r"[0-9a-f]{32}")
EXECUTION_COLUMNS = ["ID", "TRIGGER", "SCHEDULED FOR", "STATUS", "ATTEMPTS", "ERROR / REASON"]


def ok(*args: str, node: Node) -> str:
    result = onbeat(*args, url=node.url)
    assert result.returncode == 0, result.stderr
    return result.stdout


def ok_json(*args: str, node: Node) -> Any:
    return json.loads(ok(*args, "--json", node=node))


def wait_for(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 10) -> T:
    deadline = time.monotonic() + timeout
    while not done(value := read()):
        assert time.monotonic() < deadline, f"timed out; last: {value!r}"
        time.sleep(0.05)
    return value


def finished(client: Client, job_id: str) -> JobDetail:
    return wait_for(
        lambda: client.get_job(job_id),
        lambda j: bool(j.executions) and j.executions[0].status.is_final,
    )


def past_once_job(client: Client) -> tuple[datetime, JobDetail]:
    """A one-shot job due 5 s ago, once it has run."""
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    return at, finished(client, client.create_job("echo", at=at).id)


def assert_aligned(table: str, columns: list[str]) -> list[list[str]]:
    """``table`` has a header line with ``columns`` and every row's cells start where its column
    header does, two spaces after the previous cell; returns the rows' cells."""
    header, *rows = table.splitlines()
    starts = [header.index(c) for c in columns]
    assert starts == sorted(starts) and header.split() == " ".join(columns).split(), header
    cells = []
    for row in rows:
        row_cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        assert all(row[s - 2 : s] == "  " for s in starts[1:]) and all(row_cells), row
        cells.append(row_cells)
    return cells


@pytest.fixture
def client(node: Node) -> Iterator[Client]:
    with node.client() as c:
        yield c


# --- jobs add -------------------------------------------------------------------------------
def test_jobs_add__prints_the_job_and_json_prints_the_api_document(node: Node) -> None:
    text, as_json = onbeat_all(
        [
            *("jobs", "add", "echo", "--params", '{"to": "ops@example.com"}', "--cron"),
            *("30 2 * * *", "--tz", "Europe/Berlin", "--priority", "5", "--overlap", "queue"),
        ],
        ["jobs", "add", "echo", "--at", "2099-01-01T10:00:00+01:00", "--json"],
        url=node.url,
    )
    assert text.returncode == 0, text.stderr
    first, blank, *fields = text.stdout.splitlines()
    assert re.fullmatch(r"created job [0-9a-f]{32}", first) and blank == ""
    assert all(line[10:12] == "  " and line[12] != " " for line in fields)  # one value column
    view = {line[:10].strip(): line[12:] for line in fields}
    assert (view["task"], view["status"]) == ("echo", "active")
    assert view["schedule"] == "cron 30 2 * * * (Europe/Berlin)"
    assert view["params"] == '{"to": "ops@example.com"}'
    assert "overlap=queue" in view["policies"] and "priority=5" in view["policies"]
    assert len(view["next fires"].split(", ")) == 5
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["schedule"] == {
        "type": "once",
        "expression": None,
        "at": "2099-01-01T09:00:00Z",
        "timezone": "UTC",
    }
    assert ID.fullmatch(doc["id"]) and doc["next_fire_at"] == "2099-01-01T09:00:00Z"


def test_jobs_add__idempotency_key_returns_the_first_job(node: Node) -> None:
    args = ["jobs", "add", "echo", "--cron", "0 3 * * *", "--idempotency-key", "cli-1", "--json"]
    first, retry = onbeat_all(args, args, url=node.url)  # even when the retry races the first
    assert json.loads(first.stdout)["id"] == json.loads(retry.stdout)["id"]


def test_jobs_add__invalid_values_print_the_fields_and_exit_1(node: Node) -> None:
    bad_cron, two_bad, unknown_task = onbeat_all(
        ["jobs", "add", "echo", "--cron", "61 * * * *"],
        ["jobs", "add", "echo", "--priority", "500", "--timeout", "0", "--json"],
        ["jobs", "add", "nope"],
        url=node.url,
    )
    assert (bad_cron.returncode, bad_cron.stdout) == (1, "")
    assert bad_cron.stderr == (
        "Error: Invalid request (HTTP 422): schedule.expression: invalid expression "
        "'61 * * * *': minute value 61 out of range 0-59\n"
    )
    assert (two_bad.returncode, two_bad.stdout) == (1, "")
    first, *errors = two_bad.stderr.splitlines()
    assert first == "Error: Invalid request (HTTP 422): 2 inputs are invalid: priority, timeout"
    assert sorted(e.split(":")[0] for e in errors) == ["  priority", "  timeout"]
    assert unknown_task.returncode == 1
    assert "(HTTP 422): task: unknown task 'nope'" in unknown_task.stderr


def test_jobs_add__bad_input_is_a_usage_error_before_any_request() -> None:
    cases = {
        ("--params", "[1, 2]"): "Invalid value for '--params': must be a JSON object",
        ("--params", "{nope"): "Invalid value for '--params': is not valid JSON",
        ("--params", '{"a": NaN}'): "is not valid JSON: NaN is not a JSON number",
        ("--cron", "* * * * *", "--at", "2099-01-01T00:00:00Z"): "give --cron or --at, not both",
        ("--overlap", "sometimes"): "Invalid value for '--overlap'",
        ("--priority", "high"): "Invalid value for '--priority'",
    }
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing is sent
    results = onbeat_all(*(["jobs", "add", "echo", *a] for a in cases), url=unreachable)
    for result, message in zip(results, cases.values(), strict=True):
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Usage: " in result.stderr


# --- jobs list / show -----------------------------------------------------------------------
def test_jobs_list__an_aligned_table_of_full_ids(node: Node, client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *", timezone="Asia/Tokyo")
    rows = assert_aligned(
        ok("jobs", "list", "--all", node=node), ["ID", "TASK", "STATUS", "SCHEDULE", "NEXT FIRE"]
    )
    assert [job.id, "echo", "active", "cron 0 3 * * * (Asia/Tokyo)"] in [r[:4] for r in rows]
    assert all(ID.fullmatch(r[0]) for r in rows)


def test_jobs_list__filters_pages_and_json(node: Node, client: Client) -> None:
    job = client.create_job("echo", cron="0 3 * * *")
    client.pause(job.id)
    paused, one, none = onbeat_all(
        ["jobs", "list", "--status", "paused", "--all", "--json"],
        ["jobs", "list", "--limit", "1"],
        ["jobs", "list", "--task", "nope"],
        url=node.url,
    )
    doc = json.loads(paused.stdout)
    assert job.id in [j["id"] for j in doc["items"]] and doc["next_cursor"] is None
    assert {j["status"] for j in doc["items"]} == {"paused"}
    assert one.returncode == 0 and len(one.stdout.splitlines()) == 2
    cursor = re.fullmatch(r"more jobs: pass --cursor (\S+) \(or --all\)\n", one.stderr)
    assert cursor is not None
    page = ok_json("jobs", "list", "--limit", "1", "--cursor", cursor[1], node=node)
    assert set(page) == {"items", "next_cursor"} and len(page["items"]) == 1
    assert none.stdout == "no jobs\n"


def test_jobs_list__a_bad_cursor_or_limit_is_refused_by_the_api(node: Node) -> None:
    cursor, limit = onbeat_all(
        ["jobs", "list", "--cursor", "bogus"], ["jobs", "list", "--limit", "0"], url=node.url
    )
    assert cursor.returncode == 1
    assert cursor.stderr.startswith("Error: Invalid cursor (HTTP 400): cursor is not a cursor")
    assert limit.returncode == 1 and "(HTTP 422): limit: " in limit.stderr


def test_jobs_show__the_job_and_its_recent_executions(node: Node, client: Client) -> None:
    job = finished(client, client.create_job("echo", {"n": 1}).id)
    text, as_json, missing = onbeat_all(
        ["jobs", "show", job.id],
        ["jobs", "show", job.id, "--json"],
        ["jobs", "show", MISSING_ID],
        url=node.url,
    )
    fields, executions = text.stdout.split("\n\nrecent executions (newest first):\n")
    assert fields.splitlines()[0] == f"id          {job.id}"
    [row] = assert_aligned(executions, EXECUTION_COLUMNS)
    assert row[:2] == [job.executions[0].id, "schedule"] and row[3:] == ["succeeded", "1", "-"]
    assert json.loads(as_json.stdout)["executions"][0]["result"] == {"n": 1}
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == f"Error: Not found (HTTP 404): job '{MISSING_ID}' not found\n"


# --- jobs edit / pause / resume / run / cancel ----------------------------------------------
def test_jobs_edit__changes_the_schedule_and_policies(node: Node, client: Client) -> None:
    job, other = (client.create_job("echo", cron="0 3 * * *") for _ in range(2))
    edited, rezoned, nothing, bad = onbeat_all(
        ["jobs", "edit", job.id, "--cron", "0 4 * * *", "--priority", "9"],
        ["jobs", "edit", other.id, "--tz", "Asia/Tokyo", "--json"],
        ["jobs", "edit", job.id],
        ["jobs", "edit", job.id, "--at", "tomorrow"],
        url=node.url,
    )
    assert edited.stdout.startswith(f"updated job {job.id}\n")
    assert "cron 0 4 * * * (UTC)" in edited.stdout and "priority=9" in edited.stdout
    assert json.loads(rezoned.stdout)["schedule"] == {
        "type": "cron",
        "expression": "0 3 * * *",
        "at": None,
        "timezone": "Asia/Tokyo",
    }
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    assert bad.returncode == 1 and "(HTTP 422): schedule.at: " in bad.stderr


def test_jobs_pause_resume_run_cancel__and_a_conflict_exits_1(node: Node, client: Client) -> None:
    paused, ran, cancelled = (client.create_job("echo", cron="0 3 * * *").id for _ in range(3))
    pause, run, cancel = onbeat_all(
        ["jobs", "pause", paused],
        ["jobs", "run", ran],
        ["jobs", "cancel", cancelled, "--json"],
        url=node.url,
    )
    assert pause.stdout == f"paused job {paused}: status paused\n"
    assert re.fullmatch(
        rf"started execution [0-9a-f]{{32}} of job {ran}: status \w+, due \S+Z\n", run.stdout
    )
    assert json.loads(cancel.stdout)["status"] == "cancelled"
    resume, conflict = onbeat_all(
        ["jobs", "resume", paused], ["jobs", "resume", cancelled], url=node.url
    )
    assert resume.stdout == f"resumed job {paused}: status active\n"
    assert (conflict.returncode, conflict.stdout) == (1, "")
    assert conflict.stderr.startswith("Error: Conflict (HTTP 409): ")
    assert "cancelled" in conflict.stderr


# --- executions -----------------------------------------------------------------------------
def test_executions_list_and_show(node: Node, client: Client) -> None:
    job = finished(client, client.create_job("fail").id)
    execution_id = job.executions[0].id
    listed, succeeded, shown, as_json, missing = onbeat_all(
        ["executions", "list", job.id],
        ["executions", "list", job.id, "--status", "succeeded", "--json"],
        ["executions", "show", execution_id],
        ["executions", "show", execution_id, "--json"],
        ["executions", "show", MISSING_ID],
        url=node.url,
    )
    rows = assert_aligned(listed.stdout, EXECUTION_COLUMNS)
    assert rows == [
        [execution_id, "schedule", rows[0][2], "failed", "1", "RuntimeError: boom on attempt 1"]
    ]
    assert json.loads(succeeded.stdout) == {"items": [], "next_cursor": None}
    fields, attempts = shown.stdout.split("\n\nattempts:\n")
    assert f"job            {job.id}" in fields.splitlines()
    assert "last error     RuntimeError: boom on attempt 1" in fields.splitlines()
    [attempt] = assert_aligned(attempts, ["#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"])
    assert attempt[0] == "1" and attempt[4:] == ["failed", "RuntimeError: boom on attempt 1"]
    assert json.loads(as_json.stdout)["attempt"] == 1
    assert missing.returncode == 1 and "Not found (HTTP 404)" in missing.stderr


# --- dead letters ---------------------------------------------------------------------------
def test_dlq_list_replay_drop(node: Node, client: Client) -> None:
    listed, replayed, dropped = (finished(client, client.create_job("fail").id) for _ in range(3))
    dead = [job.executions[0].id for job in (listed, replayed, dropped)]
    table, replay, drop, missing = onbeat_all(
        ["dlq", "list", "--all"],
        ["dlq", "replay", dead[1]],
        ["dlq", "drop", dead[2], "--json"],
        ["dlq", "drop", MISSING_ID],
        url=node.url,
    )
    rows = assert_aligned(table.stdout, ["ID", "JOB", "TASK", "ATTEMPTS", "CREATED", "LAST ERROR"])
    assert [dead[0], listed.id, "fail", "1"] in [r[:4] for r in rows]
    assert replay.stdout.startswith(f"replayed dead letter {dead[1]}: execution {dead[1]} is ")
    assert json.loads(drop.stdout) == {"id": dead[2], "dropped": True}
    assert dead[2] not in [d.id for d in client.iter_dead_letters()]
    assert missing.returncode == 1
    assert missing.stderr == f"Error: Not found (HTTP 404): dead letter '{MISSING_ID}' not found\n"


# --- preview and audit ----------------------------------------------------------------------
def test_preview__local_times_dst_flags_json_and_invalid_input(node: Node) -> None:
    table, as_json, *invalid = onbeat_all(
        [
            *("preview", "30 2 * * *", "--tz", "Europe/Berlin"),
            *("--after", "2026-03-27T00:00:00Z", "--count", "4"),
        ],
        ["preview", "0 0 * * *", "--after", "2026-01-01T00:00:00+01:00", "--json"],
        ["preview", "0 3 * *"],
        ["preview", "0 3 * * *", "--tz", "Mars/Base"],
        ["preview", "0 3 * * *", "--count", "0"],
        url=node.url,
    )
    assert table.stdout == (
        "#  AT (UTC)              LOCAL (Europe/Berlin)     DST\n"
        "1  2026-03-27T01:30:00Z  2026-03-27 02:30:00 CET   -\n"
        "2  2026-03-28T01:30:00Z  2026-03-28 02:30:00 CET   -\n"
        "3  2026-03-29T01:00:00Z  2026-03-29 03:00:00 CEST  gap\n"
        "4  2026-03-30T00:30:00Z  2026-03-30 02:30:00 CEST  -\n"
    )
    doc = json.loads(as_json.stdout)
    assert len(doc["fire_times"]) == 10 and doc["fire_times"][0]["at"] == "2026-01-01T00:00:00Z"
    for result, field in zip(invalid, ["expression", "timezone", "count"], strict=True):
        assert result.returncode == 1
        assert f"(HTTP 422): {field}: " in result.stderr


def test_audit__summary_json_and_check(node: Node, client: Client) -> None:
    (at, job), (lost_at, lost) = past_once_job(client), past_once_job(client)
    lose_records(node, lost.executions[0].id)  # as if the run had never been recorded
    since, lost_since = ((t - timedelta(minutes=1)).isoformat() for t in (at, lost_at))
    text, as_json, bad, missing = onbeat_all(
        ["audit", job.id, "--since", since, "--check"],
        ["audit", job.id, "--since", since, "--json"],
        ["audit", job.id, "--since", "yesterday"],
        ["audit", lost.id, "--since", lost_since, "--check"],
        url=node.url,
    )
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"job       {job.id}"
    assert lines[1].startswith(f"range     {_utc(at - timedelta(minutes=1))} .. ")
    assert lines[2:] == ["expected  1 fire times", "records   succeeded=1", "missing   none"]
    doc = json.loads(as_json.stdout)
    assert (doc["expected"], doc["missing"], doc["records"]) == (1, [], {"succeeded": 1})
    assert bad.returncode == 1 and "(HTTP 422): since: " in bad.stderr
    assert missing.returncode == 1
    assert missing.stdout.splitlines()[-2:] == ["records   none", f"missing   {_utc(lost_at)}"]
    assert missing.stderr == "Error: 1 of 1 fire times have no execution record\n"


def _utc(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


def lose_records(node: Node, execution_id: str) -> None:
    path = node.database_url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db, db:
        db.execute("DELETE FROM attempts WHERE execution_id = ?", (execution_id,))
        db.execute("DELETE FROM dead_letters WHERE execution_id = ?", (execution_id,))
        db.execute("DELETE FROM runs WHERE id = ?", (execution_id,))
        db.execute("DELETE FROM execution_history WHERE id = ?", (execution_id,))


# --- connection and auth --------------------------------------------------------------------
def test_connection__unreachable_server_bad_url_and_the_url_flag(node: Node) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    refused, bad_url, flag_wins, empty_id = onbeat_all(
        ["jobs", "list"],
        ["jobs", "list", "--url", "localhost:8000"],
        ["preview", "@daily", "--url", node.url],
        ["jobs", "show", ""],
        url=unreachable,
    )
    assert empty_id.returncode == 2 and "job_id must be a non-empty string" in empty_id.stderr
    assert (refused.returncode, refused.stdout) == (1, "")
    assert f"cannot reach the onbeat API at {unreachable}/api/v1/jobs" in refused.stderr
    assert "--url or ONBEAT_URL" in refused.stderr
    assert bad_url.returncode == 2 and "not an http(s) URL" in bad_url.stderr
    assert flag_wins.returncode == 0, flag_wins.stderr


def test_auth__keys_from_the_flag_or_the_environment(tmp_path: Path) -> None:
    with running_node(tmp_path) as secured:
        created = onbeat(
            *("keys", "create", "--tenant", "acme", "--role", "reader"),
            *("--database-url", secured.database_url),
        )
        assert created.returncode == 0, created.stderr
        key = created.stdout.splitlines()[-1]
        anonymous, listed, denied, wrong = onbeat_all(
            ["jobs", "list", "--api-key", ""],
            ["jobs", "list", "--json"],
            ["jobs", "add", "echo", "--api-key", key],
            ["jobs", "list", "--api-key", "onb_nope_nope"],
            url=secured.url,
            env={"ONBEAT_API_KEY": key},
        )
    assert anonymous.returncode == 1
    assert anonymous.stderr.startswith("Error: Unauthorized (HTTP 401): Authorization ")
    assert anonymous.stderr.endswith("\nPass an API key with --api-key or ONBEAT_API_KEY.\n")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"items": [], "next_cursor": None}
    assert denied.returncode == 1
    assert denied.stderr.startswith("Error: Forbidden (HTTP 403): Authorization is a reader")
    assert wrong.returncode == 1 and "unknown or revoked" in wrong.stderr
