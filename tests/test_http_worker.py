"""HTTP workers (``awa.http_worker``): jobs handed to a real HTTP endpoint on 127.0.0.1,
worked by a real worker against the real database.

Sync mode: the answer's status decides the outcome (2xx completes with the body as output,
429/503 with Retry-After snooze, other 4xx fail for good, 5xx, timeouts and refused
connections retry). Async mode: the job parks on a callback and the function answers
through the receiver, with the reference's signed contract. Requests are signed, the
connections of a kind are capped, and the attempts are counted like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import email.utils
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import awa
from awa import callback_contract
from awa.callbacks.http import create_app
from awa.http_worker import HttpHandler, RequestSignatureError, sign_request, verify_request
from awa.testing import AwaTestClient
from helpers_http_worker import Answer, FunctionServer, Request, post_json, refused_url, serving
from helpers_lifecycle import Counters, Recorder
from helpers_worker import db_now, queue, row, seconds, start, wait_for, wait_for_state
from jobs_helpers import Conn

QUEUE = "fn"
CONTRACT_KEY = bytes(range(32))


@dataclasses.dataclass
class RenderPdf:
    document: str


def answering(answer: Answer) -> FunctionServer:
    return FunctionServer(lambda request: answer)


async def work(
    client: awa.AsyncClient,
    handler: HttpHandler,
    *,
    max_attempts: int = 5,
    jobs: int = 1,
    deadline_duration: float | None = None,
    **runtime: Any,
) -> list[int]:
    """Register ``handler`` for RenderPdf, insert ``jobs`` jobs and start a worker (with
    ``runtime`` options)."""
    client.task(RenderPdf, queue=QUEUE)(handler)
    options: dict[str, Any] = {"queue": QUEUE, "max_attempts": max_attempts}
    if deadline_duration is not None:
        options["deadline_duration"] = deadline_duration
    inserted = [await client.insert(RenderPdf(f"doc-{n}"), **options) for n in range(jobs)]
    await start(client, queue(QUEUE, max_workers=8), **runtime)
    return [job.id for job in inserted]


def last_error(row: dict[str, Any]) -> str:
    return str(row["errors"][-1]["error"])


# Sync mode ---------------------------------------------------------------------------------


async def test_a_2xx_completes_the_job_with_the_json_body_as_output(
    client: awa.AsyncClient, conn: Conn
) -> None:
    recorder = Recorder()
    client.on_event(RenderPdf)(recorder)
    answer = Answer(200, b'{"pages": 3}', {"Content-Type": "application/json"})
    with answering(answer) as function:
        handler = HttpHandler(function.url, headers={"Authorization": "Bearer t0k"})
        [job_id] = await work(client, handler)
        row = await wait_for_state(conn, job_id, "completed")
        [completed] = await recorder.wait(awa.Completed, job_id)
    assert row["output"] == {"pages": 3}
    assert completed.output == {"pages": 3}
    [request] = function.requests
    assert request.path == "/fn"
    assert request.json == {
        "job_id": job_id,
        "kind": "render_pdf",
        "args": {"document": "doc-0"},
        "attempt": 1,
        "max_attempts": 5,
    }
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer t0k"
    assert request.headers["user-agent"].startswith("awa-py/")
    assert "x-awa-request-signature" not in request.headers  # no secret, no signature
    await handler.aclose()


@pytest.mark.parametrize(
    ("body", "output"),
    [
        (b"rendered 3 pages", "rendered 3 pages"),
        (b"\xff not utf-8", "\ufffd not utf-8"),
        (b"", None),
        (b"[1, 2]", [1, 2]),
    ],
    ids=["text", "undecodable", "empty", "json-without-content-type"],
)
async def test_a_body_that_is_not_json_is_stored_as_text(
    client: awa.AsyncClient, conn: Conn, body: bytes, output: Any
) -> None:
    with answering(Answer(200, body, {"Content-Type": "text/plain"})) as function:
        [job_id] = await work(client, HttpHandler(function.url))
        row = await wait_for_state(conn, job_id, "completed")
    assert row["output"] == output


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "http-date"])
async def test_429_and_503_with_retry_after_snooze(
    client: awa.AsyncClient, conn: Conn, status: int, form: str
) -> None:
    when = email.utils.formatdate(time.time() + 40, usegmt=True)
    retry_after = "40" if form == "seconds" else when
    with answering(Answer(status, b"busy", {"Retry-After": retry_after})) as function:
        [job_id] = await work(client, HttpHandler(function.url), max_attempts=1)
        row = await wait_for_state(conn, job_id, "scheduled")
    assert row["attempt"] == 0  # a snooze consumes no attempt, even the last one
    assert row["errors"] == []
    assert 30 <= seconds(row["run_at"] - db_now(conn)) <= 41


async def test_a_long_retry_after_is_cut_to_max_retry_after(
    client: awa.AsyncClient, conn: Conn
) -> None:
    with answering(Answer(429, headers={"Retry-After": "999999999"})) as function:
        handler = HttpHandler(function.url, max_retry_after=60)
        [job_id] = await work(client, handler)
        row = await wait_for_state(conn, job_id, "scheduled")
    assert 50 <= seconds(row["run_at"] - db_now(conn)) <= 61


@pytest.mark.parametrize(("status", "reason"), [(400, "Bad Request"), (404, "Not Found")])
async def test_other_4xx_fail_for_good(
    client: awa.AsyncClient, conn: Conn, status: int, reason: str
) -> None:
    with answering(Answer(status, b'{"error": "no such document"}')) as function:
        [job_id] = await work(client, HttpHandler(function.url + "?token=secret"))
        row = await wait_for_state(conn, job_id, "failed")
    assert row["attempt"] == 1  # of 5: no further attempt
    error = last_error(row)
    assert f"POST {function.url} answered {status} {reason}" in error
    assert '{"error": "no such document"}' in error
    assert "token=secret" not in error  # the query string is not repeated into errors


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Answer(500, b"boom"), "answered 500 Internal Server Error: boom"),
        (Answer(502), "answered 502 Bad Gateway"),
        (Answer(500, b"x" * 5000), "answered 500 Internal Server Error: " + "x" * 1024 + " ..."),
        (Answer(503), "answered 503 Service Unavailable"),  # no Retry-After: a plain retry
        (Answer(429), "answered 429 Too Many Requests"),
        (Answer(200, delay=5), "no answer within 0.5s"),
    ],
    ids=["500", "502", "500-long-body", "503", "429", "timeout"],
)
async def test_5xx_and_timeouts_retry(
    client: awa.AsyncClient, conn: Conn, answer: Answer, expected: str
) -> None:
    with answering(answer) as function:
        [job_id] = await work(client, HttpHandler(function.url, timeout=0.5))
        row = await wait_for_state(conn, job_id, "retryable")
    assert row["attempt"] == 1
    assert "awa.http_worker.responses.FunctionError" in last_error(row)
    assert expected in last_error(row)


async def test_a_refused_connection_retries(client: awa.AsyncClient, conn: Conn) -> None:
    [job_id] = await work(client, HttpHandler(refused_url()))
    row = await wait_for_state(conn, job_id, "retryable")
    assert "ConnectError" in last_error(row)


async def test_a_body_over_max_response_bytes_fails_naming_the_limit(
    client: awa.AsyncClient, conn: Conn
) -> None:
    with answering(Answer(200, b'"' + b"x" * 5000 + b'"')) as function:
        [job_id] = await work(client, HttpHandler(function.url, max_response_bytes=4096))
        row = await wait_for_state(conn, job_id, "failed")
    assert "larger than max_response_bytes (4096 bytes)" in last_error(row)
    assert row["output"] is None


async def test_a_json_body_jsonb_cannot_hold_fails_with_a_clear_message(
    client: awa.AsyncClient, conn: Conn
) -> None:
    with answering(Answer(200, b'{"name": "nul\\u0000"}')) as function:
        [job_id] = await work(client, HttpHandler(function.url))
        row = await wait_for_state(conn, job_id, "failed")
    assert "answered 200 with a body that cannot be the job's output" in last_error(row)


@contextlib.asynccontextmanager
async def in_flight(client: awa.AsyncClient, **work_options: Any) -> AsyncIterator[int]:
    """A job whose request waits on a function that answers after 10 s; yields its id once
    the request is in flight, and checks on leaving that it was abandoned."""
    with answering(Answer(200, delay=10)) as function:
        handler = HttpHandler(function.url, timeout=30)
        [job_id] = await work(client, handler, **work_options)
        await wait_for(lambda: handler.in_flight == 1)
        yield job_id
        await wait_for(lambda: handler.in_flight == 0, message="the request was not abandoned")


async def test_a_deadline_interrupts_a_function_that_answers_too_late(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Deadline rescue applies as to any handler: the request in flight is abandoned."""
    async with in_flight(client, deadline_duration=0.5, deadline_rescue_interval=0.1) as job_id:
        rescued = await wait_for_state(conn, job_id, "retryable")
    assert "deadline" in last_error(rescued)


