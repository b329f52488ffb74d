"""Retention: the leader deletes completed jobs older than ``completed_retention`` and
failed or cancelled jobs older than ``failed_retention``, in bounded batches; younger rows
and unfinished ones stay, and a deleted job's unique key is free again. Deleting a large
backlog takes a tick or two, not minutes."""

from __future__ import annotations

import dataclasses
import time

import psycopg

import awa
from awa.worker.rescue import retention_duty
from helpers_worker import start, wait_for
from jobs_helpers import Conn, count_jobs

HOUR = 3600.0
DAY = 24 * HOUR


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Idle:
    pass


def finished(conn: Conn, state: str, age: float, count: int = 1, queue: str = "old") -> None:
    """``count`` rows in ``state`` finalized ``age`` seconds ago."""
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, state, attempt, finalized_at)"
        " SELECT 'report', %s, %s::awa.job_state, 1, now() - make_interval(secs => %s)"
        " FROM generate_series(1, %s)",
        (queue, state, age, count),
    )


def counts(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT state::text, queue, count(*) FROM awa.jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    return {(state, queue): n for state, queue, n in rows}


async def test_retention_deletes_old_finished_jobs_and_keeps_the_rest(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Idle)
    async def handle(job: awa.Job[Idle]) -> None:
        pass

    finished(conn, "completed", age=2 * HOUR, count=3, queue="old")
    finished(conn, "completed", age=10 * 60, count=2, queue="young")
    finished(conn, "failed", age=5 * HOUR, count=2, queue="old")
    finished(conn, "cancelled", age=5 * HOUR, count=2, queue="old")
    # Failed and cancelled past the completed retention but within their own: kept.
    finished(conn, "failed", age=2 * HOUR, count=2, queue="young")
    finished(conn, "cancelled", age=2 * HOUR, count=1, queue="young")
    # Unfinished rows are never touched, however old.
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, state, attempt, run_at, created_at, finalized_at)"
        " VALUES ('report', 'pending', 'retryable', 1, now() + interval '1 hour',"
        " now() - interval '30 days', now() - interval '30 days'),"
        " ('report', 'pending', 'scheduled', 0, now() + interval '1 hour',"
        " now() - interval '30 days', NULL),"
        " ('report', 'pending', 'available', 0, now(), now() - interval '30 days', NULL)"
    )
    await start(
        client,
        completed_retention=HOUR,
        failed_retention=4 * HOUR,
        cleanup_interval=0.1,
        cleanup_batch_size=2,  # several batches per tick
    )
    await wait_for(lambda: count_jobs(conn, "queue = 'old'") == 0, 5)
    await client.shutdown()
    assert counts(conn) == {
        ("available", "pending"): 1,
        ("cancelled", "young"): 1,
        ("completed", "young"): 2,
        ("failed", "young"): 2,
        ("retryable", "pending"): 1,
        ("scheduled", "pending"): 1,
    }


async def test_deleting_a_finished_job_frees_its_unique_key(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Idle)
    async def handle(job: awa.Job[Idle]) -> None:
        pass

    # The default unique states include completed: the finished row keeps the key.
    opts = awa.UniqueOpts()
    done = await client.insert(Report(1), queue="reports", unique_opts=opts)
    conn.execute(
        "UPDATE awa.jobs SET state = 'completed', attempt = 1,"
        " finalized_at = now() - interval '2 days' WHERE id = %s",
        (done.id,),
    )
    try:
        await client.insert(Report(1), queue="reports", unique_opts=opts)
        raise AssertionError("the completed job should still hold its key")
    except awa.UniqueConflict:
        pass
    await start(client, completed_retention=DAY, cleanup_interval=0.1)
    await wait_for(lambda: count_jobs(conn, "id = %s", done.id) == 0, 5)
    await client.shutdown()
    again = await client.insert(Report(1), queue="reports", unique_opts=opts)
    assert again.unique_key == done.unique_key


async def test_each_tick_is_bounded(database_url: str, conn: Conn) -> None:
    """One tick deletes at most batch_size x max_batches rows, oldest first; the next tick
    goes on from there."""
    finished(conn, "completed", age=3 * DAY, count=25, queue="oldest")
    finished(conn, "completed", age=2 * DAY, count=25, queue="older")
    duty = retention_duty(interval=1.0, completed=DAY, failed=DAY, batch_size=10, max_batches=2)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        await duty.run(leader)
        assert counts(conn) == {("completed", "oldest"): 5, ("completed", "older"): 25}
        await duty.run(leader)
        assert counts(conn) == {("completed", "older"): 10}
        await duty.run(leader)
        await duty.run(leader)
    assert counts(conn) == {}


async def test_a_large_backlog_goes_in_one_tick(database_url: str, conn: Conn) -> None:
    """50,000 completed rows past retention, with the runtime's default batch size: one
    tick deletes them all, at thousands of rows per second."""
    total = 50_000
    finished(conn, "completed", age=2 * DAY, count=total)
    finished(conn, "completed", age=60, count=1000, queue="young")
    conn.execute("ANALYZE awa.jobs")
    config = awa.RuntimeConfig()
    duty = retention_duty(
        interval=config.cleanup_interval,
        completed=config.completed_retention,
        failed=config.failed_retention,
        batch_size=config.cleanup_batch_size,
    )
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        started = time.perf_counter()
        await duty.run(leader)
        elapsed = time.perf_counter() - started
    rate = total / elapsed
    print(f"\nretention: deleted {total} rows in one tick, {elapsed:.2f}s ({rate:,.0f} rows/s)")
    assert counts(conn) == {("completed", "young"): 1000}
    assert rate > 5_000, f"only {rate:.0f} rows/s"
