"""Exactly-once state effects across SIGKILL: worker processes that kill themselves at every
point around the commit of ``job.finalize()`` / ``job.complete_in()`` (before, inside, with
the completion written, during COMMIT, after) and are killed from outside, while rescue
hands their jobs to the survivors. The business table ends with exactly one row per
completed job and none for the jobs that failed. The same battery on an ordinary handler
(the control) duplicates writes, so the battery can tell."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import awa
from jobs_helpers import Conn

WORKER = Path(__file__).resolve().parent / "procs" / "finalize_worker.py"
JOBS = 120


def spawn(database_url: str, log: Path, **env: str) -> subprocess.Popen[str]:
    """A worker process (not waited for: it may die before it would say it is ready)."""
    with log.open("a") as errors:
        return subprocess.Popen(
            [sys.executable, str(WORKER)],
            env={**os.environ, "DATABASE_URL": database_url, **env},
            stdout=subprocess.DEVNULL,
            stderr=errors,
            text=True,
        )


def kill(worker: subprocess.Popen[str]) -> None:
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)


def run_battery(
    sync_client: awa.Client,
    conn: Conn,
    database_url: str,
    log: Path,
    jobs: int,
    *,
    outside_kills: int,
    timeout: float,
    **env: str,
) -> None:
    """Insert ``jobs`` charges, keep three workers alive (restarting the dead) until every
    job is over, and SIGKILL a random one now and then."""
    from procs.finalize_worker import Charge

    conn.execute(
        "DROP TABLE IF EXISTS ledger, kills;"
        " CREATE TABLE ledger (job_id bigint, attempt int);"
        " CREATE TABLE kills (job_id bigint, attempt int, point text)"
    )
    sync_client.insert_many(
        [Charge(n) for n in range(1, jobs + 1)], queue="charges", max_attempts=8
    )
    workers = [spawn(database_url, log, **env) for _ in range(3)]
    killed = 0
    deadline = time.monotonic() + timeout
    try:
        while conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE state NOT IN ('completed', 'failed')"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, f"jobs left after {timeout}s: see {log}"
            time.sleep(0.05)
            for index, worker in enumerate(workers):
                if worker.poll() is not None:  # it killed itself: replace it
                    workers[index] = spawn(database_url, log, **env)
            if killed < outside_kills and random.random() < 0.05:
                victim = random.randrange(len(workers))
                kill(workers[victim])
                killed += 1
                workers[victim] = spawn(database_url, log, **env)
    finally:
        for worker in workers:
            if worker.poll() is None:
                kill(worker)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_business_row_per_completed_job_across_sigkills_around_the_commit(
    sync_client: awa.Client, conn: Conn, database_url: str, tmp_path: Path
) -> None:
    run_battery(
        sync_client,
        conn,
        database_url,
        tmp_path / "workers.log",
        JOBS,
        outside_kills=6,
        timeout=180,
        KILL_RATE="0.3",
    )
    states = dict(
        conn.execute(
            "SELECT (args->>'n')::int, state::text FROM awa.jobs WHERE kind = 'charge'"
        ).fetchall()
    )
    assert len(states) == JOBS
    declined = {n for n in states if n % 10 == 0}
    assert {n for n, state in states.items() if state == "failed"} == declined
    assert {n for n, state in states.items() if state == "completed"} == set(states) - declined
    rows = collections.Counter(
        job_id for (job_id,) in conn.execute("SELECT job_id FROM ledger").fetchall()
    )
    ids = dict(conn.execute("SELECT id, (args->>'n')::int FROM awa.jobs").fetchall())
    completed_ids = {job_id for job_id, n in ids.items() if n not in declined}
    assert set(rows) == completed_ids, "a business row without its completion, or none with it"
    assert set(rows.values()) == {1}, (
        f"duplicated writes: { {k: v for k, v in rows.items() if v > 1} }"
    )
    # Each written row belongs to the attempt that completed the job.
    attempts = dict(conn.execute("SELECT id, attempt FROM awa.jobs").fetchall())
    for job_id, attempt in conn.execute("SELECT job_id, attempt FROM ledger").fetchall():
        assert attempts[job_id] == attempt
    points = collections.Counter(
        point for (point,) in conn.execute("SELECT point FROM kills").fetchall()
    )
    # Every point was hit (the kill choices are seeded by job id and attempt).
    assert set(points) == {"before", "inside", "written", "commit", "after"}, points
    print(f"self-kills by point: {dict(points)}")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_control_battery_duplicates_an_ordinary_handlers_writes(
    sync_client: awa.Client, conn: Conn, database_url: str, tmp_path: Path
) -> None:
    """An ordinary handler committing its write on its own, killed after it on every first
    attempt: its writes are duplicated, which the battery above would have caught."""
    run_battery(
        sync_client,
        conn,
        database_url,
        tmp_path / "workers.log",
        6,
        outside_kills=0,
        timeout=90,
        KILL_RATE="1.0",
        KILL_ATTEMPTS="1",
        MODE="plain",
    )
    rows = collections.Counter(
        job_id for (job_id,) in conn.execute("SELECT job_id FROM ledger").fetchall()
    )
    kills_after_write = conn.execute(
        "SELECT count(*) FROM kills WHERE point <> 'before'"
    ).fetchone()
    assert kills_after_write is not None
    assert kills_after_write[0] > 0
    assert sum(rows.values()) > len(rows), rows
