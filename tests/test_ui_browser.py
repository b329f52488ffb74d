"""The operator UI in a real headless Chromium (Debian's package, driven by Playwright):
an operator finds a failed job, reads its traceback, retries it and sees it complete;
follows the lineage from a trigger to its follow-up; the read-only UI has no buttons and a
forged POST gets 403; a POST without the CSRF token is refused; a queue and a schedule whose
names are crafted paths are paused and fired by their own buttons, and nothing else changes.

Set AWA_UI_SCREENSHOTS to a folder to keep the screenshots (docs/images holds those of
docs/ui.md, taken by this test)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

import awa
from awa.observability.queue_samples import store_queue_samples
from helpers_browser import CHROMIUM_FLAGS, ServedUi, chromium_path, served
from helpers_worker import FAST_QUEUE, FAST_RUNTIME
from jobs_helpers import Conn, must_job_row

pytestmark = pytest.mark.timeout(180)


@dataclasses.dataclass
class Charge:
    order: int


@dataclasses.dataclass
class Signup:
    user: str


@dataclasses.dataclass
class Welcome:
    user: str


declined = threading.Event()  # while set, charges fail with "card declined"


async def setup_worker(client: awa.AsyncClient) -> None:
    @client.task(Charge, queue="payments")
    async def charge(job: awa.Job[Charge]) -> None:
        if declined.is_set():
            raise ValueError(f"card declined for order {job.args.order}")
        job.record_output({"charged": job.args.order})

    @client.task(Signup)
    async def signup(job: awa.Job[Signup]) -> None:
        return None

    @client.task(Welcome)
    async def welcome(job: awa.Job[Welcome]) -> None:
        return None

    client.on_completed_enqueue(Signup, lambda args, job: Welcome(args.user))
    queues = {name: {"max_workers": 2, **FAST_QUEUE} for name in ("payments", "default")}
    await client.start(queues, **FAST_RUNTIME)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS
        )
        yield launched
        launched.close()


@pytest.fixture
def ui(database_url: str) -> Iterator[ServedUi]:
    declined.clear()
    with served(database_url, setup_worker) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("AWA_UI_SCREENSHOTS")
    if folder:
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(pathlib.Path(folder) / f"ui-{name}.png"), full_page=True)


def test_find_a_failure_read_it_retry_it_and_see_it_complete(
    ui: ServedUi, page: Page, sync_client: awa.Client, conn: Conn
) -> None:
    declined.set()
    job = sync_client.insert(Charge(order=42), max_attempts=1, queue="payments")
    for order in (43, 44):
        sync_client.insert(Charge(order=order), max_attempts=1, queue="payments")
    page.goto(ui.url + "/")
    expect(page.locator('tr[data-queue="payments"]')).to_be_visible()
    expect(page.locator("body")).to_contain_text("leader")
    page.get_by_role("link", name="Jobs", exact=True).click()
    page.locator("nav.tabs").get_by_role("link", name="failed").click()
    expect(page.locator(f'tr[data-job="{job.id}"]')).to_contain_text("card declined")
    screenshot(page, "jobs")
    page.goto(ui.url + "/")
    screenshot(page, "overview")
    page.goto(ui.url + "/jobs?state=failed")
    page.locator(f'tr[data-job="{job.id}"]').get_by_role("link", name=str(job.id)).click()
    expect(page.locator("h1")).to_contain_text(f"Job {job.id}")
    error = page.locator("details.error").first
    expect(error).to_contain_text("ValueError: card declined for order 42")
    expect(error.locator("pre.traceback")).to_contain_text("in charge")  # the stack
    screenshot(page, "failed-job")

    declined.clear()
    page.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash")).to_have_text(f"Job {job.id} queued to run again.")
    # The page follows the unfinished job and reloads when its state changes.
    expect(page.locator("#job-state")).to_have_text("completed", timeout=20_000)
    expect(page.locator("body")).to_contain_text('"charged": 42')
    assert must_job_row(conn, job.id)["output"] == {"charged": 42}


def test_follow_the_lineage_from_a_trigger_to_its_follow_up(
    ui: ServedUi, page: Page, sync_client: awa.Client, conn: Conn
) -> None:
    trigger = sync_client.insert(Signup("ada"))
    page.goto(f"{ui.url}/jobs/{trigger.id}")
    # The page reloads when the worker completes the signup, which inserts its welcome.
    expect(page.locator("#job-state")).to_have_text("completed", timeout=20_000)
    link = page.locator("a.lineage-follow-up")
    expect(link).to_contain_text("welcome")
    screenshot(page, "lineage")
    link.click()
    expect(page.locator("h1")).to_contain_text("welcome")
    expect(page.locator("section.lineage")).to_contain_text("Enqueued by the completed outcome")
    page.locator("a.lineage-trigger").click()
    expect(page.locator("h1")).to_contain_text(f"Job {trigger.id}")


def test_read_only_has_no_buttons_and_refuses_posts(
    ui: ServedUi, page: Page, sync_client: awa.Client, conn: Conn
) -> None:
    declined.set()
    job = sync_client.insert(Charge(order=7), max_attempts=1, queue="held")
    page.goto(f"{ui.read_only_url}/jobs/{job.id}")
    expect(page.locator("h1")).to_contain_text(f"Job {job.id}")
    expect(page.get_by_role("button")).to_have_count(0)
    page.goto(f"{ui.read_only_url}/")
    expect(page.get_by_role("button")).to_have_count(0)
    forged = page.request.post(
        f"{ui.read_only_url}/jobs/{job.id}/cancel", form={"csrf_token": "anything"}
    )
    assert forged.status == 403
    assert must_job_row(conn, job.id)["state"] == "available"


def test_a_post_without_the_csrf_token_is_refused(
    ui: ServedUi, page: Page, sync_client: awa.Client, conn: Conn
) -> None:
    job = sync_client.insert(Charge(order=8), queue="held")
    page.goto(f"{ui.url}/jobs/{job.id}")
    expect(page.get_by_role("button", name="Cancel")).to_be_visible()
    refused = page.request.post(f"{ui.url}/jobs/{job.id}/cancel", form={"next": "/"})
    assert refused.status == 403
    assert "CSRF" in refused.text()
    assert must_job_row(conn, job.id)["state"] == "available"
    page.get_by_role("button", name="Cancel").click()  # the page's own form carries it
    expect(page.locator(".flash")).to_have_text(f"Job {job.id} cancelled.")
    assert must_job_row(conn, job.id)["state"] == "cancelled"


async def sample_queues(client: awa.AsyncClient) -> None:
    """Take the queue sample the overview lists queues from (as the leader does)."""
    async with client.connection() as conn:
        await store_queue_samples(conn)


def test_a_crafted_name_never_turns_a_button_into_another_action(
    ui: ServedUi, page: Page, sync_client: awa.Client, conn: Conn
) -> None:
    violations: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            violations.append(message.text)

    page.on("console", on_console)
    victim = sync_client.insert(Charge(order=1), queue="held")  # no worker runs "held"
    before = must_job_row(conn, victim.id)
    crafted = f"../../jobs/{victim.id}/discard"
    sync_client.insert(Charge(order=2), queue=crafted)
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue) VALUES (%s, %s, %s, %s)",
        (crafted, "0 3 * * *", "crafted-report", "held"),
    )
    ui.run(sample_queues(ui.client))

    page.goto(ui.url + "/")
    row = page.locator("tr[data-queue]").filter(has_text=crafted)
    expect(row).to_have_count(1)
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".flash")).to_have_text(
        f"Queue {crafted} paused: workers finish what runs and claim no more."
    )
    paused = conn.execute("SELECT queue FROM awa.queues WHERE paused").fetchall()
    assert paused == [(crafted,)]
    assert must_job_row(conn, victim.id) == before  # not discarded, not touched

    page.get_by_role("link", name="Schedules", exact=True).click()
    schedule = page.locator("tr[data-schedule]").filter(has_text=crafted)
    expect(schedule).to_have_count(1)
    schedule.get_by_role("button", name="Trigger now").click()
    expect(page.locator(".flash")).to_contain_text(f"Schedule {crafted} fired: job ")
    fired = conn.execute("SELECT queue FROM awa.jobs WHERE kind = 'crafted-report'").fetchall()
    assert fired == [("held",)]
    assert must_job_row(conn, victim.id) == before
    assert violations == []
