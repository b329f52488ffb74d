"""The operator UI against hostile input, over HTTP: every stored name on every page and
through every button, odd stored JSON, crafted addresses and form fields, hostile query
strings and paths, the security headers of every answer, and the Origin/Referer check of
every POST. Each case asserts the status, the message and that nothing else changed.

A new page, button or parameter gets its cases by a row in one of the tables below."""

from __future__ import annotations

import datetime as dt
import json
import re
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request

import awa
from awa.ui import create_app
from awa.ui.links import path_for
from awa.ui.security import CONTENT_SECURITY_POLICY
from helpers_ui import Form, browse, csrf, flash, forms, post, references, resolve, submit, text
from jobs_helpers import Conn, count_jobs, must_job_row, set_state

# --- Tables ---------------------------------------------------------------------------------

# Stored names (queue, kind, tag, schedule, metadata, error text): every page shows them as
# text and every button acts on them alone. "{victim}" becomes the id of a job that must
# never change.
NAMES = [
    pytest.param("../../jobs/{victim}/discard", id="dot-segments-to-discard"),
    pytest.param("%2E%2E/%2e%2e/jobs/{victim}/discard", id="encoded-dot-segments"),
    pytest.param("..%2F..%2Fjobs%2F{victim}%2Fdiscard", id="encoded-slashes"),
    pytest.param("..\\..\\jobs\\{victim}\\discard", id="backslashes"),
    pytest.param("mail/eu", id="slash"),
    pytest.param("..", id="dot-dot"),
    pytest.param(".", id="dot"),
    pytest.param("//evil.test/jobs", id="scheme-relative"),
    pytest.param("javascript:alert(1)", id="javascript-url"),
    pytest.param("?action=discard&ids={victim}#top", id="query-and-fragment"),
    pytest.param("<script>alert(1)</script>", id="script"),
    pytest.param("\"'><img src=x onerror=alert(1)>", id="quotes"),
    pytest.param("tab\tline\nbell\x07esc\x1b[31m", id="control-characters"),
    pytest.param("\u202egnp.exe", id="right-to-left-override"),
    pytest.param("\\ud800\\udfff", id="escaped-surrogates"),
    pytest.param("😀 \U0001f9ea", id="astral"),
    pytest.param("q" * 200, id="200-characters"),
]

# The addresses an action form may post to, and the action its "action" field must name
# (None: the page's own buttons name it, checked by the endpoint).
POST_ADDRESSES: list[tuple[str, str | None]] = [
    (r"/jobs/\d+/(retry|cancel|discard|run-now)", "\\1"),
    (r"/queues/pause", "pause"),
    (r"/queues/resume", "resume"),
    (r"/schedules/trigger", "trigger"),
    (r"/workflows/cancel", "cancel"),
    (r"/jobs/bulk", None),
    (r"/jobs/matching", None),
]

# A form's fields posted to another action's address: refused before anything is done.
CROSSED = [
    pytest.param(
        "/jobs/{victim}/discard",
        {"action": "pause", "queue": "q"},
        400,
        "action: the form asks for 'pause' but was sent to the address of 'discard'",
        id="pause-fields-to-discard",
    ),
    pytest.param(
        "/jobs/{victim}/discard",
        {"action": "trigger", "name": "nightly"},
        400,
        "action: the form asks for 'trigger' but was sent to the address of 'discard'",
        id="trigger-fields-to-discard",
    ),
    pytest.param(
        "/jobs/{victim}/discard",
        {},
        400,
        "action: the form asks for None but was sent to the address of 'discard'",
        id="no-action-field",
    ),
    pytest.param(
        "/jobs/{victim}/cancel",
        {"action": "cancel", "next": "/"},
        303,
        None,
        id="control-a-matching-form-acts",
    ),
    pytest.param(
        "/queues/pause",
        {"action": "resume", "queue": "q"},
        400,
        "the form asks for 'resume' but was sent to the address of 'pause'",
        id="resume-fields-to-pause",
    ),
    pytest.param(
        "/schedules/trigger",
        {"action": "pause", "name": "nightly"},
        400,
        "the form asks for 'pause' but was sent to the address of 'trigger'",
        id="pause-fields-to-trigger",
    ),
    pytest.param(
        "/workflows/cancel",
        {"action": "discard", "workflow": str(uuid.uuid4())},
        400,
        "the form asks for 'discard' but was sent to the address of 'cancel'",
        id="discard-fields-to-workflow-cancel",
    ),
    pytest.param(
        "/jobs/bulk",
        {"action": "pause", "ids": "{victim}", "confirm": "yes"},
        400,
        "action must be retry, cancel or discard, not 'pause'",
        id="pause-fields-to-bulk",
    ),
    pytest.param(
        "/jobs/matching",
        {"action": "pause", "state": "failed", "confirm": "yes"},
        400,
        "action must be retry or discard, not 'pause'",
        id="pause-fields-to-matching",
    ),
    pytest.param(
        "/queues/pause/../../jobs/{victim}/discard",  # the client resolves it, as browsers do
        {"action": "pause", "queue": "../../jobs/{victim}/discard"},
        400,
        "action: the form asks for 'pause' but was sent to the address of 'discard'",
        id="old-queue-address-resolved",
    ),
    pytest.param(
        "/queues/pause/q",
        {"action": "pause"},
        404,
        "Not Found",
        id="old-queue-address",
    ),
    pytest.param(
        "/schedules/trigger/nightly",
        {"action": "trigger"},
        404,
        "Not Found",
        id="old-schedule-address",
    ),
]