async def test_shutdown_abandons_the_request_and_keeps_the_attempt(
    client: awa.AsyncClient, conn: Conn
) -> None:
    async with in_flight(client, max_attempts=1) as job_id:
        began = time.monotonic()
        await client.shutdown(timeout=0.2)
        took = time.monotonic() - began
    assert took < 2  # abandoned once is_cancelled() turned true, not after the grace
    final = row(conn, job_id)
    assert final["state"] in ("available", "scheduled")  # back on its queue, due now
    assert final["attempt"] == 0  # the abandoned attempt is not consumed
    assert final["errors"] == []


async def test_the_testing_harness_runs_an_http_handler(client: awa.AsyncClient) -> None:
    with answering(Answer(200, b'{"pages": 2}')) as function:
        await client.insert(RenderPdf("a"))
        result = await AwaTestClient(client).work_one(RenderPdf, HttpHandler(function.url))
    assert result.is_completed()
    assert result.output == {"pages": 2}


# Signed requests ---------------------------------------------------------------------------

SECRET = "shared secret"


def expected_signature(request: Request) -> str:
    """The documented scheme, computed here without awa's code."""
    message = request.headers["x-awa-timestamp"].encode() + b"." + request.body
    return "sha256=" + hmac.new(SECRET.encode(), message, hashlib.sha256).hexdigest()


