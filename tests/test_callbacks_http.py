"""The HTTP callback receiver: ``awa.callbacks.http.create_app`` (through httpx's ASGI
transport) and ``awa callback serve`` (a real server on a socket).

Contract: POST /callbacks/{id}/complete|fail|retry|resume|resolve|heartbeat with JSON
bodies; JSON answers with the job's state; 404 no such callback, 400 bad input, 401 a
missing or bad signature (HMAC-SHA256 over ``timestamp.METHOD path.body`` with headers
X-Awa-Timestamp and X-Awa-Signature, at most five minutes of clock skew); resolutions go
through the given AsyncClient, so its hooks and follow-ups fire.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import awa
from awa.callbacks.http import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    create_app,
    sign_request,
    verify_signature,
)
from helpers_callbacks import (
    Payment,
    Receipt,
    free_port,
    insert_parked,
    last_error,
    serving_receiver,
)
from helpers_lifecycle import Recorder, jobs_of_kind
from helpers_worker import row
from jobs_helpers import Conn

SECRET = "s3cret-shared-with-the-provider"
AWA = Path(sys.executable).with_name("awa")  # the console script

# Signing -----------------------------------------------------------------------------------------


def test_sign_request_is_hmac_sha256_over_timestamp_method_path_and_body() -> None:
    body = b'{"payload": {"paid": true}}'
    headers = sign_request(SECRET, "post", "/callbacks/abc/complete", body, timestamp=1700000000)
    expected = hmac.new(
        SECRET.encode(), b"1700000000.POST /callbacks/abc/complete." + body, hashlib.sha256
    ).hexdigest()
    assert headers == {TIMESTAMP_HEADER: "1700000000", SIGNATURE_HEADER: f"sha256={expected}"}
    assert (
        sign_request(SECRET.encode(), "POST", "/callbacks/abc/complete", body.decode(), 1700000000)
        == headers
    )


def test_verify_signature_rejects_what_it_should() -> None:
    path, body = "/callbacks/abc/complete", b"{}"
    now = 1700000000
    good = sign_request(SECRET, "POST", path, body, timestamp=now)
    verify_signature(SECRET, "POST", path, body, good, now=now + 299)
    verify_signature(SECRET, "POST", path, body, good, now=now - 299)
    cases: list[tuple[dict[str, str], str, str, bytes, float]] = [
        ({}, "POST", path, body, now),
        ({TIMESTAMP_HEADER: str(now)}, "POST", path, body, now),
        (good, "POST", path, body, now + 301),
        (good, "POST", path, body, now - 301),
        (good, "POST", "/callbacks/other/complete", body, now),
        (good, "PUT", path, body, now),
        (good, "POST", path, b'{"payload": 1}', now),
        ({**good, TIMESTAMP_HEADER: "yesterday"}, "POST", path, body, now),
        ({**good, SIGNATURE_HEADER: "md5=abc"}, "POST", path, body, now),
        ({**good, SIGNATURE_HEADER: good[SIGNATURE_HEADER][:-2] + "00"}, "POST", path, body, now),
    ]
    for headers, method, signed_path, signed_body, at in cases:
        with pytest.raises(SignatureError):
            verify_signature(SECRET, method, signed_path, signed_body, headers, now=at)
    with pytest.raises(SignatureError):
        verify_signature("another secret", "POST", path, body, good, now=now)


def test_create_app_needs_a_secret_or_allow_unsigned() -> None:
    client = awa.AsyncClient("postgresql://unused")
    with pytest.raises(ValueError, match="allow_unsigned"):
        create_app(client)
    with pytest.raises(ValueError, match="empty"):
        create_app(client, secret="")
    create_app(client, allow_unsigned=True)
    create_app(client, secret=SECRET)


# The ASGI app ------------------------------------------------------------------------------------


class Sender:
    """An httpx client on the ASGI app that signs what it sends (like a provider would)."""

    def __init__(self, http: httpx.AsyncClient, secret: str | None = SECRET) -> None:
        self.http = http
        self.secret = secret

    async def post(
        self,
        path: str,
        body: Any = None,
        *,
        sign: bool = True,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> httpx.Response:
        content = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        sent = {"content-type": "application/json", **(headers or {})}
        if sign and self.secret is not None:
            sent.update(sign_request(self.secret, "POST", path, content))
        return await self.http.post(path, content=content, headers=sent)


@contextlib.asynccontextmanager
async def asgi(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
        yield http


@pytest.fixture
async def sender(client: awa.AsyncClient) -> AsyncIterator[Sender]:
    async with asgi(create_app(client, secret=SECRET)) as http:
        yield Sender(http)


async def test_signed_complete_goes_through_the_client(client: awa.AsyncClient, conn: Conn) -> None:
    """A signed complete changes the row, answers with the job's state, and runs the
    client's hooks and follow-ups."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    client.on_completed_enqueue(Payment, lambda args, job: Receipt(args.order, job.id))
    job_id, cb = await insert_parked(client, conn)
    async with asgi(create_app(client, secret=SECRET)) as http:
        response = await Sender(http).post(f"/callbacks/{cb}/complete", {"payload": {"paid": 1}})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["callback_id"] == cb
    assert answer["action"] == "complete"
    assert answer["job_id"] == job_id
    assert answer["state"] == "completed"
    assert answer["kind"] == "payment"
    db = row(conn, job_id)
    assert db["state"] == "completed"
    assert db["output"] == {"paid": 1}
    [event] = recorder.of(awa.Completed, job_id)
    assert event.output == {"paid": 1}
    assert len(jobs_of_kind(conn, "receipt")) == 1