# Hostile form fields: a clear refusal (400), or admin's own rule as a flash (303).
FIELDS = [
    pytest.param(
        "/queues/pause",
        {"action": "pause"},
        400,
        "queue: the form does not say which",
        id="no-queue",
    ),
    pytest.param(
        "/queues/pause",
        {"action": "pause", "queue": "a\x00b"},
        400,
        "queue: NUL bytes are not allowed",
        id="queue-nul",
    ),
    pytest.param(
        "/queues/pause",
        {"action": "pause", "queue": "q" * 201},
        303,
        "Not done: queue is 201 characters long; the limit is 200",
        id="queue-201-characters",
    ),
    pytest.param(
        "/schedules/trigger",
        {"action": "trigger", "name": "n\x00"},
        400,
        "name: NUL bytes are not allowed",
        id="schedule-nul",
    ),
    pytest.param(
        "/workflows/cancel",
        {"action": "cancel", "workflow": "a/b"},
        400,
        "workflow must be a workflow's id (a UUID), not 'a/b'",
        id="workflow-not-a-uuid",
    ),
    pytest.param(
        "/jobs/bulk",
        {"action": "cancel", "ids": "9223372036854775808", "confirm": "yes"},
        400,
        "ids must be a whole number from 0 to 9223372036854775807, not '9223372036854775808'",
        id="ids-beyond-bigint",
    ),
    pytest.param(
        "/jobs/bulk",
        {"action": "cancel", "ids": "-1e30", "confirm": "yes"},
        400,
        "ids must be a whole number from 0 to 9223372036854775807, not '-1e30'",
        id="ids-exponent",
    ),
    pytest.param(
        "/jobs/bulk",
        {"action": "cancel", "ids": "1_000", "confirm": "yes"},
        400,
        "ids must be a whole number",
        id="ids-underscore",
    ),
    pytest.param(
        "/jobs/" + "9" * 5000 + "/cancel",
        {"action": "cancel"},
        400,
        "job id must be a whole number from 0 to 9223372036854775807, not '9999",
        id="job-id-5000-digits",
    ),
    pytest.param(
        "/jobs/9223372036854775808/cancel",
        {"action": "cancel"},
        400,
        "job id must be a whole number from 0 to 9223372036854775807",
        id="job-id-beyond-bigint",
    ),
    pytest.param(
        "/jobs/matching",
        {"action": "retry", "state": "failed", "after": "9223372036854775808"},
        400,
        "after must be a whole number from 0 to 9223372036854775807",
        id="matching-after-beyond-bigint",
    ),
]

# Targets of a form's "next": kept only when a path of this UI.
NEXT = [
    pytest.param("/jobs?state=failed&kind=a%2Fb", True, id="a-page-with-filters"),
    pytest.param("/callbacks", True, id="a-page"),
    pytest.param("https://evil.test/", False, id="another-site"),
    pytest.param("//evil.test/", False, id="scheme-relative"),
    pytest.param("/\\evil.test/", False, id="backslash"),
    pytest.param("\\\\evil.test\\", False, id="backslashes"),
    pytest.param("/%2F%2Fevil.test/", False, id="encoded-slashes"),
    pytest.param("/%5Cevil.test/", False, id="encoded-backslash"),
    pytest.param("/jobs/../../evil", False, id="dot-segments"),
    pytest.param("/%2e%2e/evil", False, id="encoded-dot-segments"),
    pytest.param("/jobs\r\nSet-Cookie: x=1", False, id="header-injection"),
    pytest.param("/jobs\x00", False, id="nul"),
    pytest.param("/jobs\t", False, id="tab"),
    pytest.param("javascript:alert(1)", False, id="javascript"),
    pytest.param("/jobs#top", False, id="fragment"),
    pytest.param("/jobs/é", False, id="not-ascii"),
    pytest.param("/" + "x" * 5000, False, id="5000-characters"),
]