async def test_requests_are_signed_with_the_shared_secret(
    client: awa.AsyncClient, conn: Conn
) -> None:
    def respond(request: Request) -> Answer:
        try:
            verify_request(SECRET, request.body, request.headers)
        except RequestSignatureError as error:
            return Answer(401, str(error).encode())
        return Answer(200, b'"verified"')

    with FunctionServer(respond) as function:
        [job_id] = await work(client, HttpHandler(function.url, secret=SECRET))
        row = await wait_for_state(conn, job_id, "completed")
    assert row["output"] == "verified"
    [request] = function.requests
    assert request.headers["x-awa-request-signature"] == expected_signature(request)
    assert abs(int(request.headers["x-awa-timestamp"]) - time.time()) < 60


async def test_a_function_refusing_the_signature_fails_the_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    def respond(request: Request) -> Answer:
        try:
            verify_request("another secret", request.body, request.headers)
        except RequestSignatureError as error:
            return Answer(401, str(error).encode())
        return Answer(200)

    with FunctionServer(respond) as function:
        [job_id] = await work(client, HttpHandler(function.url, secret=SECRET))
        row = await wait_for_state(conn, job_id, "failed")
    assert "answered 401 Unauthorized: X-Awa-Request-Signature does not match" in last_error(row)


def test_verify_request_refuses_tampering_staleness_and_missing_headers() -> None:
    body = b'{"job_id": 1}'
    headers = sign_request(SECRET, body, timestamp=1_000_000)
    verify_request(SECRET, body, headers, now=1_000_100)
    lower = {name.lower(): value for name, value in headers.items()}
    verify_request(SECRET.encode(), body, lower, now=1_000_100)
    cases = [
        (b'{"job_id": 2}', headers, 1_000_000, "does not match"),
        (body, headers, 1_000_301, "more than 300 seconds"),
        (body, {"X-Awa-Timestamp": "1000000"}, 1_000_000, "missing X-Awa-Request-Signature"),
        (body, {**headers, "X-Awa-Timestamp": "soon"}, 1_000_000, "must be Unix seconds"),
        (body, {**headers, "X-Awa-Request-Signature": "md5=00"}, 1_000_000, "sha256=<hex"),
        (body, {**headers, "X-Awa-Request-Signature": "sha256=é"}, 1_000_000, "sha256=<hex"),
    ]
    for signed_body, signed_headers, now, message in cases:
        with pytest.raises(RequestSignatureError, match=message):
            verify_request(SECRET, signed_body, signed_headers, now=now)


# Connection limits -------------------------------------------------------------------------


async def test_max_connections_caps_the_requests_in_flight_for_a_kind(
    client: awa.AsyncClient, conn: Conn
) -> None:
    with answering(Answer(200, b"{}", delay=0.3)) as function:
        handler = HttpHandler(function.url, max_connections=2)
        job_ids = await work(client, handler, jobs=6)
        await wait_for(lambda: function.max_concurrent >= 2, 10)
        for job_id in job_ids:
            await wait_for_state(conn, job_id, "completed", timeout=15)
    assert len(function.requests) == 6
    assert function.max_concurrent == 2  # eight slots, but two connections for this kind
    assert handler.in_flight == 0


# Async mode through the receiver -----------------------------------------------------------


