"""The reference package's (awa-pg) HTTP callback contract: ``awa.callback_contract`` and the
receiver's contract routes (``create_app(contract_secret=...)``, ``awa callback serve
--callback-hmac-secret``).

Contract: POST {prefix}/{id}/complete|fail|heartbeat (prefix /api/callbacks) with
``{"payload": ...}``, ``{"error": ...}``, ``{"timeout_seconds": ...}``, authenticated by
``X-Awa-Signature`` = lowercase hex of keyed BLAKE3(secret32, id); an unsigned or wrongly
signed request is refused with 401 and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import blake3
import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import awa
from awa import callback_contract
from awa.callback_contract import (
    DEFAULT_PATH_PREFIX,
    SIGNATURE_HEADER,
    build_callback_url,
    function_request,
    parse_secret,
    sign,
    signature_headers,
    signed_callback,
    verify,
)
from awa.callbacks.http import create_app, sign_request
from helpers_callbacks import (
    Payment,
    Receipt,
    free_port,
    insert_parked,
    last_error,
    serving_receiver,
)
from helpers_lifecycle import Recorder, jobs_of_kind
from helpers_worker import db_now, queue, row, seconds, start, wait_for_state
from jobs_helpers import Conn

KEY = bytes([13] * 32)
KEY_HEX = KEY.hex()
SECRET = "the native scheme's HMAC secret"
AWA = Path(sys.executable).with_name("awa")  # the console script

# Signing: golden vectors ---------------------------------------------------------------------


def test_constants() -> None:
    assert callback_contract.SIGNATURE_HEADER == "X-Awa-Signature"
    assert callback_contract.DEFAULT_PATH_PREFIX == "/api/callbacks"
    assert callback_contract.DEFAULT_HEARTBEAT_TIMEOUT_SECS == 3600.0
    assert callback_contract.SECRET_ENV_VAR == "AWA_CALLBACK_HMAC_SECRET"


def test_reference_pinned_vector() -> None:
    """The vector the reference pins in both its Rust crate
    (awa-model/src/callback_contract.rs, sign_pinned_test_vector) and its Python package
    (awa-python/tests/test_callback_contract.py, test_known_test_vector)."""
    assert sign(bytes([7] * 32), "abc") == (
        "b1495225f01fa8cd09e410d288d09b68c1cc9fb2414686c0d3ac13fc905497d9"
    )


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("", "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"),
        ("\x00", "6d7878dfff2f485635d39013278ae14f1454b8c0a3a2d34bc1ab38228a80c95b"),
    ],
)
def test_official_blake3_keyed_vectors(message: str, expected: str) -> None:
    """BLAKE3's own test vectors (test_vectors/test_vectors.json of BLAKE3-team/BLAKE3:
    keyed_hash, inputs of length 0 and 1, the first 32 bytes): an independent check that
    sign() is the keyed hash of the id's UTF-8 bytes."""
    assert sign(b"whats the Elvish word for friend", message) == expected


def test_sign_is_the_keyed_hash_of_the_utf8_id() -> None:
    callback_id = "550e8400-e29b-41d4-a716-446655440000"
    signature = sign(KEY, callback_id)
    assert signature == blake3.blake3(callback_id.encode(), key=KEY).hexdigest()
    assert len(signature) == 64
    assert signature == signature.lower()
    assert sign(KEY, "é") == blake3.blake3("é".encode(), key=KEY).hexdigest()
    # A UUID object signs as its canonical string, as the reference's worker signs it.
    assert sign(KEY, uuid.UUID(callback_id)) == signature


def test_verify() -> None:
    callback_id = "550e8400-e29b-41d4-a716-446655440000"
    signature = sign(KEY, callback_id)
    assert verify(KEY, callback_id, signature) is True
    # blake3::Hash::from_hex, which the reference verifies with, reads either case.
    assert verify(KEY, callback_id, signature.upper()) is True
    assert verify(bytes([14] * 32), callback_id, signature) is False
    assert verify(KEY, callback_id.replace("0000", "0001"), signature) is False
    for malformed in [
        "",
        "not-hex",
        signature[:-1],
        signature + "0",
        " " + signature,
        signature + "\n",
        "0x" + signature[2:],
        "sha256=" + signature,
        signature[:-1] + "\uff10",  # a fullwidth digit: not ASCII hex
    ]:
        assert verify(KEY, callback_id, malformed) is False, malformed


