"""Per-queue retention: a queue's own completed_retention / failed_retention override the
worker-wide ones, fleet-wide (stored at start, applied by whichever worker leads)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import awa
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn, job_row, set_state


@dataclasses.dataclass
class Tick:
    n: int


async def test_a_queue_s_own_retention_wins(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Tick)
    async def tick(job: awa.Job[Tick]) -> None:
        return None

    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    jobs = {}
    for name in ("short", "long"):
        for state in ("completed", "failed"):
            job = await client.insert(Tick(1), queue=name)
            set_state(conn, job.id, state, finalized_at=old)
            jobs[name, state] = job.id
    queues = {
        **queue("short", completed_retention=60, failed_retention=3600),
        **queue("long"),
    }
    await start(client, queues, cleanup_interval=0.05)
    stored = conn.execute(
        "SELECT queue, completed_seconds, failed_seconds FROM awa.queue_retention"
    ).fetchall()
    assert stored == [("short", 60.0, 3600.0)]
    await wait_for(lambda: job_row(conn, jobs["short", "completed"]) is None)
    # The others are younger than their retention (an hour; a day and a week by default).
    assert job_row(conn, jobs["short", "failed"]) is not None
    assert job_row(conn, jobs["long", "completed"]) is not None
    assert job_row(conn, jobs["long", "failed"]) is not None
    await client.shutdown()
    await start(client, queue("short"))  # restarted without an override: the row goes
    assert conn.execute("SELECT count(*) FROM awa.queue_retention").fetchone() == (0,)
