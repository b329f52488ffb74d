"""HTTP workers facing a hostile or broken function: endless and oversized bodies, a body
trickled byte by byte, answers that are not HTTP. Each ends the attempt with a clear error
within its limits; none holds the worker or its memory."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

import pytest

import awa
from awa.http_worker import HttpHandler
from helpers_http_worker import Answer, FunctionServer
from helpers_worker import queue, start, wait_for_state
from jobs_helpers import Conn

QUEUE = "hostile"
# Lets a function that holds its connection open go once the test has its answer (the
# server's handler thread is joined when the test ends).
DONE = threading.Event()


@dataclasses.dataclass
class Ping:
    n: int = 0


def endless_chunks(wire: BinaryIO) -> None:
    wire.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(100_000):  # ~400 MB if nobody stopped reading
        wire.write(b"1000\r\n" + b"x" * 4096 + b"\r\n")
        wire.flush()


def huge_declared_length(wire: BinaryIO) -> None:
    wire.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
    wire.flush()
    DONE.wait(5)  # and never sends it


def trickle(wire: BinaryIO) -> None:
    wire.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    for _ in range(100):
        wire.write(b"x")
        wire.flush()
        time.sleep(0.1)


def not_http(wire: BinaryIO) -> None:
    wire.write(b"hello, this is not HTTP\r\n\r\n")
    wire.flush()


@pytest.mark.parametrize(
    ("raw", "state", "message"),
    [
        (endless_chunks, "failed", "body larger than max_response_bytes (65536 bytes)"),
        (huge_declared_length, "failed", "body larger than max_response_bytes (65536 bytes)"),
        (trickle, "retryable", "no answer within 1s"),
        (not_http, "retryable", "RemoteProtocolError"),
    ],
    ids=["endless-chunked-body", "huge-content-length", "trickled-body", "not-http"],
)
async def test_a_hostile_answer_ends_the_attempt_within_its_limits(
    client: awa.AsyncClient,
    conn: Conn,
    raw: Callable[[BinaryIO], None],
    state: str,
    message: str,
) -> None:
    DONE.clear()
    with FunctionServer(lambda request: Answer(raw=raw)) as function:
        handler = HttpHandler(function.url, timeout=1, max_response_bytes=65536)
        client.task(Ping, queue=QUEUE)(handler)
        job = await client.insert(Ping(), queue=QUEUE)
        began = time.monotonic()
        await start(client, queue(QUEUE))
        try:
            row = await wait_for_state(conn, job.id, state)
        finally:
            DONE.set()
        took = time.monotonic() - began
    assert message in row["errors"][-1]["error"]
    assert took < 5
    assert handler.in_flight == 0
