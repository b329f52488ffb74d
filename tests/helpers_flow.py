"""A checker for the flow-control tests: a thread with its own connection that counts the
running jobs many times a second, in total and per concurrency key, and keeps the highest
counts it saw."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class RunningSampler:
    def __init__(self, database_url: str, queue: str) -> None:
        self._url = database_url
        self._queue = queue
        self._stop = threading.Event()
        self.samples = 0
        self.most_running = 0
        self.most_per_key: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name="running-sampler", daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT concurrency_key, count(*) FROM awa.jobs"
                    " WHERE state = 'running' AND queue = %s GROUP BY concurrency_key",
                    (self._queue,),
                ).fetchall()
                self.most_running = max(self.most_running, sum(n for _, n in rows))
                for key, n in rows:
                    if key is not None:
                        self.most_per_key[key] = max(self.most_per_key.get(key, 0), n)
                self.samples += 1
                self._stop.wait(0.005)

    @contextmanager
    def running(self) -> Iterator[RunningSampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(5)