def calling_back(action: str, body: dict[str, Any], results: list[tuple[int, Any]]) -> Any:
    """A function that accepts the job (202), then calls back ``action`` with ``body`` and
    the signature header it was given, as a function written for awa-pg does."""

    def respond(request: Request) -> Answer:
        url = request.json["callback_url"].removesuffix("/complete") + f"/{action}"
        forwarded = {"X-Awa-Signature": request.headers["x-awa-signature"]}
        return Answer(202, then=lambda: results.append(post_json(url, body, forwarded)))

    return respond


async def through_the_receiver(
    client: awa.AsyncClient,
    conn: Conn,
    action: str,
    body: dict[str, Any],
    state: str,
    **options: Any,
) -> tuple[dict[str, Any], Request, list[tuple[int, Any]], str]:
    """Work one job in async mode with a function calling back ``action`` through the
    receiver (served by uvicorn); the job's row once in ``state``, the function's request,
    the receiver's answers to the function, and the receiver's base URL."""
    results: list[tuple[int, Any]] = []
    receiver = create_app(client, contract_secret=CONTRACT_KEY)
    async with serving(receiver) as base_url:
        with FunctionServer(calling_back(action, body, results)) as function:
            handler = HttpHandler(function.url, mode="async", callback_base_url=base_url, **options)
            [job_id] = await work(client, handler)
            row = await wait_for_state(conn, job_id, state)
    return row, function.requests[0], results, base_url


async def test_async_mode_parks_and_completes_through_the_receiver(
    client: awa.AsyncClient, conn: Conn
) -> None:
    row, request, results, base_url = await through_the_receiver(
        client,
        conn,
        "complete",
        {"payload": {"pages": 7}},
        "completed",
        contract_secret=CONTRACT_KEY.hex(),
        callback_timeout=600,
    )
    assert row["output"] == {"pages": 7}
    callback_id = request.json["callback_id"]
    assert request.json["callback_url"] == f"{base_url}/api/callbacks/{callback_id}/complete"
    assert request.json["args"] == {"document": "doc-0"}
    assert request.json["job_id"] == row["id"]
    assert callback_contract.verify(CONTRACT_KEY, callback_id, request.headers["x-awa-signature"])
    assert results == [(200, {"id": row["id"], "state": "Completed"})]


async def test_async_mode_fails_through_the_receiver(client: awa.AsyncClient, conn: Conn) -> None:
    row, _, results, _ = await through_the_receiver(
        client, conn, "fail", {"error": "renderer crashed"}, "failed", contract_secret=CONTRACT_KEY
    )
    assert "renderer crashed" in last_error(row)
    assert results == [(200, {"id": row["id"], "state": "Failed"})]


async def test_async_mode_a_wrong_signature_leaves_the_job_parked(
    client: awa.AsyncClient, conn: Conn
) -> None:
    receiver = create_app(client, contract_secret=CONTRACT_KEY)
    async with serving(receiver) as base_url:
        with answering(Answer(202)) as function:
            handler = HttpHandler(
                function.url,
                mode="async",
                callback_base_url=base_url + "/",
                callback_prefix="api/callbacks/",
                contract_secret=CONTRACT_KEY,
            )
            [job_id] = await work(client, handler)
            await wait_for_state(conn, job_id, "waiting_external")
            url = function.requests[0].json["callback_url"]
            forged = {"X-Awa-Signature": callback_contract.sign(bytes(32), "x")}
            answered = await asyncio.to_thread(post_json, url, {"payload": {}}, forged)
            row = await wait_for_state(conn, job_id, "waiting_external")
    assert answered[0] == 401
    assert row["output"] is None


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (Answer(404), "failed"),
        (Answer(500), "retryable"),
        (Answer(503, headers={"Retry-After": "30"}), "scheduled"),
    ],
    ids=["404", "500", "503-retry-after"],
)
async def test_async_mode_maps_a_refusal_like_sync_mode(
    client: awa.AsyncClient, conn: Conn, answer: Answer, state: str
) -> None:
    with answering(answer) as function:
        handler = HttpHandler(function.url, mode="async", callback_base_url="http://127.0.0.1:9")
        [job_id] = await work(client, handler)
        await wait_for_state(conn, job_id, state)
    [request] = function.requests
    assert request.json["callback_url"].startswith("http://127.0.0.1:9/api/callbacks/")


# Metrics -----------------------------------------------------------------------------------


