"""Flow control across a fleet: three worker processes (tests/procs/flow_worker.py) run the
same queue and must together respect its rate limit, its cap on running jobs and its per-key
limit; a killed worker's jobs stop counting against the cap once rescued."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers_flow import RunningSampler
from jobs_helpers import Conn

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "procs" / "flow_worker.py"

# Quick heartbeats, rescue and election, so a killed worker's jobs are rescued in seconds.
FAST = {
    "promote_interval": 0.05,
    "leader_election_interval": 0.2,
    "heartbeat_interval": 0.2,
    "heartbeat_staleness": 1.0,
    "heartbeat_rescue_interval": 0.2,
}


class Fleet:
    def __init__(self, database_url: str, folder: Path) -> None:
        self._url = database_url
        self._folder = folder
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, queues: dict[str, Any]) -> subprocess.Popen[bytes]:
        log = self._folder / f"{name}.out"
        process = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--name",
                name,
                "--queues",
                json.dumps(queues),
                "--options",
                json.dumps(FAST),
            ],
            env={**os.environ, "DATABASE_URL": self._url},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.workers[name] = process
        wait_until(lambda: b"ready" in log.read_bytes(), 30, f"{name} did not start", process)
        return process

    def stop(self) -> None:
        for process in self.workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def fleet(database_url: str, folder: Path) -> Iterator[Fleet]:
    workers = Fleet(database_url, folder)
    try:
        yield workers
    finally:
        workers.stop()


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    message: str,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process is None or process.poll() is None, f"{message}: the process exited"
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def insert_calls(
    conn: Conn, count: int, *, seconds: float = 0.0, key: str | None = None, queue: str = "api"
) -> None:
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args, concurrency_key)"
        " SELECT 'call', %s, jsonb_build_object('seconds', %s::float8), %s"
        " FROM generate_series(1, %s)",
        (queue, seconds, key, count),
    )


def count(conn: Conn, where: str, *params: Any) -> int:
    row = conn.execute(f"SELECT count(*) FROM awa.jobs WHERE {where}", params).fetchone()
    assert row is not None
    return int(row[0])


def test_a_rate_limit_holds_across_three_workers(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    insert_calls(conn, 1600)
    queues = {"api": {"max_workers": 8, "rate_limit": [50, 10], "poll_interval": 0.05}}
    with fleet(database_url, tmp_path) as workers:
        for name in ("a", "b", "c"):
            workers.start(name, queues)
        wait_until(lambda: count(conn, "attempted_at IS NOT NULL") > 0, 10, "nothing started")
        first = conn.execute("SELECT min(attempted_at) FROM awa.jobs").fetchone()
        assert first is not None
        # 20 s of backlog after the burst: 50 per second, 1000 starts within ±10 %.
        wait_until(
            lambda: (
                count(conn, "attempted_at >= %s + interval '21 seconds'", first[0]) > 0
                or conn.execute("SELECT now() > %s + interval '21.5 seconds'", first).fetchone()[0]
            ),
            40,
            "the rate-limited queue stopped",
        )
        started = count(
            conn,
            "attempted_at >= %s + interval '1 second' AND attempted_at < %s + interval '21 s'",
            first[0],
            first[0],
        )
    print(f"started in 20 s at 50/s: {started}")
    assert 900 <= started <= 1100, started


def test_a_global_cap_is_never_exceeded(database_url: str, conn: Conn, tmp_path: Path) -> None:
    insert_calls(conn, 150, seconds=0.05)
    queues = {"api": {"max_workers": 8, "global_max_running": 5, "poll_interval": 0.05}}
    with (
        RunningSampler(database_url, "api").running() as sampler,
        fleet(database_url, tmp_path) as workers,
    ):
        for name in ("a", "b", "c"):
            workers.start(name, queues)
        wait_until(lambda: count(conn, "state = 'completed'") == 150, 60, "jobs left")
    # 24 free slots in the fleet, never more than 5 running; the cap was reached.
    assert sampler.samples > 100
    assert sampler.most_running == 5, sampler.most_running


def test_a_per_key_limit_holds_and_other_keys_start_promptly(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    insert_calls(conn, 3000, seconds=0.02, key="big")
    queues = {"api": {"max_workers": 8, "key_concurrency": 2, "poll_interval": 0.05}}
    with (
        RunningSampler(database_url, "api").running() as sampler,
        fleet(database_url, tmp_path) as workers,
    ):
        for name in ("a", "b", "c"):
            workers.start(name, queues)
        wait_until(lambda: count(conn, "state = 'completed'") >= 20, 20, "nothing completes")
        for key in range(10):
            insert_calls(conn, 3, seconds=0.02, key=f"tenant-{key}")
        insert_calls(conn, 3, seconds=0.02)  # no key: unaffected
        wait_until(
            lambda: (
                count(conn, "concurrency_key IS DISTINCT FROM 'big' AND state = 'completed'") == 33
            ),
            20,
            "the other keys' jobs did not all complete",
        )
        waits = conn.execute(
            "SELECT max(extract(epoch FROM attempted_at - created_at)) FROM awa.jobs"
            " WHERE concurrency_key IS DISTINCT FROM 'big' AND attempt = 1"
        ).fetchone()
        backlog = count(conn, "concurrency_key = 'big' AND state = 'available'")
    assert backlog > 1000, backlog
    assert waits is not None
    assert waits[0] < 1.0, waits
    assert sampler.most_per_key["big"] == 2, sampler.most_per_key
    assert max(sampler.most_per_key.values()) <= 2, sampler.most_per_key


def test_a_killed_workers_jobs_stop_counting_once_rescued(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    insert_calls(conn, 3, seconds=120)
    queues = {"api": {"max_workers": 8, "global_max_running": 3, "poll_interval": 0.05}}
    with (
        RunningSampler(database_url, "api").running() as sampler,
        fleet(database_url, tmp_path) as workers,
    ):
        doomed = workers.start("doomed", queues)
        wait_until(lambda: count(conn, "state = 'running'") == 3, 10, "the cap was not filled")
        insert_calls(conn, 6, seconds=0.05)
        workers.start("b", queues)
        workers.start("c", queues)
        # The cap is full: the short jobs wait while the doomed worker holds its three (a
        # bounded look for something that must not happen).
        time.sleep(0.5)
        assert count(conn, "state = 'available'") == 6
        doomed.kill()
        doomed.wait()
        wait_until(
            lambda: count(conn, "state = 'completed'") == 6,
            30,
            "the short jobs never ran after the rescue",
        )
        long_jobs = conn.execute(
            "SELECT state::text, attempt FROM awa.jobs WHERE (args->>'seconds')::float8 = 120"
        ).fetchall()
    assert sampler.most_running <= 3, sampler.most_running
    # The doomed worker's attempts were rescued: retryable, or running again as attempt 2.
    assert all(state != "running" or attempt == 2 for state, attempt in long_jobs), long_jobs
