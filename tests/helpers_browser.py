"""A real server for the browser tests: the UI apps (writable and read-only) served by
uvicorn beside a worker, on an event loop of their own in a background thread, so that the
test thread can drive Chromium with Playwright's blocking API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvicorn

import awa
from awa.ui import create_app

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str:
    """The system's Chromium (browsers are never downloaded here): ``AWA_CHROMIUM`` (which
    ./scripts/test sets when it finds or installs one), else the first of
    ``CHROMIUM_NAMES`` on PATH. Without one the browser tests fail, saying how to get one
    (a skipped browser test would check nothing)."""
    path = os.environ.get("AWA_CHROMIUM")
    for name in CHROMIUM_NAMES:
        path = path or shutil.which(name)
    if path is None:
        message = (
            "no Chromium: install one (apt-get install chromium; ./scripts/test does as root) "
            "or set AWA_CHROMIUM"
        )
        pytest.fail(message)
    return path


Setup = Callable[[awa.AsyncClient], Coroutine[Any, Any, None]]


class ServedUi:
    """Serves ``create_app(client)`` and a read-only twin on loopback ports, and runs the
    worker ``setup`` starts on the client, until ``stop()``. The client is made on the
    server's loop, where it lives."""

    def __init__(self, database_url: str, setup: Setup) -> None:
        self._database_url = database_url
        self._setup = setup
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[uvicorn.Server] = []
        self._serving: list[Any] = []
        self.url = self.read_only_url = ""

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (its client lives there) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _serve(self, app: Any) -> str:
        bound = socket.create_server(("127.0.0.1", 0))
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        self._servers.append(server)
        self._serving.append(
            asyncio.run_coroutine_threadsafe(server.serve(sockets=[bound]), self._loop)
        )
        return f"http://127.0.0.1:{bound.getsockname()[1]}"

    async def _client(self) -> awa.AsyncClient:
        return awa.AsyncClient(self._database_url)

    def start(self) -> None:
        self._thread.start()
        self.client = self.run(self._client())
        self.url = self._serve(create_app(self.client, refresh_seconds=1))
        self.read_only_url = self._serve(create_app(self.client, read_only=True))
        self.run(self._setup(self.client))

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        for serving in self._serving:
            with contextlib.suppress(Exception):
                serving.result(10)
        with contextlib.suppress(Exception):
            self.run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def served(database_url: str, setup: Setup) -> Iterator[ServedUi]:
    ui = ServedUi(database_url, setup)
    ui.start()
    try:
        yield ui
    finally:
        ui.stop()
