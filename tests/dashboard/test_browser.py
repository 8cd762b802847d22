"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against a
real ``onbeat up``. Create a job through the UI and see it run; pause, resume, edit (with the live
preview), run now and cancel; replay a dead letter; log in with a reader key and find no action
that works. Every page is saved as a screenshot in ``test-artifacts/screenshots/``.

Playwright's own browser downloads are never used (``playwright install`` is not run): the tests
need ``/usr/bin/chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it) and fail,
not skip, without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import REPO, Node, onbeat, running_node

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
RUN_TIMEOUT_MS = 15_000
"""A run is seen through the page's live refresh (every 5 s), so allow a few refreshes."""

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    pytest.fail("playwright is not installed: pip install -e '.[dev]'", pytrace=False)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} not found: the browser tests drive Debian's chromium "
            "(apt-get update && apt-get install -y chromium; .ci/run does it)",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node with no API key: the dashboard is open (on loopback)."""
    with running_node(tmp_path_factory.mktemp("dashboard-node")) as started:
        yield started


@pytest.fixture
def page(browser: Browser, node: Node) -> Iterator[Page]:
    context = browser.new_context(base_url=node.url, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.on("dialog", lambda dialog: dialog.accept())  # the "are you sure?" of cancel and drop
    yield opened
    context.close()


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def create_job(page: Page, task: str, kind: str, expression: str = "", params: str = "{}") -> str:
    """Fill in and submit the New job form; returns the new job's id (from the page it lands on)."""
    page.goto("/jobs")
    page.locator("#new-job summary").click()
    form = page.locator("#new-job form")
    form.locator("select[name=task]").select_option(task)
    form.locator("select[name=kind]").select_option(kind)
    if expression:
        form.locator("input[name=expression]").fill(expression)
        expect(page.locator("#create-preview table")).to_be_visible()
    form.locator("textarea[name=params]").fill(params)
    form.get_by_role("button", name="Create job").click()
    expect(page.locator(".notice.ok")).to_contain_text("Created job")
    found = re.search(r"/jobs/([0-9a-f]{32})$", page.url)
    assert found, page.url
    return found.group(1)


def test_create_a_job_and_see_it_run(page: Page) -> None:
    job_id = create_job(page, "echo", "now", params='{"greeting": "hello"}')
    run = page.locator("table.executions tr.run").first
    expect(run.locator(".badge")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#audit")).to_contain_text("✔ Yes")
    expect(page.locator(".definition")).to_contain_text('"greeting": "hello"')
    screenshot(page, "job")
    page.goto("/jobs")
    expect(page.locator(f'a[href="/jobs/{job_id}"]')).to_be_visible()
    screenshot(page, "jobs")


def test_pause_resume_edit_run_now_and_cancel(page: Page) -> None:
    create_job(page, "echo", "cron", expression="0 * * * *")
    status = page.locator("#job-status .badge")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".notice.ok")).to_contain_text("Paused")
    expect(status).to_have_text("paused")
    page.get_by_role("button", name="Resume").click()
    expect(status).to_have_text("active")

    page.locator("#edit summary").click()
    edit = page.locator("#edit form")
    edit.locator("input[name=expression]").fill("30 2 * * *")
    edit.locator("input[name=timezone]").fill("Europe/Berlin")
    preview = page.locator("#edit-preview")
    expect(preview).to_contain_text("02:30:00 +0")  # local fire times, as the user typed them
    screenshot(page, "job-edit-preview")
    edit.get_by_role("button", name="Save").click()
    expect(page.locator(".notice.ok")).to_contain_text("Saved the job.")
    expect(page.locator(".definition")).to_contain_text("cron 30 2 * * * (Europe/Berlin)")

    page.get_by_role("button", name="Run now").click()
    expect(page.locator(".notice.ok")).to_contain_text("Started a run now")
    manual = page.locator("table.executions tr.run", has_text="manual").first
    expect(manual.locator(".badge")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)

    page.get_by_role("button", name="Cancel").click()  # confirmed by the dialog handler
    expect(status).to_have_text("cancelled")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)


def test_live_refresh_shows_a_change_made_elsewhere(page: Page, node: Node) -> None:
    job_id = create_job(page, "echo", "cron", expression="0 * * * *")
    with node.client() as client:
        client.pause(job_id)  # not through this page: only its live refresh can show it
    expect(page.locator("#job-status .badge")).to_have_text("paused", timeout=RUN_TIMEOUT_MS)
    expect(page.locator(".live-state")).to_contain_text("live")


def test_replay_a_dead_letter(page: Page) -> None:
    job_id = create_job(page, "fail", "now")
    expect(page.locator("table.executions tr.run .badge").first).to_have_text(
        "failed", timeout=RUN_TIMEOUT_MS
    )
    page.goto("/dead-letters")
    row = page.locator("table.list tbody tr", has=page.locator(f'a[href="/jobs/{job_id}"]'))
    expect(row).to_contain_text("RuntimeError: boom on attempt 1")
    screenshot(page, "dead-letters")
    row.get_by_role("button", name="Replay").click()
    expect(page.locator(".notice.ok")).to_contain_text("Replaying")
    page.goto(f"/jobs/{job_id}")
    # The replayed run fails again: both attempts are on record, the second after the replay.
    attempts = page.locator("table.executions tr.attempt")
    expect(attempts).to_have_count(2, timeout=RUN_TIMEOUT_MS)


def test_overview_charts_show_the_runs(page: Page) -> None:
    create_job(page, "echo", "now")
    expect(page.locator("table.executions tr.run .badge").first).to_have_text(
        "succeeded", timeout=RUN_TIMEOUT_MS
    )
    page.goto("/")
    expect(page.locator("svg.chart rect.s-succeeded").first).to_be_attached()
    expect(page.locator("svg.chart path.p50")).to_be_attached()
    screenshot(page, "overview")


def test_reader_key_sees_everything_and_can_change_nothing(
    browser: Browser, tmp_path: Path
) -> None:
    with running_node(tmp_path) as keyed, keyed.client(_create_key(keyed, "writer")) as client:
        reader = _create_key(keyed, "reader")
        job = client.create_job("echo", {}, cron="0 * * * *")
        context = browser.new_context(base_url=keyed.url, viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(f"/jobs/{job.id}")
        expect(page).to_have_url(re.compile(r"/login\?next="))
        screenshot(page, "login")
        page.locator("input[name=key]").fill(reader)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(re.compile(f"/jobs/{job.id}$"))
        expect(page.locator(".who")).to_contain_text("tenant default · reader")
        for name in ("Pause", "Run now", "Cancel"):
            expect(page.get_by_role("button", name=name)).to_have_count(0)
        expect(page.locator("#edit")).to_have_count(0)
        screenshot(page, "job-reader")
        assert reader not in page.content() and reader not in page.url
        token = page.locator("input[name=csrf]").first.get_attribute("value")
        assert token
        forced = page.request.post(f"/jobs/{job.id}/pause", form={"csrf": token})
        assert forced.status == 403
        assert "reader key" in forced.text()
        assert client.get_job(job.id).status == "active"
        context.close()


def _create_key(node: Node, role: str) -> str:
    created = onbeat(
        "keys", "create", "--tenant", "default", "--role", role, "--database-url", node.database_url
    )
    assert created.returncode == 0, created.stderr
    return created.stdout.strip().splitlines()[-1]
