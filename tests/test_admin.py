"""Admin operations through AsyncClient, Client, and awa.admin on plain psycopg connections
(blocking and asyncio); states are set up with direct SQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import awa
from jobs_helpers import (
    Conn,
    count_jobs,
    job_row,
    listening,
    must_job_row,
    notifications_so_far,
    payloads,
    set_state,
)


@dataclasses.dataclass
class Report:
    n: int


ADMIN_PATHS = ("async_client", "sync_client", "admin_sync_conn", "admin_async_conn")


@dataclasses.dataclass
class Admin:
    """Calls one admin operation through the path under test."""

    path: str
    client: awa.AsyncClient
    sync_client: awa.Client
    sync_conn: Conn
    async_conn: psycopg.AsyncConnection[Any]

    async def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.path == "async_client":
            return await getattr(self.client, name)(*args, **kwargs)
        if self.path == "sync_client":
            return getattr(self.sync_client, name)(*args, **kwargs)
        operation = getattr(awa.admin, name)
        if self.path == "admin_sync_conn":
            return operation(self.sync_conn, *args, **kwargs)
        return await operation(self.async_conn, *args, **kwargs)


@pytest.fixture(params=ADMIN_PATHS)
async def admin(
    request: pytest.FixtureRequest,
    client: awa.AsyncClient,
    sync_client: awa.Client,
    conn: Conn,
    database_url: str,
) -> AsyncIterator[Admin]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        yield Admin(request.param, client, sync_client, conn, aconn)


async def add(
    client: awa.AsyncClient, conn: Conn, state: str = "available", **kwargs: Any
) -> awa.JobRow:
    """Insert a Report job and force it into ``state`` with SQL."""
    job = await client.insert(Report(kwargs.pop("n", 0)), **kwargs)
    if state != "available":
        set_state(conn, job.id, state)
    return job


async def test_get_job(admin: Admin, client: awa.AsyncClient) -> None:
    job = await client.insert(Report(1), tags=["t"])
    assert await admin("get_job", job.id) == job
    assert await admin("get_job", job.id + 1000) is None


async def test_list_jobs_filters_and_order(
    admin: Admin, client: awa.AsyncClient, conn: Conn
) -> None:
    a = await add(client, conn, queue="q1", n=1)
    b = await add(client, conn, "failed", queue="q2", n=2)
    c = await client.insert({"x": 1}, kind="other", queue="q1")
    d = await add(client, conn, "failed", queue="q1", n=4)

    async def ids(**filters: Any) -> list[int]:
        return [job.id for job in await admin("list_jobs", **filters)]

    assert await ids() == [d.id, c.id, b.id, a.id]
    assert await ids(state="failed") == [d.id, b.id]
    assert await ids(state=awa.JobState.AVAILABLE) == [c.id, a.id]
    assert await ids(kind="report") == [d.id, b.id, a.id]
    assert await ids(queue="q1") == [d.id, c.id, a.id]
    assert await ids(queue="q1", state="failed", kind="report") == [d.id]
    assert await ids(limit=2) == [d.id, c.id]
    assert await ids(queue="nowhere") == []
    with pytest.raises(awa.ValidationError, match="finished"):
        await admin("list_jobs", state="finished")
    with pytest.raises(awa.ValidationError, match="limit"):
        await admin("list_jobs", limit=0)


@pytest.mark.parametrize("state", ["available", "scheduled", "retryable", "waiting_external"])
async def test_cancel_unfinished_job(
    admin: Admin, client: awa.AsyncClient, conn: Conn, state: str
) -> None:
    job = await add(client, conn, state)
    cancelled = await admin("cancel", job.id)
    assert cancelled is not None
    assert cancelled.state is awa.JobState.CANCELLED
    row = must_job_row(conn, job.id)
    assert row["state"] == "cancelled"
    assert row["finalized_at"] is not None
    assert cancelled == await client.get_job(job.id)


@pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
async def test_cancel_finished_or_unknown_job_is_none(
    admin: Admin, client: awa.AsyncClient, conn: Conn, state: str
) -> None:
    job = await add(client, conn, state)
    before = must_job_row(conn, job.id)
    assert await admin("cancel", job.id) is None
    assert await admin("cancel", job.id + 1000) is None
    assert must_job_row(conn, job.id) == before


async def test_cancel_running_job_notifies_its_worker(
    admin: Admin, client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    running = await add(client, conn)
    waiting = await add(client, conn)
    idle = await add(client, conn)
    set_state(conn, running.id, "running", run_lease=7, attempt=1)
    set_state(conn, waiting.id, "waiting_external", run_lease=3)
    with listening(database_url, "awa_cancel") as listener:
        for job in (running, waiting, idle):
            assert (await admin("cancel", job.id)).state is awa.JobState.CANCELLED
        received = notifications_so_far(listener, conn, "awa_cancel")
    assert [json.loads(payload) for payload in payloads(received, "awa_cancel")] == [
        {"job_id": running.id, "run_lease": 7},
        {"job_id": waiting.id, "run_lease": 3},
    ]
    row = must_job_row(conn, running.id)
    assert (row["state"], row["run_lease"]) == ("cancelled", 7)


@pytest.mark.parametrize("state", ["failed", "cancelled", "waiting_external"])
async def test_retry(
    admin: Admin, client: awa.AsyncClient, conn: Conn, database_url: str, state: str
) -> None:
    job = await add(client, conn, queue="reports")
    set_state(
        conn,
        job.id,
        state,
        attempt=3,
        finalized_at=dt.datetime.now(dt.UTC),
        run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
    )
    with listening(database_url, "awa_jobs") as listener:
        retried = await admin("retry", job.id)
        received = notifications_so_far(listener, conn, "awa_jobs")
    assert payloads(received, "awa_jobs") == ["reports"]
    assert retried == await client.get_job(job.id)
    row = must_job_row(conn, job.id)
    assert (row["state"], row["attempt"], row["finalized_at"]) == ("available", 0, None)
    assert row["run_at"] > dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("state", ["available", "running", "completed", "scheduled"])
async def test_retry_not_eligible_is_none(
    admin: Admin, client: awa.AsyncClient, conn: Conn, state: str
) -> None:
    job = await add(client, conn, state)
    assert await admin("retry", job.id) is None
    assert await admin("retry", job.id + 1000) is None
    assert must_job_row(conn, job.id)["state"] == state


async def test_cancel_by_unique_key(admin: Admin, client: awa.AsyncClient, conn: Conn) -> None:
    oldest = await client.insert(Report(1), unique_opts={})
    # Parked jobs do not hold the default key, so a second holder can exist.
    set_state(conn, oldest.id, "waiting_external")
    newer = await client.insert(Report(1), unique_opts={})
    other = await client.insert(Report(2), unique_opts={})
    first = await admin("cancel_by_unique_key", "report", args=Report(1))
    assert first.id == oldest.id
    second = await admin("cancel_by_unique_key", "report", args={"n": 1})
    assert second.id == newer.id
    assert await admin("cancel_by_unique_key", "report", args=Report(1)) is None
    assert await admin("cancel_by_unique_key", "report", args=Report(3)) is None
    states = {job.id: must_job_row(conn, job.id)["state"] for job in (oldest, newer, other)}
    assert states == {oldest.id: "cancelled", newer.id: "cancelled", other.id: "available"}


async def test_cancel_by_unique_key_with_queue_and_period(
    admin: Admin, client: awa.AsyncClient, conn: Conn
) -> None:
    by_queue = await client.insert(Report(1), queue="q", unique_opts={"by_queue": True})
    no_args = await client.insert(Report(5), unique_opts={"by_args": False, "by_queue": True})
    run_at = dt.datetime(2100, 1, 1, 0, 30, tzinfo=dt.UTC)
    periodic = await client.insert(Report(1), run_at=run_at, unique_opts={"by_period": 3600})
    assert await admin("cancel_by_unique_key", "report", args=Report(1)) is None
    assert (await admin("cancel_by_unique_key", "report", args=Report(1), queue="q")).id == (
        by_queue.id
    )
    assert (await admin("cancel_by_unique_key", "report", queue="default")).id == no_args.id
    bucket = awa.producer.insert.period_bucket(3600, run_at)
    found = await admin("cancel_by_unique_key", "report", args=Report(1), period_bucket=bucket)
    assert found.id == periodic.id
    assert count_jobs(conn, "state = 'cancelled'") == 3


async def test_retry_failed(admin: Admin, client: awa.AsyncClient, conn: Conn) -> None:
    report_a = await add(client, conn, "failed", queue="a")
    report_b = await add(client, conn, "failed", queue="b")
    other = await client.insert({"x": 1}, kind="other", queue="a")
    set_state(conn, other.id, "failed")
    cancelled = await add(client, conn, "cancelled", queue="a")
    by_kind = await admin("retry_failed", kind="report")
    assert sorted(job.id for job in by_kind) == [report_a.id, report_b.id]
    by_queue = await admin("retry_failed", queue="a")
    assert [job.id for job in by_queue] == [other.id]
    assert await admin("retry_failed", queue="a") == []
    jobs = (report_a, report_b, other, cancelled)
    states = {job.id: must_job_row(conn, job.id)["state"] for job in jobs}
    assert states == {
        report_a.id: "available",
        report_b.id: "available",
        other.id: "available",
        cancelled.id: "cancelled",
    }
    for bad in ({}, {"kind": "report", "queue": "a"}):
        with pytest.raises(awa.ValidationError, match="exactly one"):
            await admin("retry_failed", **bad)


async def test_retry_failed_skips_jobs_whose_unique_key_is_held(
    admin: Admin, client: awa.AsyncClient, conn: Conn
) -> None:
    # Failed jobs do not hold the default key: a newer job took it, so running the failed
    # one again would give the key two holders. Two failed jobs share another key.
    taken = await client.insert(Report(1), unique_opts={})
    set_state(conn, taken.id, "failed")
    holder = await client.insert(Report(1), unique_opts={})
    older = await client.insert(Report(2), unique_opts={})
    set_state(conn, older.id, "failed")
    newer = await client.insert(Report(2), unique_opts={})
    set_state(conn, newer.id, "failed")
    plain = await add(client, conn, "failed")
    retried = await admin("retry_failed", kind="report")
    assert sorted(job.id for job in retried) == sorted([newer.id, plain.id])
    states = {job.id: must_job_row(conn, job.id)["state"] for job in (taken, older, newer)}
    assert states == {taken.id: "failed", older.id: "failed", newer.id: "available"}
    assert must_job_row(conn, holder.id)["state"] == "available"
    # Once the holder is gone, the remaining ones can run again (one per key).
    set_state(conn, holder.id, "cancelled")
    set_state(conn, newer.id, "completed")
    again = await admin("retry_failed", kind="report")
    assert [job.id for job in again] == [taken.id]


async def test_discard_failed(admin: Admin, client: awa.AsyncClient, conn: Conn) -> None:
    await add(client, conn, "failed")
    await add(client, conn, "failed")
    kept = await add(client, conn, "completed")
    other = await client.insert({"x": 1}, kind="other")
    set_state(conn, other.id, "failed")
    assert await admin("discard_failed", "report") == 2
    assert await admin("discard_failed", "report") == 0
    assert [row[0] for row in conn.execute("SELECT id FROM awa.jobs ORDER BY id")] == [
        kept.id,
        other.id,
    ]


async def stats_of(admin: Admin, queue: str) -> awa.QueueStats:
    found = [stats for stats in await admin("queue_stats") if stats.queue == queue]
    assert len(found) == 1, f"no stats for {queue!r}"
    return found[0]


async def test_pause_and_resume(
    admin: Admin, client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    await client.insert(Report(1), queue="mail")
    await admin("pause_queue", "mail", paused_by="ops")
    paused = await stats_of(admin, "mail")
    assert (paused.paused, paused.paused_by) == (True, "ops")
    assert conn.execute("SELECT paused, paused_by FROM awa.queues").fetchall() == [(True, "ops")]
    await admin("pause_queue", "idle")  # a queue without jobs can be paused too
    assert (await stats_of(admin, "idle")).paused
    with listening(database_url, "awa_jobs") as listener:
        assert await admin("resume_queue", "mail") is True
        received = notifications_so_far(listener, conn, "awa_jobs")
    assert payloads(received, "awa_jobs") == ["mail"]
    resumed = await stats_of(admin, "mail")
    assert (resumed.paused, resumed.paused_by) == (False, None)
    assert await admin("resume_queue", "mail") is False
    assert await admin("resume_queue", "never-paused") is False


async def test_drain_queue(admin: Admin, client: awa.AsyncClient, conn: Conn) -> None:
    states = [
        "available",
        "scheduled",
        "retryable",
        "waiting_external",
        "running",
        "completed",
        "failed",
    ]
    jobs = {state: await add(client, conn, state, queue="drain") for state in states}
    elsewhere = await add(client, conn, queue="keep")
    assert await admin("drain_queue", "drain") == 4
    after = {state: must_job_row(conn, job.id)["state"] for state, job in jobs.items()}
    assert after == {
        "available": "cancelled",
        "scheduled": "cancelled",
        "retryable": "cancelled",
        "waiting_external": "cancelled",
        "running": "running",
        "completed": "completed",
        "failed": "failed",
    }
    assert must_job_row(conn, elsewhere.id)["state"] == "available"
    assert await admin("drain_queue", "drain") == 0


async def test_queue_stats(admin: Admin, client: awa.AsyncClient, conn: Conn) -> None:
    for state in ("available", "available", "running", "failed", "scheduled"):
        await add(client, conn, state, queue="stats")
    await add(client, conn, "completed", queue="done")
    conn.execute(
        "UPDATE awa.jobs SET run_at = now() - interval '1 hour' "
        "WHERE id = (SELECT min(id) FROM awa.jobs WHERE state = 'available')"
    )
    stats = await stats_of(admin, "stats")
    assert stats.counts == {
        awa.JobState.AVAILABLE: 2,
        awa.JobState.RUNNING: 1,
        awa.JobState.FAILED: 1,
        awa.JobState.SCHEDULED: 1,
    }
    assert (stats.available, stats.running, stats.total) == (2, 1, 5)
    assert stats.count("completed") == 0
    assert stats.oldest_available_age is not None
    assert 3600 <= stats.oldest_available_age < 3700
    assert stats.oldest_available_at is not None
    assert (stats.paused, stats.paused_by) == (False, None)
    done = await stats_of(admin, "done")
    assert (done.counts, done.oldest_available_age) == ({awa.JobState.COMPLETED: 1}, None)
    assert [s.queue for s in await admin("queue_stats")] == ["done", "stats"]


async def test_admin_runs_inside_the_callers_transaction(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    job = await client.insert(Report(1))
    with psycopg.connect(database_url) as own:  # not autocommit: one open transaction
        assert awa.admin.cancel(own, job.id) is not None
        own.rollback()
        assert awa.admin.drain_queue(own, "default") == 1
        own.commit()
    assert must_job_row(conn, job.id)["state"] == "cancelled"
    async with await psycopg.AsyncConnection.connect(database_url) as aown:
        assert await awa.admin.retry(aown, job.id) is not None
        await aown.rollback()
    assert must_job_row(conn, job.id)["state"] == "cancelled"


def test_admin_refuses_other_connection_types() -> None:
    with pytest.raises(TypeError, match="Connection"):
        awa.admin.get_job(object(), 1)  # type: ignore[call-overload]


async def test_run_now_and_discard(client: awa.AsyncClient, conn: Conn) -> None:
    later = await add(client, conn, run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC))
    assert later.state is awa.JobState.SCHEDULED
    moved = awa.admin.run_now(conn, later.id)
    assert moved is not None
    assert moved.state is awa.JobState.AVAILABLE
    assert awa.admin.run_now(conn, later.id) is None  # available already
    set_state(conn, later.id, "running", attempt=1)
    assert awa.admin.discard(conn, later.id) is False  # an attempt holds it
    assert job_row(conn, later.id) is not None
    set_state(conn, later.id, "failed")
    assert awa.admin.discard(conn, later.id) is True
    assert job_row(conn, later.id) is None
    assert awa.admin.discard(conn, later.id) is False


async def test_retry_and_discard_failed_by_ids(client: awa.AsyncClient, conn: Conn) -> None:
    failed = [await add(client, conn, "failed", n=n) for n in range(3)]
    waiting = await add(client, conn)
    moved = awa.admin.retry_failed(conn, ids=[failed[0].id, waiting.id])
    assert [job.id for job in moved] == [failed[0].id]
    assert awa.admin.discard_failed(conn, ids=[failed[1].id, waiting.id]) == 1
    assert job_row(conn, failed[1].id) is None
    assert must_job_row(conn, failed[2].id)["state"] == "failed"
    with pytest.raises(awa.ValidationError, match="exactly one of kind=, queue= or ids="):
        awa.admin.retry_failed(conn, kind="report", ids=[1])
    with pytest.raises(awa.ValidationError, match="exactly one of kind or ids="):
        awa.admin.discard_failed(conn)
    with pytest.raises(awa.ValidationError, match="job id must be an integer"):
        awa.admin.discard_failed(conn, ids=["7"])  # type: ignore[list-item]