# Query strings and paths of GET requests: (address, status, message on the page).
REQUESTS = [
    pytest.param(
        "/jobs?after=9223372036854775808",
        400,
        "after must be a whole number from 0 to 9223372036854775807, not '9223372036854775808'",
        id="after-beyond-bigint",
    ),
    pytest.param(
        "/jobs?after=-1e30", 400, "after must be a whole number from 0 to", id="after-exponent"
    ),
    pytest.param("/jobs?after=-1", 400, "after must be a whole number", id="after-negative"),
    pytest.param("/jobs?after=1_000", 400, "after must be a whole number", id="after-underscore"),
    pytest.param(
        "/jobs?after=%D9%A1%D9%A2", 400, "after must be a whole number", id="after-arabic-digits"
    ),
    pytest.param(
        "/jobs?after=" + "9" * 5000, 400, "after: at most 1000 characters", id="after-5000"
    ),
    pytest.param("/jobs?after=9223372036854775807", 200, "No job matches", id="after-bigint-max"),
    pytest.param("/jobs?after=" + "0" * 30 + "5", 200, "No job matches", id="after-leading-zeros"),
    pytest.param("/jobs?kind=a%00b", 400, "kind: NUL bytes are not allowed", id="kind-nul"),
    pytest.param("/jobs?q=" + "x" * 10_000, 400, "q: at most 1000 characters", id="q-10000"),
    pytest.param("/jobs?state=%3Cscript%3E", 400, "state must be one of", id="state-script"),
    pytest.param("/jobs?kind=%ED%B2%80", 200, "No job matches", id="kind-encoded-surrogate"),
    pytest.param(
        "/jobs?queue=..%2F..%2Fjobs%2F1%2Fdiscard", 200, "No job matches", id="queue-dots"
    ),
    pytest.param("/jobs?tag=%01%1B%7F", 200, "No job matches", id="tag-control-characters"),
    pytest.param(
        "/jobs?sort=run_at&after=1&after_run_at=yesterday", 400, "after_run_at", id="after-run-at"
    ),
    pytest.param(
        "/jobs/" + "9" * 5000,
        400,
        "job id must be a whole number from 0 to 9223372036854775807, not '9999",
        id="job-5000-digits",
    ),
    pytest.param(
        "/jobs/9223372036854775808",
        400,
        "job id must be a whole number from 0 to 9223372036854775807",
        id="job-beyond-bigint",
    ),
    pytest.param(
        "/jobs/9223372036854775807", 404, "no job 9223372036854775807", id="job-bigint-max"
    ),
    pytest.param("/jobs/-1", 400, "job id must be a whole number", id="job-negative"),
    pytest.param("/jobs/1e3", 400, "job id must be a whole number", id="job-exponent"),
    pytest.param("/jobs/%00", 400, "job id: NUL bytes are not allowed", id="job-nul"),
    pytest.param(
        "/jobs/" + "9" * 5000 + "/progress", 400, "job id must be", id="progress-5000-digits"
    ),
    pytest.param("/workflows/a%2Fb", 404, "Not Found", id="workflow-encoded-slash"),
    pytest.param(
        "/workflows/not-a-uuid",
        400,
        "workflow id must be a UUID, not 'not-a-uuid'",
        id="workflow-not-a-uuid",
    ),
    pytest.param(
        "/workflows/" + "x" * 10_000, 400, "workflow id must be a UUID", id="workflow-10000"
    ),
    pytest.param("/workflows/%00", 400, "workflow id must be a UUID", id="workflow-nul"),
    pytest.param("/nowhere/%2e%2e/jobs", 404, "Not Found", id="no-such-page"),
]

# Stored JSON of odd shapes on a job's page: (metadata, errors, text the page shows).
ODD_JOBS = [
    pytest.param({"awa:workflow": "a/b"}, [], '"awa:workflow": "a/b"', id="workflow-a-string"),
    pytest.param({"awa:workflow": ["x"]}, [], '"awa:workflow": [', id="workflow-a-list"),
    pytest.param(
        {"awa:workflow": {"id": "../../jobs/{victim}/discard", "name": 5, "step": None}},
        [],
        "Step null of 5 (its record names no workflow id)",
        id="workflow-id-not-a-uuid",
    ),
    pytest.param({"awa:workflow": {}}, [], "Step ? of a workflow (its record", id="workflow-empty"),
    pytest.param(
        {"awa:trigger": {"id": "{victim}", "kind": "signup", "outcome": "completed"}},
        [],
        "Enqueued by the completed outcome of job {victim} (signup) , now available , as a "
        "follow-up",
        id="lineage-without-via",
    ),
    pytest.param(
        {"awa:trigger": {"id": "{victim}", "kind": {"a": 1}, "outcome": 3, "via": ["x"]}},
        [],
        'Enqueued by the 3 outcome of job {victim} ({"a": 1})',
        id="lineage-odd-types",
    ),
    pytest.param(
        {"awa:trigger": "x"},
        [],
        "a job its lineage record does not name (see the metadata)",
        id="lineage-a-string",
    ),
    pytest.param(
        {"awa:trigger": {"id": 9223372036854775807, "kind": "k"}},
        [],
        "job 9223372036854775807 (k), no longer stored",
        id="lineage-of-a-missing-job",
    ),
    pytest.param(
        {},
        [1, "text", None, {"at": "yesterday"}, {"error": 5, "at": "2026-01-01T00:00:00"}],
        "attempt ? — 5 2026-01-01T00:00:00",
        id="errors-of-odd-shapes",
    ),
    pytest.param(
        {},
        [{"attempt": {"x": 1}, "error": "E\nTraceback", "terminal": "yes"}],
        'attempt {"x": 1} — E',
        id="errors-odd-attempt",
    ),
]

