"""Helpers for the HTTP-worker tests: a real function endpoint (the standard library's HTTP
server on 127.0.0.1, an ephemeral port, in threads) whose answers each test programs, and
the callback receiver served by uvicorn on another ephemeral port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.server
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any, BinaryIO

import uvicorn

from helpers_worker import wait_for


@dataclasses.dataclass
class Request:
    """A POST the function received."""

    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclasses.dataclass
class Answer:
    """What the function answers: ``delay`` seconds later, ``status`` with ``body``; then,
    once the answer is sent, it runs ``then`` in its thread (e.g. to call back)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay: float = 0.0
    then: Callable[[], None] | None = None
    raw: Callable[[BinaryIO], None] | None = None
    """Writes the whole answer itself, bytes on the wire (a hostile function)."""


Respond = Callable[[Request], Answer]


class FunctionServer:
    """A function endpoint: records each request, answers it with ``respond(request)``,
    and counts the requests it serves at once (``max_concurrent``)."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[Request] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                request = Request(
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
                server._serve(self, request)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/fn"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def _serve(self, handler: http.server.BaseHTTPRequestHandler, request: Request) -> None:
        with self._lock:
            self.requests.append(request)
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            answer = self.respond(request)
            if answer.delay:
                self._closing.wait(answer.delay)
            if answer.raw is not None:
                answer.raw(handler.wfile)
                return
            handler.send_response(answer.status)
            for name, value in answer.headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(answer.body)))
            handler.end_headers()
            handler.wfile.write(answer.body)
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the worker gave up waiting or reading
        except BaseException as error:
            self.errors.append(error)
            raise
        finally:
            with self._lock:
                self.concurrent -= 1
        if answer.then is not None:
            answer.then()

    def __enter__(self) -> FunctionServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


def post_json(url: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    """POST ``body`` as JSON (blocking, as a function in another process would); the status
    and the decoded answer."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def refused_url() -> str:
    """A URL on a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/fn"


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve the ASGI ``app`` with uvicorn on this loop; yields its base URL."""
    bound = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[bound]))
    try:
        await wait_for(lambda: server.started, 10, message="uvicorn did not start")
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        bound.close()
