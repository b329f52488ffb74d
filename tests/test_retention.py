"""Retention: completed jobs leave with their slot of the done ring, truncated whole once
every job in it is older than ``completed_retention`` (they stay at least that long, and at
most about a third longer); failed and cancelled jobs older than ``failed_retention`` are
deleted in bounded batches; unfinished jobs are never touched, and a job that leaves frees
its unique key."""

from __future__ import annotations

import dataclasses
import time

import psycopg
from psycopg import sql

import awa
from awa.worker.rescue import retention_duty
from helpers_worker import start, wait_for, wait_for_state
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
    """``count`` rows in ``state`` finalized ``age`` seconds ago, written straight into
    their home (completed: awa.done_jobs, else awa.held_jobs)."""
    home = "awa.done_jobs" if state == "completed" else "awa.held_jobs"
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (kind, queue, state, attempt, finalized_at)"
            " SELECT 'report', %s, %s::awa.job_state, 1, now() - make_interval(secs => %s)"
            " FROM generate_series(1, %s)"
        ).format(sql.SQL(home)),
        (queue, state, age, count),
    )


def counts(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT state::text, queue, count(*) FROM awa.jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    return {(state, queue): n for state, queue, n in rows}


def filenode(conn: Conn, slot: int, table: str = "done_jobs") -> int:
    """The file of a done slot (or of its counts): a truncation gives it a new one."""
    row = conn.execute("SELECT pg_relation_filenode(%s)", (f"awa.{table}_{slot}",)).fetchone()
    assert row is not None
    return int(row[0])


def done_slots(conn: Conn) -> dict[int, int]:
    """Completed jobs per slot of the done ring."""
    rows = conn.execute("SELECT slot, count(*) FROM awa.done_jobs GROUP BY slot").fetchall()
    return {slot: n for slot, n in rows}


async def test_failed_and_cancelled_jobs_leave_after_their_retention(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Idle)
    async def handle(job: awa.Job[Idle]) -> None:
        pass

    finished(conn, "failed", age=5 * HOUR, count=2, queue="old")
    finished(conn, "cancelled", age=5 * HOUR, count=2, queue="old")
    finished(conn, "failed", age=2 * HOUR, count=2, queue="young")
    finished(conn, "cancelled", age=2 * HOUR, count=1, queue="young")
    # Completed jobs go by slot, however old their finalized_at says they are.
    finished(conn, "completed", age=5 * HOUR, count=3, queue="kept")
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
        ("completed", "kept"): 3,
        ("failed", "young"): 2,
        ("retryable", "pending"): 1,
        ("scheduled", "pending"): 1,
    }


async def test_completed_jobs_stay_their_retention_then_leave_with_their_slot(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Report)
    async def handle(job: awa.Job[Report]) -> None:
        pass

    retention = 1.5
    await start(client, completed_retention=retention, cleanup_interval=0.05)
    job = await client.insert(Report(1))
    await wait_for_state(conn, job.id, "completed")
    row = conn.execute("SELECT slot FROM awa.done_jobs WHERE id = %s", (job.id,)).fetchone()
    assert row is not None
    before = filenode(conn, row[0])
    done_at = time.monotonic()
    await wait_for(lambda: count_jobs(conn, "id = %s", job.id) == 0, 10)
    kept = time.monotonic() - done_at
    await client.shutdown()
    assert kept >= retention * 0.9, f"left after {kept:.2f}s, before its retention"
    assert filenode(conn, row[0]) != before  # its slot went whole: truncated


async def test_a_completed_job_that_leaves_frees_its_unique_key(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Report)
    async def handle(job: awa.Job[Report]) -> None:
        pass

    # The default unique states include completed: the finished row keeps the key.
    opts = awa.UniqueOpts()
    await start(client, completed_retention=1.0, cleanup_interval=0.05)
    done = await client.insert(Report(1), queue="default", unique_opts=opts)
    await wait_for_state(conn, done.id, "completed")
    try:
        await client.insert(Report(1), unique_opts=opts)
        raise AssertionError("the completed job should still hold its key")
    except awa.UniqueConflict:
        pass
    await wait_for(lambda: count_jobs(conn, "id = %s", done.id) == 0, 10)
    again = await client.insert(Report(1), unique_opts=opts)
    await client.shutdown()
    assert again.unique_key == done.unique_key


async def test_each_tick_is_bounded(database_url: str, conn: Conn) -> None:
    """One tick deletes at most batch_size x max_batches failed rows, oldest first; the
    next tick goes on from there."""
    finished(conn, "failed", age=3 * DAY, count=25, queue="oldest")
    finished(conn, "failed", age=2 * DAY, count=25, queue="older")
    duty = retention_duty(interval=1.0, completed=DAY, failed=DAY, batch_size=10, max_batches=2)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        await duty.run(leader)
        assert counts(conn) == {("failed", "oldest"): 5, ("failed", "older"): 25}
        await duty.run(leader)
        assert counts(conn) == {("failed", "older"): 10}
        await duty.run(leader)
        await duty.run(leader)
    assert counts(conn) == {}


async def test_a_large_backlog_goes_in_one_tick(database_url: str, conn: Conn) -> None:
    """50,000 failed rows past retention, with the runtime's default batch size: one tick
    deletes them all, at thousands of rows per second."""
    total = 50_000
    finished(conn, "failed", age=8 * DAY, count=total)
    finished(conn, "failed", age=60, count=1000, queue="young")
    conn.execute("ANALYZE awa.held_jobs")
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
    assert counts(conn) == {("failed", "young"): 1000}
    assert rate > 5_000, f"only {rate:.0f} rows/s"


async def test_a_slot_of_completed_jobs_is_truncated_whole(database_url: str, conn: Conn) -> None:
    """100,000 completed jobs in a slot past its retention leave in one statement: the
    slot is truncated (no row is deleted one by one), and becomes the current one."""
    total = 100_000
    finished(conn, "completed", age=60, count=total)
    [(slot,)] = conn.execute("SELECT slot FROM awa.done_jobs GROUP BY slot").fetchall()
    before = filenode(conn, slot)
    counts_before = filenode(conn, slot, "done_counts")
    # As if the ring had gone round: the slot holding them was sealed two days ago and
    # comes next, after a current slot that has been current long enough.
    conn.execute(
        "UPDATE awa.storage_slots SET opened_at = now() - interval '2 days',"
        " sealed_at = now() - interval '2 days' WHERE ring = 'done'"
    )
    current = (slot - 1) % 8
    conn.execute(
        "UPDATE awa.storage_slots SET sealed_at = NULL WHERE ring = 'done' AND slot = %s",
        (current,),
    )
    conn.execute("SELECT setval('awa.done_slot', %s)", (current,))
    duty = retention_duty(interval=1.0, completed=DAY, failed=DAY, batch_size=5000)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        started = time.perf_counter()
        await duty.run(leader)
        elapsed = time.perf_counter() - started
    print(f"\nretention: {total} completed jobs left with their slot in {elapsed:.2f}s")
    assert done_slots(conn) == {}
    assert filenode(conn, slot) != before
    # Its count rows went the same way, the dead rows of earlier folds with them.
    assert filenode(conn, slot, "done_counts") != counts_before
    assert conn.execute(f"SELECT count(*) FROM awa.done_counts_{slot}").fetchone() == (0,)
    assert conn.execute("SELECT awa.done_slot()").fetchone() == (slot,)