# Values the UI builds a path segment from (only checked ids today; the rule holds for any).
SEGMENTS = [
    pytest.param("a/b", "a%2Fb", id="slash"),
    pytest.param("?x=1#y", "%3Fx%3D1%23y", id="query-and-fragment"),
    pytest.param("%2F", "%252F", id="already-encoded"),
    pytest.param("..\\x", "..%5Cx", id="backslash"),
    pytest.param("é \x01", "%C3%A9%20%01", id="not-ascii-and-control"),
    pytest.param("...", None, id="dots-only"),
    pytest.param("..", None, id="dot-dot"),
    pytest.param(".", None, id="dot"),
    pytest.param("", None, id="empty"),
]

# Origin and Referer of a POST: (headers, allowed).
ORIGINS = [
    pytest.param({"Origin": "http://ui.test"}, True, id="same-origin"),
    pytest.param({"Origin": "http://UI.test:80"}, True, id="same-origin-default-port"),
    pytest.param({"Origin": "https://ui.test"}, True, id="same-host-behind-a-tls-proxy"),
    pytest.param({"Origin": "http://evil.test"}, False, id="another-origin"),
    pytest.param({"Origin": "null"}, False, id="null"),
    pytest.param({"Origin": "http://ui.test.evil.test"}, False, id="suffix"),
    pytest.param({"Origin": "http://ui.test:8080"}, False, id="another-port"),
    pytest.param({"Origin": "garbage"}, False, id="garbage"),
    pytest.param({"Origin": "ftp://ui.test"}, False, id="not-http"),
    pytest.param({"Referer": "http://ui.test/jobs?x=1"}, True, id="referer-same-origin"),
    pytest.param({"Referer": "http://evil.test/ui.test"}, False, id="referer-another-origin"),
    pytest.param({"Referer": "http://ui.test@evil.test/"}, False, id="referer-userinfo"),
    pytest.param(
        {"Origin": "http://ui.test", "Referer": "http://evil.test/"}, True, id="origin-decides"
    ),
    pytest.param(
        {"Origin": "http://evil.test", "Referer": "http://ui.test/"}, False, id="origin-first"
    ),
    pytest.param({}, True, id="neither-not-a-browser"),
]

# Every kind of answer the app gives, for the headers: (method, address, form fields).
ANSWERS = [
    pytest.param("GET", "/", None, 200, id="overview"),
    pytest.param("GET", "/jobs", None, 200, id="jobs"),
    pytest.param("GET", "/jobs/{victim}", None, 200, id="job"),
    pytest.param("GET", "/jobs/{victim}/progress", None, 200, id="progress-json"),
    pytest.param("GET", "/callbacks", None, 200, id="callbacks"),
    pytest.param("GET", "/schedules", None, 200, id="schedules"),
    pytest.param("GET", "/failed", None, 200, id="failed"),
    pytest.param("GET", "/static/awa.js", None, 200, id="script"),
    pytest.param("GET", "/static/awa.css", None, 200, id="stylesheet"),
    pytest.param("HEAD", "/", None, 200, id="head"),
    pytest.param("GET", "/jobs/12345", None, 404, id="not-found"),
    pytest.param("GET", "/jobs?after=x", None, 400, id="bad-request"),
    pytest.param("GET", "/queues/pause", None, 405, id="method-not-allowed"),
    pytest.param("POST", "/jobs/{victim}/cancel", {"action": "cancel"}, 403, id="no-token"),
    pytest.param("POST", "/jobs/bulk", {"action": "retry", "ids": "{victim}"}, 200, id="confirm"),
    pytest.param("POST", "/queues/pause", {"action": "pause", "queue": "q"}, 303, id="redirect"),
]


# --- Fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
async def http(client: awa.AsyncClient) -> AsyncIterator[httpx.AsyncClient]:
    async with browse(create_app(client)) as http:
        yield http