@pytest.mark.parametrize(
    "tamper",
    ["unsigned", "bad_signature", "other_secret", "old_timestamp", "other_path", "other_body"],
)
async def test_requests_without_a_valid_signature_are_refused(
    sender: Sender, client: awa.AsyncClient, conn: Conn, tamper: str
) -> None:
    job_id, cb = await insert_parked(client, conn)
    path = f"/callbacks/{cb}/complete"
    body = json.dumps({"payload": {"paid": True}}).encode()
    headers = sign_request(SECRET, "POST", path, body)
    if tamper == "unsigned":
        headers = {}
    elif tamper == "bad_signature":
        headers[SIGNATURE_HEADER] = "sha256=" + "0" * 64
    elif tamper == "other_secret":
        headers = sign_request("guess", "POST", path, body)
    elif tamper == "old_timestamp":
        headers = sign_request(SECRET, "POST", path, body, timestamp=time.time() - 600)
    elif tamper == "other_path":
        _, other = await insert_parked(client, conn)
        headers = sign_request(SECRET, "POST", f"/callbacks/{other}/complete", body)
    else:
        body = json.dumps({"payload": {"paid": False}}).encode()
    response = await sender.post(path, raw=body, sign=False, headers=headers)
    assert response.status_code == 401, response.text
    assert "error" in response.json()
    assert row(conn, job_id)["state"] == "waiting_external"
    assert str(row(conn, job_id)["callback_id"]) == cb


async def test_every_action(sender: Sender, client: awa.AsyncClient, conn: Conn) -> None:
    failed_id, failed_cb = await insert_parked(client, conn)
    response = await sender.post(f"/callbacks/{failed_cb}/fail", {"error": "card declined"})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "failed"
    assert last_error(conn, failed_id)["error"] == "card declined"

    retried_id, retried_cb = await insert_parked(client, conn)
    response = await sender.post(f"/callbacks/{retried_cb}/retry")
    assert response.json()["state"] == "available"
    assert response.json()["attempt"] == 0

    resumed_id, resumed_cb = await insert_parked(client, conn)
    response = await sender.post(f"/callbacks/{resumed_cb}/resume", {"payload": {"n": 1}})
    assert response.json()["state"] == "available"
    assert row(conn, resumed_id)["metadata"]["_awa_callback_result"] == {"n": 1}

    waiting_id, waiting_cb = await insert_parked(client, conn, timeout_seconds=10)
    response = await sender.post(f"/callbacks/{waiting_cb}/heartbeat", {"timeout_seconds": 7200})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "waiting_external"
    assert response.json()["callback_timeout_at"] is not None
    timeout = row(conn, waiting_id)["callback_timeout_at"]
    assert timeout.timestamp() > time.time() + 7000

    _lease_id, lease_cb = await insert_parked(client, conn)
    response = await sender.post(f"/callbacks/{lease_cb}/complete", {"run_lease": 5})
    assert response.status_code == 404
    response = await sender.post(f"/callbacks/{lease_cb}/complete", {"run_lease": 1})
    assert response.json()["state"] == "completed"
    assert row(conn, retried_id)["state"] == "available"


