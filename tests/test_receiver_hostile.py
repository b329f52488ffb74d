"""Hostile requests to the callback receiver (``awa.callbacks.http``, both signature
schemes) and to the metrics endpoint (``awa.observability.endpoint``).

Contract: an oversized body is refused (413) without being read, so the receiver's memory
stays flat however large the body; every malformed path, id, method, header or body gets a
4xx whose JSON ``error`` names what is wrong; and nothing changes in the database: the parked
job stays parked with the same callback id. Each surface is one table, so that a new
parameter gets its cases beside the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.datastructures import URL

import awa
from awa.callback_contract import sign
from awa.callbacks.http import (
    MAX_BODY_BYTES,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    create_app,
    sign_request,
)
from awa.observability.endpoint import EndpointServer, observability_app
from helpers_callbacks import insert_parked, receiver_process
from helpers_worker import row
from jobs_helpers import Conn

SECRET = "the shared HMAC secret"
KEY = bytes(range(32))
HUGE = 200 * 1024 * 1024
MEMORY_BUDGET = 50 * 1024 * 1024


def snapshot(conn: Conn, job_id: int) -> tuple[Any, ...]:
    db = row(conn, job_id)
    return (
        db["state"],
        db["callback_id"],
        db["callback_timeout_at"],
        db["run_lease"],
        db["errors"],
        db["output"],
        db["metadata"],
    )


# An oversized body, sent to a real receiver process ----------------------------------------------


def memory(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status (VmRSS: resident now; VmHWM: the peak), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB$", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1)) * 1024


@contextlib.contextmanager
def receiver(database_url: str) -> Iterator[tuple[str, int]]:
    """``awa callback serve`` with both schemes; yields its base URL and pid."""
    env = {**os.environ, "DATABASE_URL": database_url, "AWA_CALLBACK_SECRET": SECRET}
    args = ("--callback-hmac-secret", KEY.hex(), "--log-level", "warning")
    with receiver_process(env, *args) as (base, process):
        yield base, process.pid


def chunks(total: int, size: int = 1024 * 1024) -> Iterator[bytes]:
    """``total`` bytes of a JSON string body, made as they are sent (never held whole)."""
    block = b"x" * size
    yield b'{"payload": "'
    sent = 0
    while sent < total:
        yield block[: min(size, total - sent)]
        sent += size
    yield b'"}'


def send_raw(base: str, path: str, headers: dict[str, str], *, chunked: bool) -> tuple[int, int]:
    """POST a 200 MB body over a plain socket, chunked or with its Content-Length, while a
    thread reads the answer; returns (status, bytes of body sent before the receiver cut
    the connection)."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {HUGE + 15}"
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    answer = bytearray()
    with socket.create_connection((host, int(port)), timeout=30) as sock:

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := sock.recv(65536):
                    answer.extend(data)

        reader = threading.Thread(target=read)
        reader.start()
        sent = 0
        try:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}{framing}\r\n\r\n".encode()
            )
            for chunk in chunks(HUGE):
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
                sent += len(chunk)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the receiver closed the connection: what it should do
        reader.join(30)
        assert not reader.is_alive(), "the receiver neither answered nor closed the connection"
    status = re.match(rb"HTTP/1\.1 (\d{3}) ", bytes(answer))
    assert status is not None, bytes(answer[:200])
    return int(status.group(1)), sent