@pytest.fixture
async def victim(client: awa.AsyncClient) -> awa.JobRow:
    """The first job (id 1): available, so that a crafted form could discard it."""
    return await client.insert({"n": 1}, kind="report", queue="victim")


def fold(name: str) -> str:
    """The name as ``text()`` shows it (whitespace folded)."""
    return re.sub(r"\s+", " ", name).strip()


def named(template: Any, victim: awa.JobRow) -> Any:
    """A table's value with "{victim}" replaced by the victim's id (also inside JSON)."""
    encoded = json.dumps(template).replace('"{victim}"', str(victim.id))
    return json.loads(encoded.replace("{victim}", str(victim.id)))


def fail_job(conn: Conn, job_id: int, error: str) -> None:
    entry = [{"error": error, "attempt": 1, "at": "2026-12-01T10:00:00+00:00"}]
    set_state(
        conn,
        job_id,
        "failed",
        attempt=1,
        finalized_at=dt.datetime.now(dt.UTC),
        errors=json.dumps(entry),
    )


def add_schedule(conn: Conn, name: str, expression: str = "0 3 * * *", **columns: Any) -> None:
    """A schedule stored by SQL, as a deployment (or anyone) could have stored it."""
    values = {"kind": name, "queue": name, "timezone": "UTC", **columns}
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue, timezone)"
        " VALUES (%s, %s, %s, %s, %s)",
        (name, expression, values["kind"], values["queue"], values["timezone"]),
    )


async def store(client: awa.AsyncClient, conn: Conn, name: str, victim: awa.JobRow) -> int:
    """A failed job whose kind, queue, tag, metadata and error hold ``name``, and a schedule
    of that name; returns the job's id."""
    job = await client.insert({"name": name}, kind=name, queue=name, tags=[name])
    metadata = {
        "note": name,
        "awa:workflow": {"id": name, "name": name, "step": name},
        "awa:trigger": {"id": victim.id, "kind": name, "outcome": name},
    }
    conn.execute(
        "UPDATE awa.jobs SET metadata = %s::jsonb WHERE id = %s", (json.dumps(metadata), job.id)
    )
    fail_job(conn, job.id, f"{name}\nTraceback")
    add_schedule(conn, name)
    return job.id


def address_action(path: str) -> tuple[bool, str | None]:
    """Whether ``path`` is an action address, and the action its form must name."""
    for pattern, action in POST_ADDRESSES:
        found = re.fullmatch(pattern, path)
        if found:
            return True, found.expand(action) if action else None
    return False, None


def assert_safe_references(page: httpx.Response) -> None:
    """Every address on the page is a path of the UI that no browser reads otherwise."""
    for reference in references(page):
        if reference.startswith(("http://", "https://")):
            continue  # a descriptor's docs link (web addresses only)
        assert reference.startswith("/"), reference
        assert not reference.startswith("//"), reference
        assert "\\" not in reference, reference
        assert reference.isascii(), reference
        assert reference.isprintable(), reference
        target = resolve(page, reference)
        assert target.host == "ui.test"
        written = urllib.parse.urlsplit(reference).path
        assert target.path == urllib.parse.unquote(written), (reference, target)
    for form in forms(page):
        if form.method.lower() != "post":
            assert resolve(page, form.action).path == "/jobs"
            continue
        known, action = address_action(resolve(page, form.action).path)
        assert known, form.action
        if action is not None:
            assert form.fields["action"] == action, form


def form_in_row(page: httpx.Response, attribute: str, name: str) -> Form:
    found = [form for form in forms(page) if form.row.get(attribute) == name]
    assert len(found) == 1, (name, [form.row for form in forms(page)])
    return found[0]


def jobs_of_kind(conn: Conn, kind: str) -> int:
    return count_jobs(conn, "kind = %s", kind)


# --- Stored names ---------------------------------------------------------------------------


@pytest.mark.parametrize("template", NAMES)
async def test_every_page_shows_a_stored_name_as_text(
    client: awa.AsyncClient,
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    template: str,
) -> None:
    name = template.format(victim=victim.id)
    job_id = await store(client, conn, name, victim)
    filters = [{"queue": name}, {"kind": name}, {"tag": name}, {"state": "failed", "kind": name}]
    pages = [
        await http.get("/"),
        await http.get("/jobs"),
        *[await http.get("/jobs", params=params) for params in filters],
        await http.get(f"/jobs/{job_id}"),
        await http.get("/schedules"),
        await http.get("/failed"),
    ]
    for page in pages:
        assert page.status_code == 200, (page.url, page.text[:2000])
        assert fold(name) in text(page), page.url
        if "<" in name:
            assert name not in page.text  # escaped, never markup
        assert_safe_references(page)
    for page in pages[2:6]:  # each filter found the job
        assert re.search(rf'<tr data-job="{job_id}">', page.text), page.url
    overview, schedules = pages[0], pages[-2]
    assert form_in_row(overview, "data-queue", name).fields["queue"] == name
    assert form_in_row(schedules, "data-schedule", name).fields["name"] == name
    assert must_job_row(conn, victim.id)["state"] == "available"


