"""Dispatch: claim order, paused queues, wakeups by notification, long queue names, and
exactly-once claiming with several runtimes (plus the claim query's own race witnesses)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import psycopg
import pytest

import awa
from awa.worker.lanes import LanePositions, claim_statement
from helpers_worker import queue, second_client, start, wait_for, wait_for_all, wait_for_state
from jobs_helpers import Conn, job_row


@dataclasses.dataclass
class Ping:
    n: int = 0


@dataclasses.dataclass
class Marker:
    pass


async def test_priority_then_run_at_then_id_order(client: awa.AsyncClient, conn: Conn) -> None:
    order: list[int] = []

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        order.append(job.args.n)

    # Inserted while no worker runs; n encodes the expected position.
    plan = [(4, 7), (2, 3), (1, 1), (3, 5), (2, 4), (1, 2), (4, 8), (3, 6)]
    ids = []
    for priority, n in plan:
        ids.append((await client.insert(Ping(n), priority=priority)).id)
    # Same priority, earlier run_at first even though the id is larger.
    late = await client.insert(Ping(0), priority=1)
    conn.execute(
        "UPDATE awa.jobs SET run_at = run_at - interval '1 hour' WHERE id = %s", (late.id,)
    )

    await start(client, queue(max_workers=1))
    await wait_for_all(conn, "completed", len(plan) + 1)
    await client.shutdown()
    assert order == [0, 1, 2, 3, 4, 5, 6, 7, 8]


async def test_paused_queue_is_not_claimed_until_resumed(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    @client.task(Marker, queue="side")
    async def side(job: awa.Job[Marker]) -> None:
        pass

    await client.pause_queue("default", paused_by="test")
    # A long poll interval: only the resume notification can explain a quick pickup.
    await start(client, {**queue(poll_interval=10), **queue("side", poll_interval=10)})
    job = await client.insert(Ping())
    # The worker is alive and handles notifications (a later job on another of its queues
    # completes), yet the paused queue's job stays unclaimed.
    marker = await client.insert(Marker(), queue="side")
    await wait_for_state(conn, marker.id, "completed")
    row = job_row(conn, job.id)
    assert row is not None
    assert row["state"] == "available"
    assert row["run_lease"] == 0
    runtime = client.runtime
    assert runtime is not None
    assert runtime.stats()["default"]["claimed"] == 0

    began = time.monotonic()
    assert await client.resume_queue("default")
    await wait_for_state(conn, job.id, "completed", timeout=2)
    assert time.monotonic() - began < 2
    await client.shutdown()


async def test_idle_worker_picks_up_a_new_job_by_notification(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client, queue(poll_interval=10))
    # Let the dispatcher's first (empty) claim pass, so it sits in its 10 s poll wait.
    runtime = client.runtime
    assert runtime is not None
    await asyncio.sleep(0.2)
    for n in range(3):
        began = time.monotonic()
        job = await client.insert(Ping(n))
        await wait_for_state(conn, job.id, "completed", timeout=2)
        assert time.monotonic() - began < 2
    await client.shutdown()


async def test_a_job_notified_while_every_slot_is_busy_starts_when_one_frees(
    client: awa.AsyncClient, conn: Conn
) -> None:
    release = asyncio.Event()

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        if job.args.n == 0:
            await release.wait()

    @client.task(Marker, queue="side")
    async def side(job: awa.Job[Marker]) -> None:
        pass

    # A 30 s poll interval: only the notification (remembered while the slot was busy) can
    # explain a quick start.
    await start(
        client, {**queue(max_workers=1, poll_interval=30), **queue("side", poll_interval=30)}
    )
    blocker = await client.insert(Ping(0))
    await wait_for_state(conn, blocker.id, "running")
    waiting = await client.insert(Ping(1))
    # Notifications arrive in order: once the marker (inserted later) has run, the
    # notification for `waiting` has been seen while the only slot was busy.
    marker = await client.insert(Marker(), queue="side")
    await wait_for_state(conn, marker.id, "completed")
    assert job_row(conn, waiting.id)["state"] == "available"  # type: ignore[index]
    release.set()
    await wait_for_state(conn, waiting.id, "completed", timeout=3)
    await client.shutdown()


async def test_a_freed_slot_does_not_claim_from_a_queue_found_empty(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client, queue(poll_interval=30))
    runtime = client.runtime
    assert runtime is not None
    dispatcher = runtime._dispatchers["default"]
    claims = 0
    claim = dispatcher._claim

    async def counting_claim(config: Any, limit: int, lanes: Any) -> Any:
        nonlocal claims
        claims += 1
        return await claim(config, limit, lanes)

    dispatcher._claim = counting_claim
    for n in range(5):
        job = await client.insert(Ping(n))
        await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    # One claim per notification; a slot finishing after a short claim adds none (it would
    # double the claims at low load).
    assert claims <= 6


async def test_a_more_urgent_job_overtakes_prefetched_ones(
    client: awa.AsyncClient, conn: Conn
) -> None:
    release = asyncio.Event()
    order: list[int] = []

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        order.append(job.args.n)
        if job.args.n == 0:
            await release.wait()

    await start(client, queue(max_workers=1, prefetch=4, poll_interval=10))
    runtime = client.runtime
    assert runtime is not None
    # Quick jobs teach the dispatcher that handlers are fast, so it prefetches.
    for job in await client.insert_many([Ping(100 + n) for n in range(5)]):
        await wait_for_state(conn, job.id, "completed")
    order.clear()
    blocker = await client.insert(Ping(0), priority=1)
    await wait_for_state(conn, blocker.id, "running")
    low = await client.insert(Ping(1), priority=4)
    await wait_for(lambda: runtime.stats()["default"]["buffered"] == 1)
    urgent = await client.insert(Ping(2), priority=1)
    await wait_for(lambda: runtime.stats()["default"]["buffered"] == 2)
    release.set()
    for job in (blocker, low, urgent):
        await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert order == [0, 2, 1]


async def test_queue_name_of_200_characters(client: awa.AsyncClient, conn: Conn) -> None:
    name = "q" * 190 + "é" * 10
    assert len(name) == 200
    seen: list[str] = []

    @client.task(Ping, queue=name)
    async def handle(job: awa.Job[Ping]) -> None:
        seen.append(job.queue)

    await start(client, queue(name, poll_interval=10))
    await asyncio.sleep(0.2)
    began = time.monotonic()
    job = await client.insert(Ping(), queue=name)
    await wait_for_state(conn, job.id, "completed", timeout=2)
    assert time.monotonic() - began < 2
    await client.shutdown()
    assert seen == [name]


async def test_two_runtimes_complete_1000_jobs_exactly_once(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    runs: list[tuple[int, int]] = []

    async with second_client(database_url) as other:
        for each in (client, other):

            @each.task(Ping)
            async def handle(job: awa.Job[Ping]) -> None:
                runs.append((job.id, job.run_lease))
                if job.args.n % 7 == 0:
                    await asyncio.sleep(0)

        await client.insert_many([Ping(n) for n in range(1000)])
        await start(client, queue(max_workers=8))
        await start(other, queue(max_workers=8))
        await wait_for_all(conn, "completed", 1000, timeout=30)
        await other.shutdown()
    await client.shutdown()
    assert len(runs) == 1000
    assert len({job_id for job_id, _ in runs}) == 1000
    assert {lease for _, lease in runs} == {1}
    attempts = conn.execute("SELECT DISTINCT attempt, run_lease FROM awa.jobs").fetchall()
    assert attempts == [(1, 1)]


CLAIM = claim_statement((1, 2, 3, 4), 256)
"""The claim of every lane of a queue."""
HEADS = LanePositions().params()
"""CLAIM's parameters that read every lane from its head."""
KINDS = {"kinds": ["ping"]}
"""CLAIM's parameter naming the kinds the claimer runs: this module's jobs."""