async def test_a_200_mb_body_is_refused_without_being_read(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """Both schemes, chunked and with a declared length: 413, the connection is cut long
    before the body ends, the receiver's peak memory (VmHWM) stays within 50 MB of its size
    at rest (VmRSS), and the parked job is untouched."""
    job_id, cb = await insert_parked(client, conn)
    before = snapshot(conn, job_id)
    native = f"/callbacks/{cb}/complete"
    contract = f"/api/callbacks/{cb}/complete"
    # The native signature covers the body, so it can only be checked after the body: a
    # well-formed, fresh one lets the request reach the body.
    native_headers = {TIMESTAMP_HEADER: str(int(time.time())), SIGNATURE_HEADER: "sha256=00"}
    contract_headers = {SIGNATURE_HEADER: sign(KEY, cb)}
    with receiver(database_url) as (base, pid):
        # At rest: after a small request through each route, down to the database, has
        # loaded and opened everything a request needs.
        unknown = str(uuid.uuid4())
        warm_native = f"/callbacks/{unknown}/complete"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            warm = [
                await http.post(
                    warm_native,
                    content=b"{}",
                    headers=sign_request(SECRET, "POST", warm_native, b"{}"),
                ),
                await http.post(
                    f"/api/callbacks/{unknown}/complete",
                    content=b"{}",
                    headers={SIGNATURE_HEADER: sign(KEY, unknown)},
                ),
            ]
        assert [response.status_code for response in warm] == [404, 404], warm
        idle = memory(pid, "VmRSS")
        results = {}
        for scheme, path, headers in (
            ("native", native, native_headers),
            ("contract", contract, contract_headers),
        ):
            for chunked in (True, False):
                results[scheme, chunked] = send_raw(base, path, headers, chunked=chunked)
        peak = memory(pid, "VmHWM")
    grown = peak - idle
    assert grown < MEMORY_BUDGET, f"the receiver grew by {grown / 2**20:.1f} MB: {results}"
    for (scheme, chunked), (status, sent) in results.items():
        assert status == 413, (scheme, chunked, status)
        assert sent < HUGE, (scheme, chunked, sent)
    assert snapshot(conn, job_id) == before
    print(f"peak - idle: {grown / 2**20:.1f} MB; body bytes sent before the cut: {results}")


# Hostile requests, one table for both schemes -------------------------------------------------
#
# Each case is sent as it travels on the wire (the path percent-encoded), through the ASGI app
# in this process and, unless ``wire=False``, to a real ``awa callback serve``. Every request
# is correctly signed for its scheme, so that what the case tests is what gets refused.

NATIVE, CONTRACT = "native", "contract"
PREFIXES = {NATIVE: "/callbacks", CONTRACT: "/api/callbacks"}
LONG = "a" * 10_000
BIG = str(2**64 - 1)
BEYOND_BIGINT = str(2**63)


def nested(depth: int) -> bytes:
    return b'{"payload": ' + b"[" * depth + b"]" * depth + b"}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile request: ``path`` as sent (``{prefix}`` and ``{cb}`` are filled in), the
    status it gets and a pattern its error must match."""

    name: str
    status: int
    error: str
    path: str = "{prefix}/{cb}/complete"
    method: str = "POST"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    schemes: tuple[str, ...] = (NATIVE, CONTRACT)
    wire: bool = True  # False: the HTTP server refuses it before the app (tested below)

    def __str__(self) -> str:
        return self.name


NOT_A_UUID = r"callback id .* is not a UUID"
NO_ENDPOINT = r"no callback endpoint at .*: use POST /callbacks/\{callback_id\}/\{action\}"
BAD_LEASE = r"run_lease must be (a whole number, not \w+|between 0 and 9223372036854775807)"
BAD_TIMEOUT = r"timeout_seconds must be a finite, non-negative number"
NOT_JSON = r"the body is not valid JSON \(NaN and infinities are not JSON numbers\)"

CASES = [
    # paths
    Case("dot-dot as the id", 400, NOT_A_UUID, path="{prefix}/../complete"),
    Case("dot-dot to another route", 404, NO_ENDPOINT, path="{prefix}/..%2F..%2Fjobs%2F1/discard"),
    Case("encoded slash in the id", 404, NO_ENDPOINT, path="{prefix}/{cb}%2Fx/complete"),
    Case(
        "encoded slash in the action", 404, NO_ENDPOINT, path="{prefix}/{cb}/complete%2F..%2Ffail"
    ),
    Case("an extra segment", 404, NO_ENDPOINT, path="{prefix}/{cb}/complete/again"),
    Case("an empty id", 404, NO_ENDPOINT, path="{prefix}//complete"),
    Case(
        "an id that is not a UUID",
        400,
        "callback id 'not-a-uuid' is not a UUID",
        path="{prefix}/not-a-uuid/complete",
    ),
    Case(
        "a 10,000-character id",
        400,
        r"^callback id is not a UUID: it is 10000 characters long \(a UUID has 36\)$",
        path="{prefix}/" + LONG + "/complete",
    ),
    Case(
        "NUL in the id",
        400,
        r"callback id '\\x00.*' is not a UUID",
        path="{prefix}/%00{cb}/complete",
    ),
    Case("a newline in the id", 400, NOT_A_UUID, path="{prefix}/{cb}%0A/complete"),
    Case(
        "an unknown action",
        404,
        "unknown action 'explode': use one of complete, ",
        path="{prefix}/{cb}/explode",
    ),
    Case(
        "a 10,000-character action",
        404,
        r"unknown action 'aaaa.*\.\.\. \(cut, 10000 characters\)",
        path="{prefix}/{cb}/" + LONG,
    ),
    Case(
        "retry is not in the contract",
        404,
        "unknown action 'retry': use one of complete, fail, heartbeat",
        path="{prefix}/{cb}/retry",
        schemes=(CONTRACT,),
    ),
    # methods
    *(
        Case(
            f"method {method}",
            405,
            f"method '{method}' is not allowed: callbacks are POSTed",
            method=method,
        )
        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS")
    ),
    Case("GET on an unknown path", 404, NO_ENDPOINT, path="/admin", method="GET"),
    # bodies
    Case("NaN", 400, NOT_JSON, body=b'{"payload": NaN}'),
    Case("Infinity", 400, NOT_JSON, body=b'{"payload": [1, Infinity]}'),
    Case("-Infinity", 400, NOT_JSON, body=b'{"payload": -Infinity}'),
    Case("a number beyond a double", 400, NOT_JSON, body=b'{"payload": 1e400}'),
    Case(
        "nested 65 deep", 400, "the body nests arrays and objects deeper than 64", body=nested(65)
    ),
    Case("nested 100,000 deep", 400, "the body is not valid JSON", body=nested(100_000)),
    Case("an array", 400, "the body must be a JSON object", body=b"[1, 2]"),
    Case("null", 400, "the body must be a JSON object", body=b"null"),
    Case("not UTF-8", 400, "the body is not valid JSON", body=b'{"payload": "\xff\xfe"}'),
    Case("a lone surrogate", 400, "the body is not valid JSON", body=b'{"payload": "\\ud800"}'),
    Case(
        "NUL in the payload",
        400,
        "payload.* contains a NUL byte",
        body=b'{"payload": {"a\\u0000": 1}}',
    ),
    Case("fail without error", 400, '"error"', path="{prefix}/{cb}/fail", body=b"{}"),
    Case(
        "fail with a number as error",
        400,
        '"error"',
        path="{prefix}/{cb}/fail",
        body=b'{"error": 5}',
    ),
    Case(
        "fail with NUL in the error",
        400,
        "NUL",
        path="{prefix}/{cb}/fail",
        body=b'{"error": "a\\u0000"}',
    ),
    *(
        Case(
            f"heartbeat timeout_seconds {value}",
            400,
            BAD_TIMEOUT,
            path="{prefix}/{cb}/heartbeat",
            body=b'{"timeout_seconds": %s}' % value.encode(),
        )
        for value in ('"60"', "-1", "true", "1e300", BIG, "[60]", "null")
    ),
    Case(
        "heartbeat timeout_seconds NaN",
        400,
        NOT_JSON,
        path="{prefix}/{cb}/heartbeat",
        body=b'{"timeout_seconds": NaN}',
    ),
    # native bodies: run_lease, fields, default_action
    *(
        Case(
            f"run_lease {value}",
            400,
            BAD_LEASE,
            body=b'{"run_lease": %s}' % value.encode(),
            schemes=(NATIVE,),
        )
        for value in (
            '"1"',
            "1.5",
            "1e30",
            "-1",
            BEYOND_BIGINT,
            BIG,
            "-" + BEYOND_BIGINT + "1",
            "true",
            "[1]",
            "{}",
        )
    ),
    Case("run_lease NaN", 400, NOT_JSON, body=b'{"run_lease": NaN}', schemes=(NATIVE,)),
    Case(
        "an unknown field",
        400,
        r"complete does not take 'paylaod' \(it takes payload, run_lease\)",
        body=b'{"paylaod": 1}',
        schemes=(NATIVE,),
    ),
    Case(
        "a 10,000-character field",
        400,
        r"complete does not take 'aaa.*\(cut, 10000 characters\)",
        body=b'{"%s": 1}' % LONG.encode(),
        schemes=(NATIVE,),
    ),
    Case(
        "heartbeat with a run_lease",
        400,
        "heartbeat does not take 'run_lease'",
        path="{prefix}/{cb}/heartbeat",
        body=b'{"run_lease": 1}',
        schemes=(NATIVE,),
    ),
    Case(
        "an unknown default_action",
        400,
        "default_action must be one of complete, fail, ignore",
        path="{prefix}/{cb}/resolve",
        body=b'{"default_action": "explode"}',
        schemes=(NATIVE,),
    ),
    Case(
        "default_action of the wrong type",
        400,
        "default_action must be one of",
        path="{prefix}/{cb}/resolve",
        body=b'{"default_action": ["fail"]}',
        schemes=(NATIVE,),
    ),
    # headers (the HTTP server itself refuses a malformed Content-Length: wire=False)
    *(
        Case(
            f"Content-Length {value!r}",
            400,
            "Content-Length must be a whole number of bytes, not",
            headers=(("content-length", value),),
            wire=False,
        )
        for value in ("abc", "-5", "1e3", "0x10", "\xb2", "")
    ),
    Case(
        "a huge Content-Length",
        413,
        r"the body is declared as 99999999999999999999999999 bytes; the limit is 1048576 bytes",
        headers=(("content-length", "9" * 26),),
        wire=False,
    ),
    Case(
        "a 5,000-digit Content-Length",
        413,
        "declared as a 5000-digit number of bytes",
        headers=(("content-length", "9" * 5000),),
        wire=False,
    ),
    Case(
        "conflicting Content-Lengths",
        400,
        "conflicting Content-Length headers",
        headers=(("content-length", "2"), ("content-length", "3")),
        body=b"{}",
        wire=False,
    ),
    Case(
        "a declared length over the limit",
        413,
        "declared as 1048577 bytes",
        headers=(("content-length", str(MAX_BODY_BYTES + 1)),),
        wire=False,
    ),
]
# The native scheme's own headers (the contract's signature is tested in
# tests/test_callback_contract.py).
SIGNATURE_CASES = [
    Case(
        f"{TIMESTAMP_HEADER} {value!r}",
        401,
        f"{TIMESTAMP_HEADER} must be Unix seconds",
        headers=((TIMESTAMP_HEADER, value),),
        schemes=(NATIVE,),
    )
    for value in ("1e9", "-1", "9" * 5000, "12.5", "\xb2")
] + [
    Case(
        "a stale timestamp",
        401,
        "more than 300 seconds",
        headers=((TIMESTAMP_HEADER, "1"),),
        schemes=(NATIVE,),
    ),
    Case(
        "a 10,000-character signature",
        401,
        "signature does not match",
        headers=((SIGNATURE_HEADER, "sha256=" + "0" * 10_000),),
        schemes=(NATIVE,),
    ),
    Case(
        "another scheme's signature",
        401,
        "must be sha256=<hex digest>",
        headers=((SIGNATURE_HEADER, "0" * 64),),
        schemes=(NATIVE,),
    ),
    Case(
        "a contract signature of a 10,000-character id",
        401,
        "invalid callback signature",
        path="{prefix}/" + LONG + "/complete",
        headers=((SIGNATURE_HEADER, "0" * 64),),
        schemes=(CONTRACT,),
    ),
]
ALL_CASES = [(case, scheme) for case in CASES + SIGNATURE_CASES for scheme in case.schemes]


def request_for(case: Case, scheme: str, cb: str) -> tuple[str, list[tuple[str, str]]]:
    """The case's path as sent and its headers, signed for ``scheme`` (a case's own
    headers replace the signature's)."""
    raw_path = case.path.replace("{prefix}", PREFIXES[scheme]).replace("{cb}", cb)
    path = urllib.parse.unquote(raw_path)  # what the server hands the app, as uvicorn does
    if scheme == NATIVE:
        signed_path = URL(scope=http_scope(case.method, raw_path, [])).path
        signature = sign_request(SECRET, case.method, signed_path, case.body)
    else:
        callback_id = path[len(PREFIXES[scheme]) + 1 :].split("/")[0]
        signature = {SIGNATURE_HEADER: sign(KEY, callback_id)}
    own = {name.lower() for name, _ in case.headers}
    headers = [(name, value) for name, value in signature.items() if name.lower() not in own]
    return raw_path, headers + list(case.headers)


def http_scope(method: str, target: str, headers: list[tuple[str, str]]) -> dict[str, Any]:
    """The scope uvicorn builds for a request line's target (path and query string)."""
    raw_path, _, query = target.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": urllib.parse.unquote(raw_path),
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(name.lower().encode(), value.encode("latin-1")) for name, value in headers],
        "client": ("127.0.0.1", 50000),
        "server": ("receiver", 80),
    }


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    read: int  # body bytes the app received

    def error(self) -> str:
        error: str = orjson.loads(self.body)["error"]
        return error


