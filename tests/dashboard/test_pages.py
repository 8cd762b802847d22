"""What the pages show and what their forms do, over ASGI with a FakeClock (open mode: the rules of
access are test_access.py's)."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx

from onbeat import App
from onbeat.model import ExecutionStatus, JobStatus
from onbeat.testing import FakeClock
from tests.api.conftest import make_dead_letter, run_due
from tests.dashboard.conftest import csrf_of, post_form


def _location_job(response: httpx.Response) -> str:
    assert response.status_code == 303, response.text
    return response.headers["location"].removeprefix("/jobs/")


# --- overview ---------------------------------------------------------------------------------
async def test_overview__empty_store_says_so_instead_of_drawing_empty_charts(
    browser: httpx.AsyncClient,
) -> None:
    page = await browser.get("/")
    assert page.status_code == 200
    assert "No run ended in the last hour" in page.text
    assert "No run started and ended in the last hour" in page.text
    assert "Nothing was waiting to start in the last hour" in page.text


async def test_overview__the_last_hours_runs_failures_and_dead_letters(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    for _ in range(3):
        onbeat_app.schedule("echo")
    await make_dead_letter(onbeat_app, clock)
    clock.advance(90)
    onbeat_app.schedule("echo")
    await run_due(onbeat_app, clock)
    onbeat_app.schedule("echo")  # due now, not started: the queue
    page = (await browser.get("/")).text
    cards = dict(
        re.findall(r'<div class="label">([^<]+)</div>\s*<div class="value">([^<]+)<', page)
    )
    assert cards["Ended, 1 h"] == "5"
    assert cards["Failed, 1 h"] == "1"
    assert cards["Dead letters"] == "1"
    assert cards["Queue depth"] == "1"
    assert cards["In flight"] == "0"
    assert len(re.findall(r'<rect class="s-succeeded"', page)) == 2  # two minutes with runs
    assert len(re.findall(r'<rect class="s-failed"', page)) == 1
    assert "No run ended in the last hour" not in page


# --- jobs -------------------------------------------------------------------------------------
async def test_jobs__search_filter_and_keyset_pages(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    echo = [onbeat_app.schedule("echo", cron="* * * * *").id for _ in range(55)]
    failing = onbeat_app.schedule("fail", cron="* * * * *").id
    onbeat_app.pause(echo[3])
    first = await browser.get("/jobs")
    shown = re.findall(r'href="/jobs/([0-9a-f]{32})"', first.text)
    assert shown == sorted([*echo, failing])[:50]
    after = re.search(r'href="(/jobs\?[^"]*after=[^"]+)"', first.text)
    assert after
    second = await browser.get(after.group(1).replace("&amp;", "&"))
    assert re.findall(r'href="/jobs/([0-9a-f]{32})"', second.text) == sorted([*echo, failing])[50:]
    assert "after=" not in second.text.split("First page")[1]
    by_task = await browser.get("/jobs?q=fa")
    assert re.findall(r'href="/jobs/([0-9a-f]{32})"', by_task.text) == [failing]
    paused = await browser.get("/jobs?status=paused")
    assert re.findall(r'href="/jobs/([0-9a-f]{32})"', paused.text) == [echo[3]]


async def test_jobs__each_with_its_last_run(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    dead = await make_dead_letter(onbeat_app, clock)
    failed_job = onbeat_app.get_execution(dead).job_id
    planned = onbeat_app.schedule("echo", cron="0 * * * *").id  # its one run is still to come
    page = (await browser.get("/jobs")).text

    def last_run(job_id: str) -> str:
        return page.split(f'href="/jobs/{job_id}"')[1].split("</tr>")[0].split("</td>")[4]

    assert '<span class="badge s-failed">failed</span>' in last_run(failed_job)
    assert last_run(planned).strip().endswith('<span class="muted">-</span>')


async def test_create_job__through_the_form(browser: httpx.AsyncClient, onbeat_app: App) -> None:
    created = await post_form(
        browser,
        "/jobs",
        "/jobs",
        {
            "task": "echo",
            "kind": "cron",
            "expression": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "params": '{"to": "ops"}',
        },
    )
    job = onbeat_app.get_job(_location_job(created))
    assert (job.task, job.params) == ("echo", {"to": "ops"})
    assert (job.schedule.expression, job.schedule.timezone) == ("30 2 * * *", "Europe/Berlin")
    page = await browser.get(created.headers["location"])
    assert "Created job" in page.text


async def test_create_job__a_once_time_without_offset_is_read_in_the_time_zone(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    created = await post_form(
        browser,
        "/jobs",
        "/jobs",
        {"task": "echo", "kind": "once", "at": "2026-07-01T09:00", "timezone": "Europe/Berlin"},
    )
    job = onbeat_app.get_job(_location_job(created))
    assert job.schedule.at is not None
    assert job.schedule.at.isoformat() == "2026-07-01T07:00:00+00:00"


async def test_create_job__refused_input_is_shown_with_the_form_kept_and_nothing_stored(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    for fields, message in [
        ({"kind": "cron", "expression": "61 * * * *"}, "cron"),
        ({"kind": "cron", "expression": "* * * * *", "timezone": "Mars/Base"}, "timezone"),
        ({"kind": "now", "params": "[1, 2]"}, "params: must be a JSON object"),
        ({"kind": "now", "params": "{nope"}, "params: is not JSON"),
        ({"kind": "now", "task": "missing"}, "task"),
        ({"kind": "once", "at": "2026-07-01T09:00", "timezone": "../etc"}, "timezone"),
        ({"kind": "once", "at": "July the first"}, "at"),
    ]:
        refused = await post_form(browser, "/jobs", "/jobs", {"task": "echo", **fields})
        assert refused.status_code == 422, fields
        assert message in refused.text, refused.text
        assert '<details class="panel" id="new-job" open>' in refused.text
        if "expression" in fields:
            assert f'value="{fields["expression"]}"' in refused.text
    assert onbeat_app.list_jobs() == []


async def test_job_page__next_fire_times_flag_dst_gaps(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="30 2 29 3 *", timezone="Europe/Berlin")
    page = (await browser.get(f"/jobs/{job.id}")).text
    # 2026-03-29 02:30 does not exist in Berlin: it fires at 03:00 CEST (01:00 UTC).
    assert "2026-03-29 03:00:00 +0200" in page
    assert "DST gap" in page
    assert page.count('class="dst"') == 1


async def test_job_page__executions_with_each_attempt_and_its_error(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    dead = await make_dead_letter(onbeat_app, clock)
    job_id = onbeat_app.get_execution(dead).job_id
    page = (await browser.get(f"/jobs/{job_id}")).text
    run = page.split(f'id="run-{dead}"')[1].split("</tbody>")[0]
    assert '<span class="badge s-failed">failed</span>' in run
    assert "RuntimeError: boom 1" in run
    assert 'class="cell s-failed"' in page


async def test_job_page__the_audit_verdict(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    kept = onbeat_app.schedule("echo", cron="* * * * *")
    clock.advance(60)
    await run_due(onbeat_app, clock)  # 12:01 ran; 12:02 is planned
    page = (await browser.get(f"/jobs/{kept.id}")).text
    assert "✔ Yes: its one fire time since the job was created" in page
    clock.advance(180)  # no scheduler ran: 12:02 is planned, 12:03 and 12:04 have no record
    page = (await browser.get(f"/jobs/{kept.id}")).text
    assert "✘ No: 2 of 4 fire times" in page
    assert "2026-01-05 12:03:00 UTC, 2026-01-05 12:04:00 UTC" in page


async def test_edit__a_new_schedule_replaces_the_planned_runs(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    edited = await post_form(
        browser,
        f"/jobs/{job.id}",
        f"/jobs/{job.id}/edit",
        {"kind": "cron", "expression": "*/5 * * * *", "timezone": "UTC", "params": "{}"},
    )
    assert edited.status_code == 303
    after = onbeat_app.get_job(job.id)
    assert after.schedule.expression == "*/5 * * * *"
    [planned] = onbeat_app.list_executions(job.id)
    assert planned.scheduled_for == job.created_at + timedelta(minutes=5)
    assert "Saved the job." in (await browser.get(f"/jobs/{job.id}")).text


async def test_edit__the_same_schedule_changes_nothing(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", {"a": 1}, cron="0 * * * *")
    before = onbeat_app.list_executions(job.id)
    same = await post_form(
        browser,
        f"/jobs/{job.id}",
        f"/jobs/{job.id}/edit",
        {"kind": "cron", "expression": "0 * * * *", "timezone": "UTC", "params": '{"a": 1}'},
    )
    assert same.status_code == 303
    assert onbeat_app.list_executions(job.id) == before
    assert onbeat_app.get_job(job.id).updated_at == job.updated_at
    assert "Nothing changed." in (await browser.get(f"/jobs/{job.id}")).text


async def test_edit__refused_input_is_shown_and_nothing_changes(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    refused = await post_form(
        browser,
        f"/jobs/{job.id}",
        f"/jobs/{job.id}/edit",
        {"kind": "cron", "expression": "0 25 * * *", "timezone": "UTC", "params": "{}"},
    )
    assert refused.status_code == 422
    assert 'value="0 25 * * *"' in refused.text
    assert onbeat_app.get_job(job.id).schedule.expression == "0 * * * *"


async def test_job_buttons__pause_resume_run_now_cancel(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    page = f"/jobs/{job.id}"
    assert (await post_form(browser, page, f"{page}/pause")).status_code == 303
    assert onbeat_app.get_job(job.id).status is JobStatus.PAUSED
    shown = (await browser.get(page)).text
    assert "Paused:" in shown and f"{page}/resume" in shown and f"{page}/pause" not in shown
    refused = await post_form(browser, page, f"{page}/run")  # a paused job does not run now
    assert "resume it first" in (await browser.get(page)).text
    assert refused.status_code == 303
    assert (await post_form(browser, page, f"{page}/resume")).status_code == 303
    assert (await post_form(browser, page, f"{page}/run")).status_code == 303
    manual = [e for e in onbeat_app.list_executions(job.id) if e.trigger.value == "manual"]
    assert len(manual) == 1
    assert (await post_form(browser, page, f"{page}/cancel")).status_code == 303
    assert onbeat_app.get_job(job.id).status is JobStatus.CANCELLED
    assert f"{page}/edit" not in (await browser.get(page)).text


async def test_dead_letters__replay_and_drop(
    browser: httpx.AsyncClient, onbeat_app: App, clock: FakeClock
) -> None:
    replayed = await make_dead_letter(onbeat_app, clock)
    dropped = await make_dead_letter(onbeat_app, clock)
    listing = (await browser.get("/dead-letters")).text
    assert replayed in listing and dropped in listing
    assert "RuntimeError: boom 1" in listing
    assert (
        await post_form(browser, "/dead-letters", f"/dead-letters/{replayed}/replay")
    ).status_code == 303
    assert onbeat_app.get_execution(replayed).status is ExecutionStatus.SCHEDULED
    assert (
        await post_form(browser, "/dead-letters", f"/dead-letters/{dropped}/drop")
    ).status_code == 303
    assert onbeat_app.list_dead_letters() == []
    assert "No dead letters" in (await browser.get("/dead-letters")).text


async def test_preview__next_fire_times_with_dst_flags_or_the_error(
    browser: httpx.AsyncClient,
) -> None:
    gap = await browser.get(
        "/preview",
        params={"kind": "cron", "expression": "30 2 29 3 *", "timezone": "Europe/Berlin"},
    )
    assert "DST gap" in gap.text and "2026-03-29 03:00:00 +0200" in gap.text
    bad = await browser.get("/preview", params={"kind": "cron", "expression": "nope"})
    assert 'class="notice error"' in bad.text
    once = await browser.get(
        "/preview", params={"kind": "once", "at": "2026-07-01T09:00", "timezone": "Europe/Berlin"}
    )
    assert "2026-07-01 09:00:00 +0200" in once.text


async def test_live_refresh__keeps_the_notice_for_the_page_it_was_meant_for(
    browser: httpx.AsyncClient, onbeat_app: App
) -> None:
    job = onbeat_app.schedule("echo", cron="0 * * * *")
    page = await browser.get(f"/jobs/{job.id}")
    await browser.post(f"/jobs/{job.id}/pause", data={"csrf": csrf_of(page)})
    refreshed = await browser.get(f"/jobs/{job.id}", headers={"X-Onbeat-Refresh": "1"})
    assert "Paused:" not in refreshed.text
    assert "Paused:" in (await browser.get(f"/jobs/{job.id}")).text
    assert "Paused:" not in (await browser.get(f"/jobs/{job.id}")).text