@pytest.mark.parametrize("template", NAMES)
async def test_each_button_acts_on_the_stored_name_alone(
    client: awa.AsyncClient,
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    template: str,
) -> None:
    name = template.format(victim=victim.id)
    job_id = await store(client, conn, name, victim)
    before = must_job_row(conn, victim.id)
    await csrf(http)

    overview = await http.get("/")
    paused = await submit(http, overview, form_in_row(overview, "data-queue", name))
    assert paused.status_code == 303, paused.text
    assert paused.headers["location"] == "/"
    message = flash(await http.get("/"))
    assert message == f"Queue {name} paused: workers finish what runs and claim no more."
    assert conn.execute("SELECT queue FROM awa.queues WHERE paused").fetchall() == [(name,)]

    overview = await http.get("/")
    form = form_in_row(overview, "data-queue", name)
    assert form.fields["action"] == "resume"
    resumed = await submit(http, overview, form)
    assert resumed.status_code == 303
    assert conn.execute("SELECT queue FROM awa.queues WHERE paused").fetchall() == []

    schedules = await http.get("/schedules")
    fired_before = jobs_of_kind(conn, name)
    fired = await submit(http, schedules, form_in_row(schedules, "data-schedule", name))
    assert fired.status_code == 303
    assert jobs_of_kind(conn, name) == fired_before + 1
    message = flash(await http.get("/schedules"))
    assert message is not None
    assert message.startswith(f"Schedule {name} fired: job ")

    page = await http.get(f"/jobs/{job_id}")
    retry = [form for form in forms(page) if form.fields.get("action") == "retry"]
    assert len(retry) == 1
    assert (await submit(http, page, retry[0])).status_code == 303
    assert must_job_row(conn, job_id)["state"] == "available"

    assert must_job_row(conn, victim.id) == before  # never discarded, never touched


async def test_a_ten_thousand_character_name_renders_and_its_button_says_the_limit(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn, victim: awa.JobRow
) -> None:
    name = "<b>" + "n" * 9_997
    conn.execute(
        "INSERT INTO awa.queues (queue, paused, paused_at, paused_by) VALUES (%s, true, now(), %s)",
        (name, name),
    )
    job = await client.insert({"name": name}, kind="note", tags=[name], metadata={"note": name})
    fail_job(conn, job.id, name)
    for path, shown in (
        ("/", name),
        (f"/jobs/{job.id}", name),
        ("/jobs", name),
        ("/failed", name[:300]),
    ):
        page = await http.get(path)
        assert page.status_code == 200, path
        assert shown in text(page)
        assert "<b>" not in page.text
        assert_safe_references(page)
    overview = await http.get("/")
    form = form_in_row(overview, "data-queue", name)
    assert (form.fields["action"], form.fields["queue"]) == ("resume", name)
    await csrf(http)
    answer = await submit(http, overview, form)
    assert answer.status_code == 303
    assert (
        flash(await http.get("/")) == "Not done: queue is 10000 characters long; the limit is 200"
    )
    assert conn.execute("SELECT paused FROM awa.queues WHERE queue = %s", (name,)).fetchone() == (
        True,
    )
    assert must_job_row(conn, victim.id)["state"] == "available"


# --- Crafted addresses and fields ----------------------------------------------------------


def snapshot(conn: Conn) -> Any:
    """Everything an action could change: jobs, queue state, schedules."""
    jobs = conn.execute("SELECT id, state, run_at, attempt FROM awa.jobs ORDER BY id").fetchall()
    queues = conn.execute("SELECT queue, paused FROM awa.queues ORDER BY queue").fetchall()
    cron = conn.execute("SELECT name, last_enqueued_at FROM awa.cron_jobs").fetchall()
    return jobs, queues, cron


@pytest.mark.parametrize(("address", "fields", "status", "message"), CROSSED)
async def test_a_form_posted_to_another_action_s_address_is_refused(
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    address: str,
    fields: dict[str, str],
    status: int,
    message: str | None,
) -> None:
    add_schedule(conn, "nightly")
    before = snapshot(conn)
    token = await csrf(http)
    answer = await post(http, named(address, victim), token, **named(fields, victim))
    assert answer.status_code == status, answer.text
    if message is not None:
        assert message in text(answer)
        assert "Database unavailable" not in text(answer)
        assert snapshot(conn) == before
    else:  # the control: the same post with matching fields acts
        assert must_job_row(conn, victim.id)["state"] == "cancelled"