async def call_asgi(
    app: Any,
    method: str,
    raw_path: str,
    headers: list[tuple[str, str]],
    body: bytes | Iterator[bytes] = b"",
) -> Answer:
    """One request straight through an ASGI app, as a server would deliver it (``body`` as
    one message, or as the chunks an iterator yields); counts the body bytes the app
    received."""
    if isinstance(body, bytes):
        pieces: Iterator[bytes] = iter([body])
        if not any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers):
            headers = [*headers, ("content-length", str(len(body)))]
    else:
        pieces = body
    answer = Answer(0, {}, b"", 0)
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal done
        if done:
            return {"type": "http.disconnect"}
        chunk = next(pieces, None)
        if chunk is None:
            done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        answer.read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")

    await app(http_scope(method, raw_path, headers), receive, send)
    return answer


def call_wire(
    base: str, method: str, raw_path: str, headers: list[tuple[str, str]], body: bytes
) -> Answer:
    """One request over a socket to a real server, the path sent byte for byte."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    request = (
        f"{method} {raw_path} HTTP/1.1\r\nHost: {host}\r\n{head}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1") + body
    received = bytearray()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        while data := sock.recv(65536):
            received.extend(data)
    head_bytes, _, content = bytes(received).partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    answer_headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    if answer_headers.get("transfer-encoding") == "chunked":
        content = dechunk(content)
    return Answer(status, answer_headers, content, len(body))


def dechunk(content: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, _, content = content.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += content[:size]
        content = content[size + 2 :]


def check(case: Case, scheme: str, answer: Answer) -> None:
    where = f"{case} ({scheme})"
    assert answer.status == case.status, (where, answer.status, answer.body[:300])
    if case.method == "HEAD":
        return
    error = answer.error()
    assert re.search(case.error, error), (where, error[:300])
    assert len(error) < 400, (where, "the error repeats the hostile input", len(error))


def jobs(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, state::text, callback_id, run_lease, attempt, errors, output FROM awa.jobs"
        " ORDER BY id"
    ).fetchall()


@pytest.mark.parametrize(("case", "scheme"), ALL_CASES, ids=[f"{c}-{s}" for c, s in ALL_CASES])
async def test_a_hostile_request_gets_a_clear_4xx_and_changes_nothing(
    client: awa.AsyncClient, conn: Conn, case: Case, scheme: str
) -> None:
    job_id, cb = await insert_parked(client, conn)
    before = jobs(conn)
    app = create_app(client, secret=SECRET, contract_secret=KEY)
    raw_path, headers = request_for(case, scheme, cb)
    answer = await call_asgi(app, case.method, raw_path, headers, case.body)
    check(case, scheme, answer)
    assert jobs(conn) == before
    assert str(row(conn, job_id)["callback_id"]) == cb


async def test_hostile_requests_to_a_real_server(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """The same cases through uvicorn (``awa callback serve``): the HTTP server delivers
    paths and bodies as the app expects, and adds no 500 of its own."""
    job_id, cb = await insert_parked(client, conn)
    before = jobs(conn)
    with receiver(database_url) as (base, _pid):
        for case, scheme in ALL_CASES:
            if not case.wire:
                continue
            raw_path, headers = request_for(case, scheme, cb)
            check(case, scheme, call_wire(base, case.method, raw_path, headers, case.body))
        # A Content-Length the HTTP server cannot parse never reaches the app: its 400.
        for value in ("abc", "-5", "1e3"):
            answer = call_wire_raw(
                base, f"POST /callbacks/{cb}/complete", f"Content-Length: {value}"
            )
            assert answer.status == 400, (value, answer)
    assert jobs(conn) == before
    assert str(row(conn, job_id)["callback_id"]) == cb


def call_wire_raw(base: str, request_line: str, header: str) -> Answer:
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    received = bytearray()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"{request_line} HTTP/1.1\r\nHost: {host}\r\n{header}\r\n\r\n".encode())
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                received.extend(data)
    status = int(bytes(received).split(b" ", 2)[1])
    return Answer(status, {}, bytes(received), 0)


# Oversized bodies inside the app: what it reads ----------------------------------------------


@pytest.mark.parametrize("scheme", [NATIVE, CONTRACT])
async def test_the_app_reads_no_byte_of_a_declared_oversized_body_and_stops_a_chunked_one(
    client: awa.AsyncClient, conn: Conn, scheme: str
) -> None:
    job_id, cb = await insert_parked(client, conn)
    before = jobs(conn)
    app = create_app(client, secret=SECRET, contract_secret=KEY)
    case = Case("oversized", 413, "", path="{prefix}/{cb}/complete")
    raw_path, headers = request_for(case, scheme, cb)
    if scheme == NATIVE:  # its signature covers the body: well-formed and fresh is enough here
        headers = [(TIMESTAMP_HEADER, str(int(time.time()))), (SIGNATURE_HEADER, "sha256=00")]
    declared = await call_asgi(
        app, "POST", raw_path, [*headers, ("content-length", str(HUGE))], chunks(HUGE)
    )
    assert declared.status == 413, declared
    assert declared.error() == (
        f"the body is declared as {HUGE} bytes; the limit is {MAX_BODY_BYTES} bytes"
    )
    assert declared.read == 0
    assert declared.headers["connection"] == "close"
    streamed = await call_asgi(
        app, "POST", raw_path, [*headers, ("transfer-encoding", "chunked")], chunks(HUGE, 64 * 1024)
    )
    assert streamed.status == 413, streamed
    assert streamed.error() == f"the body is larger than the limit of {MAX_BODY_BYTES} bytes"
    assert MAX_BODY_BYTES < streamed.read <= MAX_BODY_BYTES + 64 * 1024
    assert streamed.headers["connection"] == "close"
    assert jobs(conn) == before
    assert str(row(conn, job_id)["callback_id"]) == cb


async def test_an_unsigned_request_is_refused_before_its_body_is_read(
    client: awa.AsyncClient, conn: Conn
) -> None:
    _job_id, cb = await insert_parked(client, conn)
    app = create_app(client, secret=SECRET, contract_secret=KEY)
    for raw_path in (f"/callbacks/{cb}/complete", f"/api/callbacks/{cb}/complete"):
        answer = await call_asgi(
            app, "POST", raw_path, [("transfer-encoding", "chunked")], chunks(HUGE)
        )
        assert answer.status == 401, answer
        assert answer.read == 0
        assert "missing" in answer.error()


# The metrics endpoint -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Probe:
    """One request to the metrics endpoint: the target as sent (path and query string)."""

    name: str
    target: str
    status: int
    error: str = ""
    method: str = "GET"

    def __str__(self) -> str:
        return self.name


NO_QUERY = r"^/(metrics|healthz|readyz) takes no query parameters \(got .+\)$"
NOT_SERVED = r"^no endpoint at '.*: this app serves GET /metrics, /healthz and /readyz$"
PROBES = [
    Probe("a scrape", "/metrics", 200),
    Probe("liveness", "/healthz", 200),
    Probe("HEAD of a scrape", "/metrics", 200, method="HEAD"),
    # query strings
    Probe("a name filter", "/metrics?name[]=awa_job_claimed_total", 400, NO_QUERY),
    Probe("a parameter on healthz", "/healthz?verbose=1", 400, NO_QUERY),
    Probe("a parameter on readyz", "/readyz?full", 400, NO_QUERY),
    Probe("NUL in a parameter", "/metrics?%00=1", 400, r"\(got '\\x00'\)"),
    Probe("not UTF-8", "/metrics?%ff%fe", 400, NO_QUERY),
    Probe("a 10,000-character query", "/metrics?" + LONG, 400, r"\(cut, 10000 characters\)"),
    Probe("many parameters", "/metrics?" + "&".join(f"p{n}=1" for n in range(1000)), 400, NO_QUERY),
    # paths
    Probe("an unknown path", "/admin", 404, NOT_SERVED),
    Probe("dot-dot", "/metrics/../admin", 404, NOT_SERVED),
    Probe("encoded dot-dot", "/%2e%2e/metrics", 404, NOT_SERVED),
    Probe("an encoded slash", "/metrics%2Fextra", 404, NOT_SERVED),
    Probe("NUL in the path", "/metrics%00", 404, NOT_SERVED),
    Probe("a 10,000-character path", "/" + LONG, 404, r"\(cut, 10001 characters\): this app"),
    # methods
    *(
        Probe(
            f"{method} {path}",
            path,
            405,
            f"^method '{method}' is not allowed: this app serves GET /metrics, /healthz",
            method,
        )
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS")
        for path in ("/metrics", "/readyz")
    ),
]


def check_probe(probe: Probe, answer: Answer) -> None:
    assert answer.status == probe.status, (str(probe), answer.status, answer.body[:300])
    if probe.error:
        error = answer.error()
        assert re.search(probe.error, error), (str(probe), error[:300])
        assert len(error) < 400, (str(probe), "the error repeats the hostile input")


@pytest.mark.parametrize("probe", PROBES, ids=str)
async def test_the_metrics_endpoint_answers_hostile_requests_with_a_clear_4xx(
    client: awa.AsyncClient, probe: Probe
) -> None:
    answer = await call_asgi(observability_app(client), probe.method, probe.target, [])
    check_probe(probe, answer)


async def test_the_metrics_endpoint_served_on_a_socket(client: awa.AsyncClient) -> None:
    """The same requests to the endpoint as ``awa worker --metrics-port`` serves it."""
    server = EndpointServer(client, "127.0.0.1", 0)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        for probe in PROBES:
            if probe.method == "HEAD":
                continue  # no body to read the answer's length from
            answer = await asyncio.to_thread(call_wire, base, probe.method, probe.target, [], b"")
            check_probe(probe, answer)
    finally:
        await server.stop()