async def test_resolve_answers_with_the_outcome(
    sender: Sender, client: awa.AsyncClient, conn: Conn
) -> None:
    expressions = {"on_complete": 'payload.status == "paid"', "transform": "payload.amount"}
    job_id, cb = await insert_parked(
        client, conn, on_fail='payload.status == "failed"', **expressions
    )
    response = await sender.post(f"/callbacks/{cb}/resolve", {"payload": {"status": "pending"}})
    assert response.status_code == 200
    assert response.json() == {
        "callback_id": cb,
        "action": "resolve",
        "outcome": "ignored",
        "reason": "no expressions configured, default is ignore",
    }
    response = await sender.post(
        f"/callbacks/{cb}/resolve", {"payload": {"status": "paid", "amount": 42}}
    )
    answer = response.json()
    assert answer["outcome"] == "completed"
    assert answer["payload"] == 42
    assert answer["state"] == "completed"
    assert row(conn, job_id)["output"] == 42

    _failed_id, failed_cb = await insert_parked(client, conn)
    response = await sender.post(
        f"/callbacks/{failed_cb}/resolve", {"payload": None, "default_action": "fail"}
    )
    assert response.json()["outcome"] == "failed"
    assert response.json()["state"] == "failed"


async def test_errors_answer_with_their_status(
    sender: Sender, client: awa.AsyncClient, conn: Conn
) -> None:
    job_id, cb = await insert_parked(client, conn)
    cases: list[tuple[str, Any, bytes | None, int]] = [
        (f"/callbacks/{uuid.uuid4()}/complete", {}, None, 404),
        ("/callbacks/not-a-uuid/complete", {}, None, 400),
        (f"/callbacks/{cb}/complete", None, b"{not json", 400),
        (f"/callbacks/{cb}/complete", [1, 2], None, 400),
        (f"/callbacks/{cb}/complete", {"paylaod": 1}, None, 400),
        (f"/callbacks/{cb}/complete", {"run_lease": "one"}, None, 400),
        (f"/callbacks/{cb}/fail", {}, None, 400),
        (f"/callbacks/{cb}/fail", {"error": 5}, None, 400),
        (f"/callbacks/{cb}/resolve", {"default_action": "explode"}, None, 400),
        (f"/callbacks/{cb}/heartbeat", {"timeout_seconds": -1}, None, 400),
        (f"/callbacks/{cb}/explode", {}, None, 404),
    ]
    for path, body, raw, status in cases:
        response = await sender.post(path, body, raw=raw)
        assert response.status_code == status, (path, body, response.text)
        assert response.json()["error"], response.text
    assert (await sender.http.get(f"/callbacks/{cb}/complete")).status_code == 405
    big = b'{"payload": "' + b"x" * (1024 * 1024) + b'"}'
    assert (await sender.post(f"/callbacks/{cb}/complete", raw=big)).status_code == 413
    db = row(conn, job_id)
    assert db["state"] == "waiting_external"
    assert str(db["callback_id"]) == cb


async def test_resolved_twice_is_not_found(
    sender: Sender, client: awa.AsyncClient, conn: Conn
) -> None:
    _, cb = await insert_parked(client, conn)
    assert (await sender.post(f"/callbacks/{cb}/complete")).status_code == 200
    response = await sender.post(f"/callbacks/{cb}/complete")
    assert response.status_code == 404
    assert cb in response.json()["error"]


async def test_failing_follow_up_answers_500_and_changes_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    def broken(args: Payment, job: awa.JobRow) -> Receipt:
        raise RuntimeError("ledger offline")

    client.on_completed_enqueue(Payment, broken)
    job_id, cb = await insert_parked(client, conn)
    async with asgi(create_app(client, secret=SECRET)) as http:
        response = await Sender(http).post(f"/callbacks/{cb}/complete", {"payload": 1})
    assert response.status_code == 500
    assert "ledger offline" in response.json()["error"]
    assert "rolled back" in response.json()["error"]
    db = row(conn, job_id)
    assert db["state"] == "waiting_external"
    assert str(db["callback_id"]) == cb


async def test_allow_unsigned(client: awa.AsyncClient, conn: Conn) -> None:
    """Without a secret anything goes; with a secret and allow_unsigned, unsigned requests
    pass but a signed one must still be valid."""
    _, first = await insert_parked(client, conn)
    async with asgi(create_app(client, allow_unsigned=True)) as http:
        response = await Sender(http, secret=None).post(f"/callbacks/{first}/complete")
    assert response.status_code == 200
    _, second = await insert_parked(client, conn)
    _, third = await insert_parked(client, conn)
    async with asgi(create_app(client, secret=SECRET, allow_unsigned=True)) as http:
        sender = Sender(http)
        forged = {TIMESTAMP_HEADER: str(int(time.time())), SIGNATURE_HEADER: "sha256=00"}
        bad = await sender.post(f"/callbacks/{second}/complete", sign=False, headers=forged)
        assert bad.status_code == 401
        unsigned = await sender.post(f"/callbacks/{second}/complete", sign=False)
        assert unsigned.status_code == 200
        signed = await sender.post(f"/callbacks/{third}/complete")
        assert signed.status_code == 200


