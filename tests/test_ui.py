"""The operator web UI over HTTP (httpx against the ASGI app): every page, every action, the
CSRF and read-only guards, authentication, the mount under a prefix and ``awa ui``."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import fastapi
import httpx
import pytest

import awa
from awa.ui import create_app
from helpers_ui import browse, csrf, flash, job_ids, post, text
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn, job_row, must_job_row, set_state


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Signup:
    user: str


@dataclasses.dataclass
class Welcome:
    user: str


@dataclasses.dataclass
class Receipt:
    user: str


@pytest.fixture
async def http(client: awa.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    async with browse(create_app(client)) as http:
        yield http


def fail_job(conn: Conn, job_id: int, error: str = "ValueError: boom") -> None:
    entry = [{"error": error, "attempt": 1, "at": "2026-12-01T10:00:00+00:00"}]
    set_state(
        conn,
        job_id,
        "failed",
        attempt=1,
        finalized_at=dt.datetime.now(dt.UTC),
        errors=json.dumps(entry),
    )


async def test_every_page_renders_on_an_empty_database(http: httpx.AsyncClient) -> None:
    for path in ("/", "/jobs", "/callbacks", "/schedules", "/failed", "/static/awa.css"):
        page = await http.get(path)
        assert page.status_code == 200, (path, page.text)
    assert "No queue has jobs" in text(await http.get("/"))
    assert "No job matches" in text(await http.get("/jobs"))
    missing = await http.get("/jobs/12345")
    assert missing.status_code == 404
    assert "no job 12345" in text(missing)


async def test_overview_counts_lag_pause_workers_and_leader(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    await client.pause_queue("mail")
    for n in range(3):
        await client.insert(Report(n), queue="mail")
    await client.insert(Report(9), queue="later", run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC))

    @client.task(Report)
    async def handle(job: awa.Job[Report]) -> None:
        return None

    await start(client, {**queue("mail", 3), **queue("later", 2)})

    def leader() -> Any:
        return conn.execute("SELECT 1 FROM awa.runtimes WHERE is_leader").fetchone()

    await wait_for(leader, message="no leader elected")
    page = await http.get("/")
    row = re.search(r'<tr data-queue="mail">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    cells = text(row.group(1))
    assert cells.startswith("mail 3 0 0 0 0 0"), cells  # available, scheduled, ...
    assert "paused" in cells
    assert "1 (3 slots)" in cells
    later = re.search(r'<tr data-queue="later">(.*?)</tr>', page.text, re.S)
    assert later is not None
    assert text(later.group(1)).startswith("later 0 1 0")
    assert "leader" in text(page)
    assert "no leader is running" not in text(page)
    lag = re.search(r"(\d+\.\d) s", cells)
    assert lag is not None, cells


async def test_jobs_filters(client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn) -> None:
    a = await client.insert(Report(1), queue="q1", tags=["red"])
    b = await client.insert({"note": "needle here"}, kind="other", queue="q2")
    c = await client.insert(Report(3), queue="q2", tags=["red", "blue"])
    fail_job(conn, c.id)
    assert job_ids(await http.get("/jobs")) == [c.id, b.id, a.id]
    assert job_ids(await http.get("/jobs", params={"state": "failed"})) == [c.id]
    assert job_ids(await http.get("/jobs", params={"kind": "other"})) == [b.id]
    assert job_ids(await http.get("/jobs", params={"queue": "q2"})) == [c.id, b.id]
    assert job_ids(await http.get("/jobs", params={"tag": "red"})) == [c.id, a.id]
    assert job_ids(await http.get("/jobs", params={"q": "needle"})) == [b.id]
    both = {"tag": "red", "queue": "q1", "state": "available"}
    assert job_ids(await http.get("/jobs", params=both)) == [a.id]
    failed_page = await http.get("/jobs", params={"state": "failed"})
    assert "ValueError: boom" in text(failed_page)


async def walk(http: httpx.AsyncClient, params: dict[str, str]) -> list[int]:
    """Every job id the pages list, following the next-page links."""
    seen: list[int] = []
    page = await http.get("/jobs", params=params)
    while True:
        seen += job_ids(page)
        link = re.search(r'<a rel="next" href="([^"]+)"', page.text)
        if link is None:
            return seen
        page = await http.get(link.group(1).replace("&amp;", "&"))


async def test_jobs_pages_by_keyset(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    inserted = await client.insert_many([Report(n) for n in range(120)])
    ids = [job.id for job in inserted]
    assert await walk(http, {}) == sorted(ids, reverse=True)  # pages of 50, newest first
    # By run_at: soonest first, ties by id; rows share run_at values across page edges.
    base = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    for n, job_id in enumerate(ids):
        set_state(conn, job_id, "scheduled", run_at=base + dt.timedelta(minutes=(119 - n) // 3))
    expected = sorted(ids, key=lambda job_id: ((119 - ids.index(job_id)) // 3, job_id))
    assert await walk(http, {"sort": "run_at", "state": "scheduled"}) == expected
    second = await http.get("/jobs", params={"after": str(ids[-50])})
    assert job_ids(second) == sorted(ids, reverse=True)[50:100]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"state": "bogus"}, "state must be one of"),
        ({"sort": "size"}, "sort must be id or run_at"),
        ({"after": "x"}, "after must be a whole number"),
        ({"sort": "run_at", "after": "3", "after_run_at": "yesterday"}, "after_run_at"),
        ({"kind": "a\x00b"}, "kind: NUL bytes"),
    ],
)
async def test_bad_filters_are_refused_by_name(
    http: httpx.AsyncClient, params: dict[str, str], named: str
) -> None:
    page = await http.get("/jobs", params=params)
    assert page.status_code == 400
    assert named in text(page)


async def test_job_page_shows_args_errors_and_timeline(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(
        Report(7), tags=["nightly"], metadata={"customer": "acme"}, queue="reports"
    )
    trace = 'ValueError: boom\nTraceback (most recent call last):\n  File "report.py", line 3'
    fail_job(conn, job.id, trace)
    page = await http.get(f"/jobs/{job.id}")
    body = text(page)
    assert f"Job {job.id}" in body
    assert "failed" in body
    assert '"n": 7' in body
    assert '"customer": "acme"' in body
    assert "nightly" in body
    assert 'File "report.py", line 3' in body  # the traceback, under attempt 1
    assert "attempt 1 failed" in body
    assert "created" in body
    assert "Not a follow-up of another job" in body


async def test_callbacks_page_and_parked_job(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(Report(1), queue="payments")
    callback_id = "7f8d5a35-2d1b-4a0c-9a62-0a3f2f6d9b11"
    timeout = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    set_state(
        conn,
        job.id,
        "waiting_external",
        callback_id=callback_id,
        callback_timeout_at=timeout,
        callback_filter="payload.status == 'paid'",
        attempted_at=dt.datetime.now(dt.UTC),
    )
    listing = text(await http.get("/callbacks"))
    assert callback_id in listing
    assert "payload.status == 'paid'" in listing
    assert "in 60 min" in listing or "in 59 min" in listing
    detail = text(await http.get(f"/jobs/{job.id}"))
    assert callback_id in detail
    assert "callback times out" in detail


async def test_progress_is_served_for_the_live_view(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(Report(1))
    set_state(conn, job.id, "running", progress='{"done": 40}', attempt=1)
    live = (await http.get(f"/jobs/{job.id}/progress")).json()
    assert live["state"] == "running"
    assert live["progress"] == {"done": 40}
    assert (await http.get("/jobs/999999/progress")).status_code == 404


async def test_lineage_links_a_trigger_and_its_follow_ups(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    @client.on_completed_enqueue(Signup)
    def welcome(args: Signup, job: awa.JobRow) -> Welcome:
        return Welcome(args.user)

    @client.task(Signup)
    async def signup(job: awa.Job[Signup]) -> None:
        job.enqueue_on_completion(Receipt(job.args.user))

    @client.task(Welcome)
    async def send(job: awa.Job[Welcome]) -> None:
        return None

    @client.task(Receipt)
    async def receipt(job: awa.Job[Receipt]) -> None:
        return None

    trigger = await client.insert(Signup("ada"))
    await start(client)

    def follow_ups() -> list[Any]:
        return conn.execute(
            "SELECT id, kind, metadata, state FROM awa.jobs WHERE id <> %s ORDER BY id",
            (trigger.id,),
        ).fetchall()

    rows = await wait_for(
        lambda: (
            [r for r in follow_ups() if r[3] == "completed"] == follow_ups()
            and len(follow_ups()) == 2
            and follow_ups()
        )
    )
    by_kind = {row[1]: row for row in rows}
    welcome_row, receipt_row = by_kind["welcome"], by_kind["receipt"]
    assert welcome_row[2]["awa:trigger"] == {
        "id": trigger.id,
        "kind": "signup",
        "outcome": "completed",
        "via": "follow_up",
    }
    assert receipt_row[2]["awa:trigger"]["via"] == "staged"

    page = await http.get(f"/jobs/{trigger.id}")
    links = re.findall(r'class="lineage-follow-up" href="[^"]*/jobs/(\d+)"', page.text)
    assert sorted(int(found) for found in links) == sorted([welcome_row[0], receipt_row[0]])
    assert "on completed, staged" in text(page)
    child = await http.get(f"/jobs/{welcome_row[0]}")
    assert re.search(rf'class="lineage-trigger" href="[^"]*/jobs/{trigger.id}"', child.text)
    assert "as a follow-up" in text(child)
    assert '"awa:trigger"' not in child.text  # shown as lineage, not as raw metadata

    conn.execute("DELETE FROM awa.jobs WHERE id = %s", (trigger.id,))  # retention took it
    orphan = text(await http.get(f"/jobs/{receipt_row[0]}"))
    assert f"job {trigger.id} (signup), no longer stored" in orphan
    assert "staged by its handler" in orphan


async def test_failures_grouped_by_kind_and_error(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    for n in range(3):
        fail_job(conn, (await client.insert(Report(n))).id, "TimeoutError: upstream\nTraceback")
    fail_job(conn, (await client.insert({"x": 1}, kind="other")).id, "KeyError: 'x'")
    page = text(await http.get("/failed"))
    assert "3 report TimeoutError: upstream default" in page
    assert "1 other KeyError: 'x'" in page


async def test_schedules_page_and_trigger(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    client.periodic("nightly-report", "0 3 * * *", Report, Report(0))

    @client.task(Report, queue="reports")
    async def handle(job: awa.Job[Report]) -> None:
        return None

    await start(client, queue("other"))
    await wait_for(lambda: conn.execute("SELECT 1 FROM awa.cron_jobs").fetchone())
    page = await http.get("/schedules")
    body = text(page)
    assert "nightly-report 0 3 * * * UTC report reports" in body
    assert "active" in body
    token = await csrf(http, "/schedules")
    done = await post(http, "/schedules/trigger", token, action="trigger", name="nightly-report")
    assert done.status_code == 303
    fired = conn.execute("SELECT id FROM awa.jobs WHERE kind = 'report'").fetchone()
    assert fired is not None
    assert flash(await http.get(done.headers["location"])) == (
        f"Schedule nightly-report fired: job {fired[0]}."
    )
    missing = await post(http, "/schedules/trigger", token, action="trigger", name="nope")
    assert flash(await http.get(missing.headers["location"])) == "No schedule named nope."


async def test_job_actions(client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn) -> None:
    token = await csrf(http)
    failed = await client.insert(Report(1))
    fail_job(conn, failed.id)
    answer = await post(http, f"/jobs/{failed.id}/retry", token, action="retry")
    assert answer.status_code == 303
    assert answer.headers["location"].endswith(f"/jobs/{failed.id}")
    assert must_job_row(conn, failed.id)["state"] == "available"
    assert (
        flash(await http.get(answer.headers["location"])) == f"Job {failed.id} queued to run again."
    )

    later = await client.insert(Report(2), run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC))
    await post(http, f"/jobs/{later.id}/run-now", token, action="run-now")
    assert must_job_row(conn, later.id)["state"] == "available"

    await post(http, f"/jobs/{later.id}/cancel", token, action="cancel")
    assert must_job_row(conn, later.id)["state"] == "cancelled"
    again = await post(http, f"/jobs/{later.id}/cancel", token, action="cancel")
    assert flash(await http.get(again.headers["location"])) == (
        f"Job {later.id}: it has already finished."
    )
    await post(http, f"/jobs/{later.id}/discard", token, action="discard")
    assert job_row(conn, later.id) is None

    running = await client.insert(Report(3))
    set_state(conn, running.id, "running", attempt=1)
    held = await post(http, f"/jobs/{running.id}/discard", token, action="discard", next="/jobs")
    assert held.headers["location"] == "/jobs"
    assert job_row(conn, running.id) is not None
    elsewhere = await post(
        http, f"/jobs/{running.id}/retry", token, action="retry", next="https://evil.test/"
    )
    assert elsewhere.headers["location"] == f"/jobs/{running.id}"
    unknown = await post(http, f"/jobs/{running.id}/explode", token, action="explode")
    assert unknown.status_code == 404


async def test_bulk_actions_ask_for_confirmation(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    token = await csrf(http, "/jobs")
    jobs = [await client.insert(Report(n)) for n in range(3)]
    ids = [str(job.id) for job in jobs[:2]]
    asked = await http.post(
        "/jobs/bulk", data={"csrf_token": token, "action": "cancel", "ids": ids}
    )
    assert asked.status_code == 200
    assert "Cancel 2 selected job(s)?" in text(asked)
    assert {must_job_row(conn, job.id)["state"] for job in jobs} == {"available"}
    done = await http.post(
        "/jobs/bulk",
        data={"csrf_token": token, "action": "cancel", "ids": ids, "confirm": "yes"},
    )
    assert done.status_code == 303
    states = [must_job_row(conn, job.id)["state"] for job in jobs]
    assert states == ["cancelled", "cancelled", "available"]
    assert flash(await http.get(done.headers["location"])) == "2 job(s) cancelled."
    bad = await http.post("/jobs/bulk", data={"csrf_token": token, "action": "burn", "ids": ids})
    assert bad.status_code == 400
    assert "action must be retry, cancel or discard" in text(bad)


async def test_retry_and_discard_every_failed_job_matching_the_filter(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    reports = [await client.insert(Report(n)) for n in range(3)]
    other = await client.insert({"x": 1}, kind="other")
    for job in [*reports, other]:
        fail_job(conn, job.id)
    page = await http.get("/jobs", params={"state": "failed", "kind": "report"})
    assert "Retry all" in page.text
    token = await csrf(http, "/jobs?state=failed&kind=report")
    fields = {"state": "failed", "kind": "report", "action": "retry"}
    asked = await post(http, "/jobs/matching", token, **fields)
    assert "Retry 3 failed job(s) matching the filter?" in text(asked)
    done = await post(http, "/jobs/matching", token, **fields, confirm="yes")
    assert flash(await http.get(done.headers["location"])) == "3 failed job(s) queued to run again."
    assert {must_job_row(conn, job.id)["state"] for job in reports} == {"available"}
    assert must_job_row(conn, other.id)["state"] == "failed"
    fields = {"state": "failed", "kind": "other", "action": "discard", "confirm": "yes"}
    await post(http, "/jobs/matching", token, **fields)
    assert job_row(conn, other.id) is None
    unfiltered = await post(http, "/jobs/matching", token, action="retry", confirm="yes")
    assert unfiltered.status_code == 400
    assert "state=failed" in text(unfiltered)


async def test_pause_and_resume_a_queue(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    await client.insert(Report(1), queue="mail/eu")  # any character, "/" included
    token = await csrf(http)
    paused = await post(http, "/queues/pause", token, action="pause", queue="mail/eu")
    assert "Queue mail/eu paused" in (flash(await http.get(paused.headers["location"])) or "")
    assert conn.execute("SELECT paused_by FROM awa.queues WHERE paused").fetchone() == ("awa ui",)
    assert "Resume" in (await http.get("/")).text
    await post(http, "/queues/resume", token, action="resume", queue="mail/eu")
    assert conn.execute("SELECT 1 FROM awa.queues WHERE paused").fetchone() is None
    again = await post(http, "/queues/resume", token, action="resume", queue="mail/eu")
    assert flash(await http.get(again.headers["location"])) == "Queue mail/eu was not paused."
    assert (await post(http, "/queues/drop", token, action="drop", queue="mail")).status_code == 404


async def test_posts_without_the_csrf_token_are_refused(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(Report(1))
    await csrf(http)  # the session has a token...
    for data in ({}, {"csrf_token": "forged" * 7 + "x"}):  # ...the form lacks it or forges it
        refused = await http.post(f"/jobs/{job.id}/cancel", data={**data, "action": "cancel"})
        assert refused.status_code == 403
        assert "CSRF" in refused.text
    async with browse(create_app(client)) as stranger:  # a browser with no session cookie
        forged = {"csrf_token": "x" * 43, "action": "cancel"}
        refused = await stranger.post(f"/jobs/{job.id}/cancel", data=forged)
        assert refused.status_code == 403
    assert must_job_row(conn, job.id)["state"] == "available"


async def test_read_only_hides_actions_and_refuses_changes(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(Report(1), run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC))
    async with browse(create_app(client, read_only=True)) as http:
        for path in ("/", "/jobs", f"/jobs/{job.id}", "/callbacks", "/schedules", "/failed"):
            page = await http.get(path)
            assert page.status_code == 200
            assert '<form method="post"' not in page.text, path
            assert "read-only" in page.text
        for path in (f"/jobs/{job.id}/cancel", "/jobs/bulk", "/queues/pause"):
            refused = await http.post(path, data={"csrf_token": "x"})
            assert refused.status_code == 403
        assert (await http.delete(f"/jobs/{job.id}")).status_code == 403
    assert must_job_row(conn, job.id)["state"] == "scheduled"


async def test_mounted_under_a_prefix_in_fastapi(client: awa.AsyncClient, conn: Conn) -> None:
    host = fastapi.FastAPI()

    @host.get("/")
    def home() -> dict[str, str]:
        return {"app": "host"}

    host.mount("/awa", create_app(client))
    job = await client.insert(Report(1))
    async with browse(host) as http:
        assert (await http.get("/")).json() == {"app": "host"}
        page = await http.get("/awa/")
        assert page.status_code == 200
        assert 'href="/awa/jobs"' in page.text  # a path under the mount, not the Host
        assert (await http.get("/awa/static/awa.js")).status_code == 200
        assert job_ids(await http.get("/awa/jobs")) == [job.id]
        token = await csrf(http, "/awa/jobs")
        assert "path=/awa/" in str(http.cookies.jar).lower() or http.cookies.get("awa_csrf")
        done = await post(http, f"/awa/jobs/{job.id}/cancel", token, action="cancel")
        assert done.headers["location"] == f"/awa/jobs/{job.id}"
        assert flash(await http.get(done.headers["location"])) == f"Job {job.id} cancelled."
    assert must_job_row(conn, job.id)["state"] == "cancelled"


async def test_authentication_basic_and_bearer(client: awa.AsyncClient) -> None:
    async with browse(create_app(client, auth="ops:s3cret")) as http:
        assert (await http.get("/")).status_code == 401
        assert (await http.get("/")).headers["www-authenticate"].startswith("Basic")
        good = base64.b64encode(b"ops:s3cret").decode()
        assert (await http.get("/", headers={"Authorization": f"Basic {good}"})).status_code == 200
        wrong = base64.b64encode(b"ops:guess").decode()
        assert (await http.get("/", headers={"Authorization": f"Basic {wrong}"})).status_code == 401
    async with browse(create_app(client, auth="tok-123")) as http:
        assert (await http.get("/", headers={"Authorization": "Bearer tok-123"})).status_code == 200
        assert (await http.get("/", headers={"Authorization": "Bearer nope"})).status_code == 401
        as_password = base64.b64encode(b"anyone:tok-123").decode()
        headers = {"Authorization": f"Basic {as_password}"}
        assert (await http.get("/", headers=headers)).status_code == 200
    with pytest.raises(awa.ValidationError, match="user:password"):
        create_app(client, auth="ops:")


def test_awa_ui_command_serves_the_ui(database_url: str, sync_client: awa.Client) -> None:
    job = sync_client.insert(Report(5))
    env = {**os.environ, "DATABASE_URL": database_url, "UI_TEST_TOKEN": "t0ken"}
    command = [sys.executable, "-m", "awa.cli", "ui", "--port", "0", "--read-only"]
    process = subprocess.Popen(
        [*command, "--auth", "UI_TEST_TOKEN"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # the server's first line; pytest-timeout bounds it
        found = re.search(r"awa ui \(read-only\) on (http://\S+)", line)
        assert found is not None, line
        base = found.group(1)
        headers = {"Authorization": "Bearer t0ken"}
        with httpx.Client(base_url=base, headers=headers) as http:
            assert str(job.id) in text(http.get("/jobs"))
            assert http.post(f"/jobs/{job.id}/cancel").status_code == 403
        with httpx.Client(base_url=base) as anonymous:
            assert anonymous.get("/").status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=30)
    missing = subprocess.run(
        [*command, "--auth", "NO_SUCH_VARIABLE_SET"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "NO_SUCH_VARIABLE_SET: that environment variable is not set" in missing.stderr