@pytest.mark.parametrize(("address", "fields", "status", "message"), FIELDS)
async def test_hostile_form_fields_are_refused_by_name(
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    address: str,
    fields: dict[str, str],
    status: int,
    message: str,
) -> None:
    before = snapshot(conn)
    token = await csrf(http)
    answer = await post(http, address, token, **fields)
    assert answer.status_code == status, answer.text
    shown = text(answer) if status != 303 else flash(await http.get(answer.headers["location"]))
    assert shown is not None
    assert message in shown
    assert "Database unavailable" not in shown
    assert snapshot(conn) == before


@pytest.mark.parametrize(("target", "kept"), NEXT)
async def test_next_stays_a_path_of_the_ui(
    client: awa.AsyncClient, conn: Conn, victim: awa.JobRow, target: str, kept: bool
) -> None:
    host = Starlette()
    host.mount("/awa", create_app(client))
    async with browse(host) as http:
        token = await csrf(http, "/awa/jobs")
        mounted = "/awa" + target if target.startswith("/") else target
        for next_target in {target, mounted}:
            answer = await post(
                http, f"/awa/jobs/{victim.id}/run-now", token, action="run-now", next=next_target
            )
            assert answer.status_code == 303
            expected = next_target if kept and next_target == mounted else f"/awa/jobs/{victim.id}"
            assert answer.headers["location"] == expected, next_target
    assert must_job_row(conn, victim.id)["state"] == "available"


@pytest.mark.parametrize(("value", "segment"), SEGMENTS)
async def test_a_path_segment_is_encoded_whole_or_refused(
    client: awa.AsyncClient, value: str, segment: str | None
) -> None:
    scope = {"type": "http", "app": create_app(client), "root_path": "/ops awa", "headers": []}
    request = Request(scope)
    if segment is None:
        with pytest.raises(ValueError, match="a link to workflow needs a workflow_id other than"):
            path_for(request, "workflow", workflow_id=value)
    else:
        assert path_for(request, "workflow", workflow_id=value) == f"/ops%20awa/workflows/{segment}"
    query = {"queue": value, "kind": None, "tag": ""}
    expected = (
        f"/ops%20awa/jobs?queue={urllib.parse.quote_plus(value)}" if value else "/ops%20awa/jobs"
    )
    assert path_for(request, "jobs", query=query) == expected


# --- Query strings and paths ---------------------------------------------------------------


@pytest.mark.parametrize(("address", "status", "message"), REQUESTS)
async def test_hostile_query_strings_and_paths(
    http: httpx.AsyncClient, conn: Conn, address: str, status: int, message: str
) -> None:
    page = await http.get(address)
    assert page.status_code == status, page.text[:500]
    assert message in text(page)
    assert "Database unavailable" not in text(page)
    assert count_jobs(conn) == 0


# --- Odd stored JSON ------------------------------------------------------------------------


@pytest.mark.parametrize(("metadata", "errors", "shown"), ODD_JOBS)
async def test_a_job_page_renders_whatever_its_json_holds(
    client: awa.AsyncClient,
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    metadata: dict[str, Any],
    errors: list[Any],
    shown: str,
) -> None:
    job = await client.insert({"n": 2}, kind="odd")
    conn.execute(
        "UPDATE awa.jobs SET metadata = %s::jsonb, errors = %s::jsonb WHERE id = %s",
        (json.dumps(named(metadata, victim)), json.dumps(errors), job.id),
    )
    page = await http.get(f"/jobs/{job.id}")
    assert page.status_code == 200, page.text[:3000]
    assert named(shown, victim) in text(page)
    assert_safe_references(page)
    assert must_job_row(conn, victim.id)["state"] == "available"


async def test_schedules_without_a_next_fire_show_never_and_still_fire(
    client: awa.AsyncClient, http: httpx.AsyncClient, conn: Conn
) -> None:
    add_schedule(conn, "good")
    add_schedule(conn, "thirtieth-of-february", "0 0 30 2 *")
    add_schedule(conn, "no-such-zone", timezone="Mars/Olympus_Mons")
    add_schedule(conn, "not-cron", "every day at noon")
    page = await http.get("/schedules")
    assert page.status_code == 200, page.text[:2000]
    rows = dict(re.findall(r'<tr data-schedule="([^"]+)">(.*?)</tr>', page.text, re.S))
    assert sorted(rows) == ["good", "no-such-zone", "not-cron", "thirtieth-of-february"]
    assert re.search(r"in \d+ (s|min|h)", text(rows["good"]))
    for name in ("thirtieth-of-february", "no-such-zone", "not-cron"):
        assert "never" in text(rows[name]), name
    token = await csrf(http, "/schedules")
    fired = await post(
        http, "/schedules/trigger", token, action="trigger", name="thirtieth-of-february"
    )
    assert fired.status_code == 303
    assert jobs_of_kind(conn, "thirtieth-of-february") == 1


