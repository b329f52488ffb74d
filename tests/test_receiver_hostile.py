"""Hostile requests to the callback receiver (``awa.callbacks.http``, both signature
schemes) and to the metrics endpoint (``awa.observability.endpoint``).

Contract: an oversized body is refused (413) without being read, so the receiver's memory
stays flat however large the body; every malformed path, id, method, header or body gets a
4xx whose JSON ``error`` names what is wrong; and nothing changes in the database: the parked
job stays parked with the same callback id. Each surface is one table, so that a new
parameter gets its cases beside the others.
"""

from __future__ import annotations

import contextlib
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
import pytest

import awa
from awa.callback_contract import sign
from awa.callbacks.http import MAX_BODY_BYTES, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign_request
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
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}{framing}\r\n\r\n".encode())
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
        warm = [
            httpx.post(
                base + warm_native,
                content=b"{}",
                headers=sign_request(SECRET, "POST", warm_native, b"{}"),
                timeout=10,
            ),
            httpx.post(
                f"{base}/api/callbacks/{unknown}/complete",
                content=b"{}",
                headers={SIGNATURE_HEADER: sign(KEY, unknown)},
                timeout=10,
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