async def test_the_attempts_are_counted_like_any_other(client: awa.AsyncClient, conn: Conn) -> None:
    labels = {"awa.job.kind": "render_pdf", "awa.job.queue": QUEUE}
    completed = Counters.capture("awa.job.completed", **labels)
    failed = Counters.capture("awa.job.failed", **labels)
    snoozed = Counters.capture("awa.job.snoozed", **labels)
    answers = iter([Answer(429, headers={"Retry-After": "0"}), Answer(200), Answer(404)])
    with FunctionServer(lambda request: next(answers)) as function:
        client.task(RenderPdf, queue=QUEUE)(HttpHandler(function.url))
        first = await client.insert(RenderPdf("a"), queue=QUEUE)
        await start(client, queue(QUEUE, max_workers=1))
        await wait_for_state(conn, first.id, "completed")
        second = await client.insert(RenderPdf("b"), queue=QUEUE)
        await wait_for_state(conn, second.id, "failed")
    await wait_for(lambda: (snoozed.delta(), completed.delta(), failed.delta()) == (1, 1, 1))


# Registration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://files.example.com/x", "url 'ftp://files.example.com/x' must use http or https"),
        ("", "url '' is not a URL"),
        ("http://", "url 'http://' has no host"),
        ("render-pdf", "url 'render-pdf' must use http or https, not ''"),
        (" http://a.example", "is not a URL (empty, or holds spaces"),
        ("http://a.example:99999/", "url 'http://a.example:99999/' is not a valid URL"),
        (42, "url must be a string URL, not int"),
    ],
)
def test_a_bad_url_is_refused_at_registration(url: Any, message: str) -> None:
    with pytest.raises(awa.ValidationError, match=message.replace("(", r"\(")):
        HttpHandler(url)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "later"}, "mode must be 'sync' or 'async', not 'later'"),
        ({"mode": "async"}, "mode='async' needs callback_base_url"),
        ({"mode": "async", "callback_base_url": "mailto:x"}, "callback_base_url 'mailto:x'"),
        ({"timeout": 0}, "timeout must be positive and finite, not 0"),
        ({"max_connections": 1.5}, "max_connections must be a whole number"),
        ({"max_response_bytes": 2**21}, "max_response_bytes must be at most 1048576"),
        ({"headers": {"X-Awa-Signature": "x"}}, "is set by awa and cannot be given"),
        ({"headers": {"content-type": "text/xml"}}, "'content-type' is set by awa"),
        ({"headers": {"Bad Name": "x"}}, "header name 'Bad Name' is not a valid HTTP token"),
        ({"headers": {"X-Trace": "a\r\nb"}}, "must be ASCII text without CR, LF or NUL"),
        ({"contract_secret": "abcd"}, "contract_secret: callback secret must be exactly 32"),
        ({"secret": ""}, "secret must be a non-empty str or bytes"),
    ],
)
def test_bad_options_are_refused_at_registration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(awa.ValidationError, match=message.replace("(", r"\(")):
        HttpHandler("https://fn.example.com/render", **options)


def test_retry_after_forms() -> None:
    from awa.http_worker.responses import retry_after_seconds

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    assert retry_after_seconds("120", now) == 120
    assert retry_after_seconds("Thu, 01 Jan 2026 00:01:00 GMT", now) == 60
    assert retry_after_seconds("Wed, 31 Dec 2025 00:00:00 GMT", now) == 0
    for unusable in (None, "", "soon", "-5", "1.5", "١٢", "Thu, 01 Jan 99999 00:00:00 GMT"):
        assert retry_after_seconds(unusable, now) is None
    assert retry_after_seconds("9" * 5000, now) == float("inf")  # cut by max_retry_after


def test_a_snooze_lasts_a_second_at_least() -> None:
    """Retry-After: 0 again and again must not call the function in a tight loop."""
    from awa.http_worker.responses import Reply, judge

    assert judge(Reply(429, "", "0", b""), "u", 60) == awa.Snooze(1)
    assert judge(Reply(503, "", "9" * 400, b""), "u", 60) == awa.Snooze(60)


# Traces ------------------------------------------------------------------------------------


def test_the_request_is_a_client_span_of_the_attempt_and_carries_its_context(
    database_url: str,
) -> None:
    """In a process with a tracer provider (tests/procs/http_trace_scenario.py): the POST is
    a client span under the attempt's consumer span, and the function gets its context."""
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "procs" / "http_trace_scenario.py")],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    *spans, received = [json.loads(line) for line in result.stdout.splitlines()]
    [post] = [span for span in spans if span["name"] == "POST"]
    [attempt] = [span for span in spans if span["id"] == post["parent"]]
    assert (attempt["name"], attempt["kind"]) == ("job.execute render_pdf", "CONSUMER")
    assert post["kind"] == "CLIENT"
    assert post["attributes"]["http.response.status_code"] == 200
    assert received["traceparent"].startswith(f"00-{post['trace']}-{post['id']}-")