def test_the_secret_must_be_32_bytes() -> None:
    with pytest.raises(ValueError, match=r"exactly 32 bytes \(got 9\)"):
        sign(b"too short", "abc")
    with pytest.raises(ValueError, match=r"exactly 32 bytes \(got 16\)"):
        verify(b"\x00" * 16, "abc", "ff" * 32)
    with pytest.raises(ValueError, match=r"\(got 33\)"):
        sign(b"\x00" * 33, "abc")
    with pytest.raises(TypeError, match="parse_secret"):
        sign(KEY_HEX, "abc")  # type: ignore[arg-type]
    assert sign(bytearray(KEY), "abc") == sign(KEY, "abc")


def test_parse_secret() -> None:
    assert parse_secret(KEY_HEX) == KEY
    assert parse_secret(KEY_HEX.upper()) == KEY
    assert parse_secret(f"  {KEY_HEX}\n") == KEY
    for bad, message in [
        ("zz" * 32, "valid hex"),
        (KEY_HEX[:-1], "valid hex"),
        (KEY_HEX[:62] + " 0", "valid hex"),
        ("", "32 bytes"),
        (KEY_HEX[:62], "32 bytes"),
        (KEY_HEX + "00", "32 bytes"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_secret(bad)


# URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "prefix", "action", "expected"),
    [
        # The reference's own cases (Rust and Python tests of callback_url).
        ("https://awa.example.com", "/api/callbacks", "complete", "https://awa.example.com/api/callbacks/abc/complete"),
        ("https://api.example.com", "/awa-cb", "fail", "https://api.example.com/awa-cb/abc/fail"),
        ("https://api.example.com/", "/awa-cb/", "heartbeat", "https://api.example.com/awa-cb/abc/heartbeat"),
        ("https://api.example.com", "awa-cb", "complete", "https://api.example.com/awa-cb/abc/complete"),
        ("https://api.example.com", "", "complete", "https://api.example.com/abc/complete"),
        ("https://api.example.com", "   ", "complete", "https://api.example.com/abc/complete"),
        ("https://api.example.com", "/jobs/v1/callbacks", "complete", "https://api.example.com/jobs/v1/callbacks/abc/complete"),
        # Edge cases, each checked against the reference's callback_url compiled with rustc.
        ("https://h//", "x//", "fail", "https://h/x/abc/fail"),
        ("https://h", "\u3000/x/\u3000", "heartbeat", "https://h/x/abc/heartbeat"),
        ("https://h", "\x1cx", "complete", "https://h/\x1cx/abc/complete"),
        ("https://h", " / ", "complete", "https://h/abc/complete"),
        ("https://h", "x /", "complete", "https://h/x /abc/complete"),
        ("", "", "complete", "/abc/complete"),
        ("https://h", "//a//", "complete", "https://h//a/abc/complete"),
        ("https://h/ ", "\x85p\xa0", "complete", "https://h/ /p/abc/complete"),
    ],
)  # fmt: skip
def test_build_callback_url(base: str, prefix: str, action: str, expected: str) -> None:
    assert build_callback_url(base, prefix, "abc", action) == expected


def test_what_a_reference_worker_hands_its_function() -> None:
    callback_id = "550e8400-e29b-41d4-a716-446655440000"
    url, headers = signed_callback(KEY, "https://awa.example.com/", callback_id)
    assert url == f"https://awa.example.com/api/callbacks/{callback_id}/complete"
    assert (
        headers == {SIGNATURE_HEADER: sign(KEY, callback_id)} == signature_headers(KEY, callback_id)
    )
    url, _ = signed_callback(KEY, "https://h", callback_id, prefix="cb", action="heartbeat")
    assert url == f"https://h/cb/{callback_id}/heartbeat"
    body = function_request(
        job_id=7,
        kind="generate_pdf",
        args={"document_id": "doc_1"},
        attempt=1,
        max_attempts=25,
        callback_id=callback_id,
        callback_url=url,
    )
    assert body == {
        "job_id": 7,
        "kind": "generate_pdf",
        "args": {"document_id": "doc_1"},
        "attempt": 1,
        "max_attempts": 25,
        "callback_id": callback_id,
        "callback_url": url,
    }
    sync_mode = function_request(job_id=7, kind="k", args=[1], attempt=1, max_attempts=3)
    assert sync_mode == {"job_id": 7, "kind": "k", "args": [1], "attempt": 1, "max_attempts": 3}


# The receiver's contract routes --------------------------------------------------------------


@contextlib.asynccontextmanager
async def asgi(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
        yield http


async def post(
    http: httpx.AsyncClient,
    callback_id: str,
    action: str,
    body: Any = None,
    *,
    key: bytes | None = KEY,
    prefix: str = DEFAULT_PATH_PREFIX,
) -> httpx.Response:
    """POST like a reference function: the body as JSON, signed with ``key`` (None: no
    signature header)."""
    headers = {"content-type": "application/json"}
    if key is not None:
        headers.update(signature_headers(key, callback_id))
    content = b"" if body is None else json.dumps(body).encode()
    return await http.post(f"{prefix}/{callback_id}/{action}", content=content, headers=headers)


def snapshot(conn: Conn, job_id: int) -> tuple[Any, ...]:
    db = row(conn, job_id)
    return (db["state"], db["callback_id"], db["callback_timeout_at"], db["errors"], db["output"])


async def test_signed_complete_resolves_through_the_client(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A contract-signed complete completes the parked job with the payload as its output,
    answers as the reference does, and fires the client's hooks and follow-ups."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    client.on_completed_enqueue(Payment, lambda args, job: Receipt(args.order, job.id))
    job_id, cb = await insert_parked(client, conn)
    async with asgi(create_app(client, contract_secret=KEY)) as http:
        response = await post(http, cb, "complete", {"payload": {"pdf": "s3://b/1.pdf"}})
    assert response.status_code == 200, response.text
    assert response.json() == {"id": job_id, "state": "Completed"}
    db = row(conn, job_id)
    assert db["state"] == "completed"
    assert db["output"] == {"pdf": "s3://b/1.pdf"}
    [event] = recorder.of(awa.Completed, job_id)
    assert event.output == {"pdf": "s3://b/1.pdf"}
    assert len(jobs_of_kind(conn, "receipt")) == 1


async def test_signed_fail_and_heartbeat(client: awa.AsyncClient, conn: Conn) -> None:
    failed_id, failed_cb = await insert_parked(client, conn)
    waiting_id, waiting_cb = await insert_parked(client, conn, timeout_seconds=10)
    async with asgi(create_app(client, contract_secret=KEY)) as http:
        failed = await post(http, failed_cb, "fail", {"error": "renderer crashed"})
        beat = await post(http, waiting_cb, "heartbeat", {"timeout_seconds": 7200})
        assert beat.status_code == 200, beat.text
        assert beat.json() == {"id": waiting_id, "state": "WaitingExternal"}
        later = seconds(row(conn, waiting_id)["callback_timeout_at"] - db_now(conn))
        assert 7100 < later <= 7200
        default = await post(http, waiting_cb, "heartbeat")  # no body: an hour
        assert default.status_code == 200, default.text
        later = seconds(row(conn, waiting_id)["callback_timeout_at"] - db_now(conn))
        assert 3500 < later <= 3600
    assert failed.status_code == 200, failed.text
    assert failed.json() == {"id": failed_id, "state": "Failed"}
    assert row(conn, failed_id)["state"] == "failed"
    assert last_error(conn, failed_id)["error"] == "renderer crashed"


@pytest.mark.parametrize("action", ["complete", "fail", "heartbeat"])
@pytest.mark.parametrize(
    "tamper", ["unsigned", "other_key", "other_id", "malformed", "native_hmac", "empty"]
)
async def test_bad_signatures_are_refused_and_change_nothing(
    client: awa.AsyncClient, conn: Conn, action: str, tamper: str
) -> None:
    job_id, cb = await insert_parked(client, conn, timeout_seconds=60)
    _, other_cb = await insert_parked(client, conn)
    body = {"complete": {"payload": 1}, "fail": {"error": "x"}, "heartbeat": {}}[action]
    path = f"{DEFAULT_PATH_PREFIX}/{cb}/{action}"
    content = json.dumps(body).encode()
    headers: dict[str, str] = {
        "unsigned": {},
        "other_key": signature_headers(bytes(32), cb),
        "other_id": signature_headers(KEY, other_cb),
        "malformed": {SIGNATURE_HEADER: "zz" * 32},
        "native_hmac": sign_request(SECRET, "POST", path, content),
        "empty": {SIGNATURE_HEADER: ""},
    }[tamper]
    before = snapshot(conn, job_id)
    # Both schemes are served: a signature of the other scheme still does not pass.
    app = create_app(client, secret=SECRET, contract_secret=KEY)
    async with asgi(app) as http:
        response = await http.post(path, content=content, headers=headers)
    assert response.status_code == 401, response.text
    expected = (
        "missing X-Awa-Signature header" if tamper == "unsigned" else "invalid callback signature"
    )
    assert response.json() == {"error": expected}
    assert snapshot(conn, job_id) == before


async def test_bad_input_and_unknown_callbacks(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn)
    before = snapshot(conn, job_id)
    async with asgi(create_app(client, contract_secret=KEY)) as http:
        cases: list[tuple[str, str, Any, int]] = [
            (cb, "fail", {}, 400),  # "error" is required
            (cb, "fail", {"error": 5}, 400),
            (cb, "heartbeat", {"timeout_seconds": -1}, 400),
            (cb, "heartbeat", {"timeout_seconds": "soon"}, 400),
            (cb, "complete", [1, 2], 400),
            (cb, "retry", {}, 404),  # not an action of the contract
            ("not-a-uuid", "complete", {}, 400),
            ("00000000-0000-4000-8000-000000000000", "complete", {}, 404),
        ]
        for callback_id, action, body, status in cases:
            response = await post(http, callback_id, action, body)
            assert response.status_code == status, (callback_id, action, body, response.text)
            assert "error" in response.json()
        bad_json = await http.post(
            f"{DEFAULT_PATH_PREFIX}/{cb}/complete",
            content=b"{not json",
            headers=signature_headers(KEY, cb),
        )
        assert bad_json.status_code == 400
        assert snapshot(conn, job_id) == before
        # Unknown fields are ignored, as the reference's receiver ignores them.
        done = await post(http, cb, "complete", {"payload": 2, "extra": True})
        assert done.status_code == 200, done.text
        again = await post(http, cb, "complete", {"payload": 3})
        assert again.status_code == 404
    assert row(conn, job_id)["output"] == 2


async def test_both_schemes_side_by_side(client: awa.AsyncClient, conn: Conn) -> None:
    """The native routes keep their HMAC scheme; the contract routes add theirs; a
    contract-only app has no native routes."""
    _, native_cb = await insert_parked(client, conn)
    _, contract_cb = await insert_parked(client, conn)
    async with asgi(create_app(client, secret=SECRET, contract_secret=KEY)) as http:
        path = f"/callbacks/{native_cb}/complete"
        native = await http.post(path, content=b"", headers=sign_request(SECRET, "POST", path, b""))
        assert native.status_code == 200, native.text
        assert native.json()["state"] == "completed"
        contract = await post(http, contract_cb, "complete")
        assert contract.status_code == 200, contract.text
        assert contract.json()["state"] == "Completed"
    _, cb = await insert_parked(client, conn)
    async with asgi(create_app(client, contract_secret=KEY, contract_prefix="hooks/")) as http:
        path = f"/callbacks/{cb}/complete"
        missing = await http.post(
            path, content=b"", headers=sign_request(SECRET, "POST", path, b"")
        )
        assert missing.status_code == 404
        assert (await post(http, cb, "complete", prefix="/hooks")).status_code == 200


async def test_mounted_under_a_path(client: awa.AsyncClient, conn: Conn) -> None:
    """Mounted at /hooks, the worker's base URL includes /hooks."""
    job_id, cb = await insert_parked(client, conn)
    parent = Starlette(routes=[Mount("/hooks", app=create_app(client, contract_secret=KEY))])
    url, headers = signed_callback(KEY, "http://receiver/hooks", cb)
    async with asgi(parent) as http:
        response = await http.post(url, json={"payload": None}, headers=headers)
    assert response.status_code == 200, response.text
    assert row(conn, job_id)["state"] == "completed"


def test_create_app_checks_the_contract_settings() -> None:
    client = awa.AsyncClient("postgresql://unused")
    create_app(client, contract_secret=KEY)  # the contract alone is enough
    with pytest.raises(ValueError, match=r"exactly 32 bytes \(got 5\)"):
        create_app(client, contract_secret=b"short")
    with pytest.raises(TypeError, match="parse_secret"):
        create_app(client, contract_secret=KEY_HEX)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="different paths"):
        create_app(client, allow_unsigned=True, prefix="/api/callbacks/", contract_secret=KEY)
    with pytest.raises(ValueError, match="allow_unsigned"):
        create_app(client)


# An awa handler in the role of the reference's HTTP worker ---------------------------------


@dataclasses.dataclass
class RenderPdf:
    document_id: str


async def test_a_reference_style_function_resolves_an_awa_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """An awa handler hands a function what the reference's HTTP worker sends (the request
    body, the callback URL, the signature header) and parks; the function, written for
    awa-pg, calls the URL back forwarding the header, and the job completes."""
    app = create_app(client, contract_secret=KEY)
    outbox: asyncio.Queue[tuple[dict[str, Any], dict[str, str]]] = asyncio.Queue()

    @client.task(RenderPdf, queue="pdf")
    async def render(job: awa.Job[RenderPdf]) -> awa.WaitForCallback:
        token = await job.register_callback(timeout_seconds=600)
        url, headers = signed_callback(KEY, "http://receiver", token.id)
        body = function_request(
            job_id=job.id,
            kind=job.kind,
            args=dataclasses.asdict(job.args),
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            callback_id=token.id,
            callback_url=url,
        )
        await outbox.put((body, headers))
        return awa.WaitForCallback(token)

    job = await client.insert(RenderPdf("doc_1"))
    await start(client, queue("pdf"))
    try:
        body, headers = await asyncio.wait_for(outbox.get(), 10)
        assert body["args"] == {"document_id": "doc_1"}
        assert body["job_id"] == job.id
        assert verify(KEY, body["callback_id"], headers[SIGNATURE_HEADER])
        await wait_for_state(conn, job.id, "waiting_external")
        async with asgi(app) as http:  # the function, done: it calls back
            response = await http.post(
                body["callback_url"], json={"payload": {"pages": 3}}, headers=headers
            )
        assert response.status_code == 200, response.text
        await wait_for_state(conn, job.id, "completed")
        assert row(conn, job.id)["output"] == {"pages": 3}
    finally:
        await client.shutdown(5)


# awa callback serve --callback-hmac-secret ----------------------------------------------------


def receiver_env(database_url: str, **variables: str) -> dict[str, str]:
    """The environment without any callback secret, plus ``variables``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("AWA_CALLBACK_SECRET", "AWA_CALLBACK_HMAC_SECRET")
    }
    return {**env, "DATABASE_URL": database_url, **variables}


async def test_served_with_the_contract_secret_from_the_environment(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """AWA_CALLBACK_HMAC_SECRET (the reference's variable) adds the contract routes beside
    the native ones; a forged request is refused, a signed one completes the job."""
    job_id, cb = await insert_parked(client, conn)
    env = receiver_env(database_url, AWA_CALLBACK_SECRET=SECRET, AWA_CALLBACK_HMAC_SECRET=KEY_HEX)
    with serving_receiver(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            forged = await post(http, cb, "complete", {"payload": 1}, key=bytes(32))
            assert forged.status_code == 401
            assert row(conn, job_id)["state"] == "waiting_external"
            accepted = await post(http, cb, "complete", {"payload": {"via": "contract"}})
            assert accepted.status_code == 200, accepted.text
            assert accepted.json() == {"id": job_id, "state": "Completed"}
    assert row(conn, job_id)["output"] == {"via": "contract"}


async def test_served_contract_only_with_the_reference_flags(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """`awa callbacks serve --callback-hmac-secret HEX --path-prefix P`, the reference's
    command line, without AWA_CALLBACK_SECRET: the contract routes only."""
    job_id, cb = await insert_parked(client, conn)
    flags = ("--callback-hmac-secret", KEY_HEX, "--path-prefix", "/awa-cb")
    with serving_receiver(receiver_env(database_url), *flags, group="callbacks") as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            path = f"/callbacks/{cb}/complete"
            native = await http.post(path, headers=sign_request(SECRET, "POST", path, b""))
            assert native.status_code == 404
            fail = await post(http, cb, "fail", {"error": "no"}, prefix="/awa-cb")
            assert fail.status_code == 200, fail.text
    assert row(conn, job_id)["state"] == "failed"


def test_serve_refuses_a_bad_contract_secret(database_url: str) -> None:
    result = subprocess.run(
        [str(AWA), "callback", "serve", "--port", str(free_port())],
        env=receiver_env(database_url, AWA_CALLBACK_HMAC_SECRET="abc"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "valid hex" in result.stderr
