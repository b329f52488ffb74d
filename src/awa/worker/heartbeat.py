"""Heartbeats for every running attempt of this process, and for the process itself (its
``awa.runtimes`` row), from a thread of their own.

A separate thread with its own connection keeps heartbeats flowing even while a handler
blocks the event loop, so a busy but healthy job is never mistaken for a dead one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from awa.core.outage import FailureLog
from awa.job import Job
from awa.sql import query
from awa.storage.db import connection_kwargs
from awa.worker.presence import Presence

log = logging.getLogger("awa.worker")

CHUNK = 500


class Heartbeat:
    def __init__(
        self,
        url: str,
        *,
        interval: float,
        snapshot: Callable[[], list[Job[Any]]],
        application_name: str,
        presence: Presence | None = None,
    ) -> None:
        self._url, self._application_name = url, application_name  # its own connection
        self._presence = presence
        self._interval = interval
        self._snapshot = snapshot
        self._stop = threading.Event()
        self._beat_now = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        # Progress version last written per attempt, keyed by (id, run_lease): a new attempt
        # of the same job starts counting again and must not inherit the old one's entry.
        self._flushed_versions: dict[tuple[int, int], int] = {}
        self._failures = FailureLog(log, "heartbeat")
        self.alive = False
        self.beats = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="awa-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Run one final beat and stop (blocking; call it from a worker thread)."""
        self._stop.set()
        self._beat_now.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        self.alive = True
        try:
            while True:
                self._beat_now.wait(self._interval)
                self._beat_now.clear()
                try:
                    self._beat()
                except Exception:
                    # Whatever it is, the thread must live on: without heartbeats every
                    # running job of this process would be rescued.
                    log.exception("heartbeat failed unexpectedly; it runs again next interval")
                if self._stop.is_set():
                    break
        finally:
            self.alive = False
            if self._conn is not None:
                self._conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._url, connect_timeout=10, **connection_kwargs(self._application_name)
            )
        return self._conn

    def _beat(self) -> None:
        jobs = sorted(self._snapshot(), key=lambda job: job.id)
        live = {(job.id, job.run_lease) for job in jobs}
        self._flushed_versions = {
            key: version for key, version in self._flushed_versions.items() if key in live
        }
        if not jobs and self._presence is None:
            return
        try:
            conn = self._connection()
            if self._presence is not None:
                self._presence.beat(conn)
            for start in range(0, len(jobs), CHUNK):
                chunk = jobs[start : start + CHUNK]
                versions = [job._progress_version for job in chunk]
                progress = [
                    self._progress_json(job, version)
                    for job, version in zip(chunk, versions, strict=True)
                ]
                refreshed = conn.execute(
                    query("heartbeat"),
                    {
                        "ids": [job.id for job in chunk],
                        "leases": [job.run_lease for job in chunk],
                        "progress": progress,
                    },
                ).fetchall()
                # A row the beat skipped (locked meanwhile) keeps its progress for the next.
                beaten = {row[0] for row in refreshed}
                for job, version in zip(chunk, versions, strict=True):
                    if job.id in beaten:
                        self._flushed_versions[job.id, job.run_lease] = version
            self.beats += 1
            self._failures.succeeded()
        except psycopg.Error as error:
            self._failures.failed(error, then=f"{len(jobs)} running jobs wait for their beat")
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _progress_json(self, job: Job[Any], version: int) -> str | None:
        if version == 0 or self._flushed_versions.get((job.id, job.run_lease)) == version:
            return None
        return json.dumps(job._progress, ensure_ascii=False, separators=(",", ":"), default=str)
