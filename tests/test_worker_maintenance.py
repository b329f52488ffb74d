"""The maintenance leader: promotion of due scheduled and retryable jobs (and its timing),
one leader per database, and failover to another runtime when the leader stops."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import awa
from helpers_worker import (
    db_now,
    insert_raw,
    queue,
    row,
    second_client,
    seconds,
    start,
    wait_for,
    wait_for_state,
)
from jobs_helpers import Conn


@dataclasses.dataclass
class Work:
    n: int = 0


async def test_scheduled_job_is_promoted_on_time(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    # A 10 s poll: the pickup can only come from the promotion's notification.
    await start(client, queue(poll_interval=10), promote_interval=0.05)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.is_leader, 5)
    job = await client.insert(Work(), run_at=db_now(conn) + dt.timedelta(seconds=0.5))
    assert job.state is awa.JobState.SCHEDULED
    final = await wait_for_state(conn, job.id, "completed", timeout=5)
    await client.shutdown()
    # Promotion keeps run_at; the claim happened within a promote interval or so of it.
    lag = seconds(final["attempted_at"] - final["run_at"])
    assert 0 <= lag < 0.5, f"claimed {lag:.3f}s after run_at"
    assert final["run_at"] == job.run_at


async def test_past_run_at_is_promoted_at_once(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    await start(client, queue(poll_interval=10))
    # Scheduled with a run_at already past (e.g. the leader was down): due immediately.
    job_id = insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, state, run_at) "
        "VALUES ('work', 'scheduled', now() - interval '1 minute') RETURNING id",
    )
    await wait_for_state(conn, job_id, "completed", timeout=3)
    await client.shutdown()


async def test_retryable_jobs_are_promoted(client: awa.AsyncClient, conn: Conn) -> None:
    attempts: list[int] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        attempts.append(job.attempt)

    await start(client, queue(poll_interval=10))
    job_id = insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, state, attempt, run_lease, run_at) "
        "VALUES ('work', 'retryable', 1, 1, now() + interval '300 milliseconds') RETURNING id",
    )
    final = await wait_for_state(conn, job_id, "completed", timeout=3)
    await client.shutdown()
    assert attempts == [2]
    assert final["run_lease"] == 2
    assert 0 <= seconds(final["attempted_at"] - final["run_at"]) < 0.5


async def test_future_jobs_stay_scheduled(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    await start(client, queue(poll_interval=10))
    later = await client.insert(Work(), run_at=db_now(conn) + dt.timedelta(hours=1))
    soon = await client.insert(Work(), run_at=db_now(conn) + dt.timedelta(seconds=0.2))
    await wait_for_state(conn, soon.id, "completed", timeout=3)
    await client.shutdown()
    assert row(conn, later.id)["state"] == "scheduled"


async def test_many_due_jobs_are_promoted_in_batches(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    conn.execute(
        "INSERT INTO awa.jobs (kind, state, run_at) "
        "SELECT 'work', 'scheduled', now() - interval '1 second' FROM generate_series(1, 50)"
    )
    await start(client, queue(max_workers=8, poll_interval=10), promote_batch_size=7)
    await wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM awa.jobs WHERE state = 'completed'").fetchone()
            == (50,)
        ),
        5,
    )
    await client.shutdown()


async def test_one_leader_and_failover(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    ran: list[str] = []

    async with second_client(database_url) as other:
        for name, each in (("first", client), ("second", other)):

            def register(owner: str, target: awa.AsyncClient) -> None:
                @target.task(Work)
                async def handle(job: awa.Job[Work]) -> None:
                    ran.append(owner)

            register(name, each)

        settings = {"promote_interval": 0.05, "leader_election_interval": 0.2}
        await start(client, queue(poll_interval=10), **settings)
        await start(other, queue(poll_interval=10), **settings)
        first_runtime, second_runtime = client.runtime, other.runtime
        assert first_runtime is not None
        assert second_runtime is not None
        await wait_for(lambda: first_runtime.is_leader or second_runtime.is_leader, 5)
        # Exactly one leader, and it stays that way across several election rounds.
        for _ in range(3):
            await asyncio.sleep(0.2)
            assert first_runtime.is_leader != second_runtime.is_leader

        leader, follower = (client, other) if first_runtime.is_leader else (other, client)
        follower_runtime = follower.runtime
        assert follower_runtime is not None
        await leader.shutdown()
        await wait_for(lambda: follower_runtime.is_leader, 3)

        job = await follower.insert(Work(), run_at=db_now(conn) + dt.timedelta(seconds=0.3))
        final = await wait_for_state(conn, job.id, "completed", timeout=3)
        assert 0 <= seconds(final["attempted_at"] - final["run_at"]) < 0.5
        await other.shutdown()
    await client.shutdown()
    assert len(ran) == 1


async def test_leader_failover_when_the_leader_connection_dies(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """A leader whose lock connection is killed loses the lock with it; the other runtime
    takes over and promotion goes on."""

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    async with second_client(database_url) as other:
        other.task(Work)(handle)
        settings = {"promote_interval": 0.05, "leader_election_interval": 0.2}
        await start(client, queue(poll_interval=10), **settings)
        await start(other, queue(poll_interval=10), **settings)
        runtimes = [client.runtime, other.runtime]
        assert all(runtimes)
        await wait_for(lambda: any(r.is_leader for r in runtimes if r), 5)

        # Kill the backend that holds the advisory lock.
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks "
            "WHERE locktype = 'advisory' AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
        assert killed == [(True,)]
        await wait_for(lambda: any(r.is_leader for r in runtimes if r), 5)

        job = await client.insert(Work(), run_at=db_now(conn) + dt.timedelta(seconds=0.2))
        await wait_for_state(conn, job.id, "completed", timeout=5)
        await other.shutdown()
    await client.shutdown()