async def test_concurrent_raw_claims_never_return_the_same_job(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """Witness for the double claim (reliability G2/E2): ten claims of 20 racing over 100
    jobs return 100 distinct jobs."""
    await client.insert_many([Ping(n) for n in range(100)])
    params = {"queue": "default", "limit": 20, "deadline": "300 seconds", **KINDS, **HEADS}
    conns = [
        await psycopg.AsyncConnection.connect(database_url, autocommit=True) for _ in range(10)
    ]
    try:
        gate = asyncio.Event()

        async def claim(each: psycopg.AsyncConnection[Any]) -> list[int]:
            await gate.wait()
            cursor = await each.execute(CLAIM, params)
            return [row[0] for row in await cursor.fetchall()]

        tasks = [asyncio.create_task(claim(each)) for each in conns]
        await asyncio.sleep(0.05)
        gate.set()
        claimed = [job_id for ids in await asyncio.gather(*tasks) for job_id in ids]
    finally:
        for each in conns:
            await each.close()
    assert len(claimed) == 100
    assert len(set(claimed)) == 100
    rows = conn.execute("SELECT DISTINCT attempt, run_lease, state::text FROM awa.jobs")
    assert rows.fetchall() == [(1, 1, "running")]


async def test_a_claim_from_a_lane_position_skips_what_lies_before_it(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A claim reads each lane from the position it is given: jobs before it are not taken
    (the dispatcher rewinds its lanes when such a job is announced)."""
    jobs = await client.insert_many([Ping(n) for n in range(4)])
    lanes = LanePositions()
    params = {"queue": "default", "limit": 2, "deadline": "300 seconds", **KINDS}
    first = conn.execute(CLAIM, {**params, **lanes.params()}).fetchall()
    assert [row[0] for row in first] == [jobs[0].id, jobs[1].id]
    lanes.claimed(first, emptied=False)
    conn.execute(
        "UPDATE awa.jobs SET state = 'available', attempt = 0 WHERE id = %s", (jobs[1].id,)
    )
    rest = conn.execute(CLAIM, {**params, "limit": 5, **lanes.params()}).fetchall()
    assert [row[0] for row in rest] == [jobs[2].id, jobs[3].id]
    again = conn.execute(CLAIM, {**params, "limit": 5, **HEADS}).fetchall()
    assert [row[0] for row in again] == [jobs[1].id]


async def test_claim_honours_its_limit(client: awa.AsyncClient, conn: Conn) -> None:
    await client.insert_many([Ping(n) for n in range(10)])
    params = {"queue": "default", "limit": 4, "deadline": "300 seconds", **KINDS, **HEADS}
    assert len(conn.execute(CLAIM, params).fetchall()) == 4
    row = conn.execute("SELECT count(*) FROM awa.jobs WHERE state = 'running'").fetchone()
    assert row == (4,)


async def test_worker_only_claims_its_own_queues(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Ping, queue="mine")
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client, queue("mine"))
    other = await client.insert(Ping(), queue="theirs")
    mine = await client.insert(Ping(), queue="mine")
    await wait_for_state(conn, mine.id, "completed")
    await client.shutdown()
    row = job_row(conn, other.id)
    assert row is not None
    assert row["state"] == "available"
    assert row["run_lease"] == 0


async def test_max_workers_bounds_concurrency(client: awa.AsyncClient, conn: Conn) -> None:
    running = 0
    peak = 0

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    await client.insert_many([Ping(n) for n in range(40)])
    await start(client, queue(max_workers=3))
    await wait_for_all(conn, "completed", 40)
    await client.shutdown()
    assert peak == 3


async def test_wait_for_helper_times_out_with_a_message() -> None:
    with pytest.raises(AssertionError, match="never"):
        await wait_for(lambda: False, 0.05, message="never")


async def test_queue_names_that_look_like_injection(client: awa.AsyncClient, conn: Conn) -> None:
    names = ["x'); DROP TABLE awa.jobs;--", 'a"b', "%s", "%(x)s", "{}", "$1", "back\\slash", "🚀"]
    seen: list[str] = []
    for index, name in enumerate(names):

        def register(name: str = name, kind: str = f"k{index}") -> None:
            @client.task(None, kind=kind, queue=name)
            async def handle(job: awa.Job[Any]) -> None:
                seen.append(job.queue)

        register()
    await start(client, {name: {"max_workers": 1, "poll_interval": 10} for name in names})
    await asyncio.sleep(0.1)
    jobs = [await client.insert({}, kind=f"k{i}", queue=name) for i, name in enumerate(names)]
    for job in jobs:
        await wait_for_state(conn, job.id, "completed", timeout=2)
    await client.shutdown()
    assert sorted(seen) == sorted(names)


async def test_pickup_by_notification_resumes_after_the_listener_reconnects(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client, queue(poll_interval=10))
    runtime = client.runtime
    assert runtime is not None
    listener = runtime._listener
    assert listener is not None
    await wait_for(lambda: listener.connected)
    killed = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query LIKE 'LISTEN awa_jobs%%'"
    ).fetchall()
    assert killed == [(True,)]
    await wait_for(lambda: not listener.connected, 3)
    await wait_for(lambda: listener.connected, 5)
    began = time.monotonic()
    job = await client.insert(Ping())
    await wait_for_state(conn, job.id, "completed", timeout=2)
    assert time.monotonic() - began < 2
    await client.shutdown()
