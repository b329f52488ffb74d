"""A periodic job fires once per fire across a leader's crash: two worker processes run an
every-second ``catch_up`` schedule, the one leading maintenance is killed with SIGKILL, and
the other takes over; every second of the run has exactly one job."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from jobs_helpers import Conn

WORKER = Path(__file__).parent / "procs" / "cron_worker.py"


def start_worker(database_url: str, name: str, folder: Path) -> subprocess.Popen[bytes]:
    out = (folder / f"{name}.out").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(WORKER), "--name", name],
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while b"ready" not in (folder / f"{name}.out").read_bytes():
        assert process.poll() is None, (folder / f"{name}.out").read_text()
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.05)
    return process


def leader(conn: Conn) -> str | None:
    row = conn.execute(
        "SELECT a.application_name FROM pg_locks AS l JOIN pg_stat_activity AS a"
        " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    return str(row[0]) if row is not None else None


def fire_times(conn: Conn) -> list[dt.datetime]:
    rows = conn.execute(
        "SELECT (metadata->>'cron_fire_time')::timestamptz FROM awa.jobs"
        " WHERE metadata->>'cron_name' = 'tick' ORDER BY 1"
    ).fetchall()
    return [row[0] for row in rows]


def wait_until(predicate: object, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


@pytest.mark.slow
def test_leader_killed_mid_run_every_second_fires_once(
    database_url: str, conn: Conn, tmp_path: Path
) -> None:
    workers = {name: start_worker(database_url, name, tmp_path) for name in ("a", "b")}
    try:
        wait_until(lambda: leader(conn) is not None, 10, "no leader")
        wait_until(lambda: len(fire_times(conn)) >= 3, 15, "no fires")
        first = leader(conn)
        assert first is not None
        victim = first.removeprefix("awa-cron-")
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(10)
        killed_at = len(fire_times(conn))
        survivor = "b" if victim == "a" else "a"
        wait_until(lambda: leader(conn) == f"awa-cron-{survivor}", 15, "no failover")
        wait_until(lambda: len(fire_times(conn)) >= killed_at + 4, 15, "no fires after failover")
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(20)
    fires = fire_times(conn)
    assert len(fires) == len(set(fires)), "a fire was enqueued twice"
    gaps = [later - earlier for earlier, later in pairwise(fires)]
    assert all(gap == dt.timedelta(seconds=1) for gap in gaps), f"missing fires: {fires}"