async def test_mounted_in_another_app(client: awa.AsyncClient, conn: Conn) -> None:
    """Mounted under /hooks, the signature covers the full path the sender posts to."""
    parent = Starlette(routes=[Mount("/hooks", app=create_app(client, secret=SECRET))])
    job_id, cb = await insert_parked(client, conn)
    async with asgi(parent) as http:
        sender = Sender(http)
        assert (await sender.post(f"/callbacks/{cb}/complete")).status_code == 404
        response = await sender.post(f"/hooks/callbacks/{cb}/complete", {"payload": "ok"})
    assert response.status_code == 200, response.text
    assert row(conn, job_id)["output"] == "ok"


async def test_custom_prefix(client: awa.AsyncClient, conn: Conn) -> None:
    _, cb = await insert_parked(client, conn)
    async with asgi(create_app(client, secret=SECRET, prefix="/webhooks/awa/")) as http:
        response = await Sender(http).post(f"/webhooks/awa/{cb}/complete")
    assert response.status_code == 200, response.text


# awa callback serve: a real server ---------------------------------------------------------------


@contextlib.contextmanager
def serving(
    database_url: str, *args: str, cwd: Path | None = None, group: str = "callback"
) -> Iterator[str]:
    """``awa callback serve`` with this test's database and secret; yields its base URL."""
    env = {**os.environ, "DATABASE_URL": database_url, "AWA_CALLBACK_SECRET": SECRET}
    with serving_receiver(env, *args, cwd=cwd, group=group) as base:
        yield base


@pytest.mark.parametrize("group", ["callback", "callbacks"])
async def test_served_on_a_socket(
    client: awa.AsyncClient, database_url: str, conn: Conn, group: str
) -> None:
    """The CLI server (secret from AWA_CALLBACK_SECRET): a bad signature is refused and the
    row is untouched; a good one completes the job. The deprecated `awa callbacks serve`
    still serves."""
    job_id, cb = await insert_parked(client, conn)
    path = f"/callbacks/{cb}/complete"
    body = json.dumps({"payload": {"via": "http"}}).encode()
    with serving(database_url, group=group) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            forged = sign_request("wrong secret", "POST", path, body)
            refused = await http.post(path, content=body, headers=forged)
            assert refused.status_code == 401
            assert row(conn, job_id)["state"] == "waiting_external"
            unsigned = await http.post(path, content=body)
            assert unsigned.status_code == 401
            accepted = await http.post(
                path, content=body, headers=sign_request(SECRET, "POST", path, body)
            )
            assert accepted.status_code == 200, accepted.text
            assert accepted.json()["state"] == "completed"
    db = row(conn, job_id)
    assert db["state"] == "completed"
    assert db["output"] == {"via": "http"}


async def test_served_with_the_application_client(
    client: awa.AsyncClient, database_url: str, conn: Conn, tmp_path: Path
) -> None:
    """With MODULE:CLIENT the server resolves through that client: its follow-ups run."""
    (tmp_path / "payments_app.py").write_text(
        textwrap.dedent(
            """
            import dataclasses

            import awa


            @dataclasses.dataclass
            class Payment:
                order: int = 1


            @dataclasses.dataclass
            class Receipt:
                order: int
                payment_job_id: int


            client = awa.AsyncClient()
            client.on_completed_enqueue(Payment, lambda args, job: Receipt(args.order, job.id))
            """
        )
    )
    job_id, cb = await insert_parked(client, conn)
    path = f"/callbacks/{cb}/complete"
    with serving(database_url, "payments_app:client", cwd=tmp_path) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            response = await http.post(
                path, content=b"", headers=sign_request(SECRET, "POST", path, b"")
            )
    assert response.status_code == 200, response.text
    assert row(conn, job_id)["state"] == "completed"
    [receipt] = jobs_of_kind(conn, "receipt")
    assert receipt["args"] == {"order": 1, "payment_job_id": job_id}


def test_serve_needs_a_secret_or_allow_unsigned(database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AWA_CALLBACK_SECRET"}
    env["DATABASE_URL"] = database_url
    result = subprocess.run(
        [str(AWA), "callback", "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "--allow-unsigned" in result.stderr