# --- Headers and origins --------------------------------------------------------------------


@pytest.mark.parametrize(("method", "address", "fields", "status"), ANSWERS)
async def test_every_answer_carries_the_security_headers(
    client: awa.AsyncClient,
    http: httpx.AsyncClient,
    victim: awa.JobRow,
    method: str,
    address: str,
    fields: dict[str, str] | None,
    status: int,
) -> None:
    data = None
    if fields is not None:
        token = await csrf(http) if status != 403 else "forged"
        data = {"csrf_token": token, **named(fields, victim)}
    answer = await http.request(method, named(address, victim), data=data)
    assert answer.status_code == status, answer.text[:500]
    assert_security_headers(answer)
    if answer.headers.get("content-type", "").startswith("text/html"):
        assert not re.search(r"<script(?![^>]*\bsrc=)", answer.text), "inline script"
        assert not re.search(r"\son[a-z]+\s*=", answer.text), "inline event handler"
        assert not re.search(r"\sstyle\s*=", answer.text), "inline style"


def assert_security_headers(answer: httpx.Response) -> None:
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    policy = dict(part.split(" ", 1) for part in CONTENT_SECURITY_POLICY.split("; "))
    assert policy["script-src"] == "'self'"
    assert policy["object-src"] == "'none'"
    assert policy["base-uri"] == "'none'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["form-action"] == "'self'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.headers["referrer-policy"] == "same-origin"
    assert answer.headers["x-content-type-options"] == "nosniff"


async def test_the_guards_refusals_carry_the_headers_too(client: awa.AsyncClient) -> None:
    async with browse(create_app(client, auth="ops:s3cret")) as http:
        refused = await http.get("/")
        assert refused.status_code == 401
        assert_security_headers(refused)
    async with browse(create_app(client, read_only=True)) as http:
        refused = await http.post("/queues/pause", data={"action": "pause", "queue": "q"})
        assert refused.status_code == 403
        assert_security_headers(refused)


@pytest.mark.parametrize(("headers", "allowed"), ORIGINS)
async def test_a_post_from_another_origin_is_refused(
    http: httpx.AsyncClient,
    conn: Conn,
    victim: awa.JobRow,
    headers: dict[str, str],
    allowed: bool,
) -> None:
    token = await csrf(http)
    data = {"csrf_token": token, "action": "cancel"}
    answer = await http.post(f"/jobs/{victim.id}/cancel", data=data, headers=headers)
    if allowed:
        assert answer.status_code == 303, answer.text
        assert must_job_row(conn, victim.id)["state"] == "cancelled"
    else:
        assert answer.status_code == 403
        assert answer.text.startswith("refused: the request comes from another origin")
        assert must_job_row(conn, victim.id)["state"] == "available"
        assert_security_headers(answer)


async def test_the_origin_rule_under_a_prefix_and_a_port(
    client: awa.AsyncClient, conn: Conn, victim: awa.JobRow
) -> None:
    host = Starlette()
    host.mount("/ops/awa", create_app(client))
    async with browse(host, base="http://ops.test:8080") as http:
        token = await csrf(http, "/ops/awa/jobs")
        data = {"csrf_token": token, "action": "cancel"}
        address = f"/ops/awa/jobs/{victim.id}/cancel"
        refused = await http.post(address, data=data, headers={"Origin": "http://ops.test"})
        assert refused.status_code == 403
        assert must_job_row(conn, victim.id)["state"] == "available"
        done = await http.post(address, data=data, headers={"Origin": "http://ops.test:8080"})
        assert done.status_code == 303
        assert done.headers["location"] == f"/ops/awa/jobs/{victim.id}"
    assert must_job_row(conn, victim.id)["state"] == "cancelled"


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_oversized_form_is_refused_before_it_is_read_whole(
    http: httpx.AsyncClient, conn: Conn, victim: awa.JobRow, chunked: bool
) -> None:
    """A 1 MB form (by its Content-Length, or streamed without one) gets 413 and acts on
    nothing; a form of normal size still acts."""
    before = snapshot(conn)
    token = await csrf(http)
    body = f"csrf_token={token}&action=cancel&next=/&padding=".encode() + b"x" * 1_000_000

    async def stream() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 65_536):
            yield body[start : start + 65_536]

    answer = await http.post(
        f"/jobs/{victim.id}/cancel",
        content=stream() if chunked else body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 413, answer.text
    assert "over 65536 bytes" in answer.text
    assert snapshot(conn) == before
    control = await post(http, f"/jobs/{victim.id}/cancel", token, action="cancel", next="/")
    assert control.status_code == 303, control.text
    assert must_job_row(conn, victim.id)["state"] == "cancelled"
