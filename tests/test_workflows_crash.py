"""A batch's fan-in job runs exactly once, with the right counts, however its members'
finalizations interleave across worker processes that are killed again and again: the
release commits with the last member's outcome or not at all (migration 11's trigger)."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest

import awa
from helpers_procs import kill
from helpers_procs import start_worker as start_process
from jobs_helpers import Conn

WORKER = Path(__file__).resolve().parent / "procs" / "batch_worker.py"
MEMBERS = 1000


def start_worker(database_url: str) -> subprocess.Popen[str]:
    return start_process(WORKER, database_url)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_one_fan_in_with_right_counts_across_sigkills(
    sync_client: awa.Client, database_url: str, conn: Conn
) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS batch_summaries (job_id bigint, summary jsonb);"
        " DELETE FROM batch_summaries"
    )
    from procs.batch_worker import Member, Summary

    # The members wait in a paused queue until every worker runs: a worker that started
    # alone could finish the whole batch before the others are up and any kill happens.
    sync_client.pause_queue("members")
    batch = sync_client.insert_batch(
        [Member(n) for n in range(MEMBERS)],
        on_complete=awa.EnqueueRequest(Summary("done")).queue("summaries"),
        queue="members",
        max_attempts=25,
    )
    workers = [start_worker(database_url) for _ in range(3)]
    sync_client.resume_queue("members")
    kills = 0
    deadline = time.monotonic() + 120
    try:
        while True:
            assert time.monotonic() < deadline, f"no summary after {kills} kills"
            done = conn.execute("SELECT count(*) FROM batch_summaries").fetchone()
            if done and done[0] > 0:
                break
            time.sleep(random.uniform(0.1, 0.3))  # fault injection: let them work, kill one
            victim = random.randrange(len(workers))
            if kills < 12:
                kill(workers[victim])
                kills += 1
                workers[victim] = start_worker(database_url)
        # Until the batch is over (the fan-in job committed, no member left to run), so that
        # a second release or a second run of the fan-in would show.
        while conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE workflow_id = %s"
            " AND state NOT IN ('completed', 'failed', 'cancelled')",
            (batch.id,),
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the batch never finished"
            time.sleep(0.05)
    finally:
        for worker in workers:
            kill(worker)
    summaries = conn.execute("SELECT job_id, summary FROM batch_summaries").fetchall()
    assert len(summaries) == 1, summaries
    job_id, summary = summaries[0]
    assert job_id == batch.fan_in.id
    fan_ins = conn.execute("SELECT count(*) FROM awa.jobs WHERE kind = 'summary'").fetchone()
    assert fan_ins == (1,)
    failing = {n for n in range(MEMBERS) if n % 3 == 0}
    assert summary["counts"] == {"failed": len(failing), "completed": MEMBERS - len(failing)}
    ids = {member.id for member in batch.members}
    assert set(summary["ids"]["failed"]) | set(summary["ids"]["completed"]) == ids
    failed_ns = {
        row[0]
        for row in conn.execute(
            "SELECT (args->>'n')::int FROM awa.jobs WHERE id = ANY(%s)",
            (summary["ids"]["failed"],),
        ).fetchall()
    }
    assert failed_ns == failing
    assert kills >= 3, f"only {kills} kills"
    print(f"{kills} kills; summary {json.dumps(summary['counts'])}")
