"""Shutdown: handlers in flight finish within the timeout, then see is_cancelled(), and what
still runs after that is interrupted and requeued without consuming its attempt. Claimed but
unstarted jobs go back to available, nothing is claimed once shutdown begins, and no job of
the runtime is left running."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from functools import partial

import awa
from awa.worker.runtime import CANCEL_GRACE
from helpers_worker import (
    queue,
    row,
    running_rows,
    second_client,
    start,
    state_counts,
    wait_for,
    wait_for_state,
)
from jobs_helpers import Conn


@dataclasses.dataclass
class Work:
    seconds: float = 0.0


@dataclasses.dataclass
class Quick:
    n: int = 0


async def shutdown_within(client: awa.AsyncClient, timeout: float, limit: float) -> float:
    """Shut the worker down with ``timeout``; fail if that takes longer than ``limit`` s.
    Returns how long it took."""
    began = time.monotonic()
    task = asyncio.create_task(client.shutdown(timeout=timeout))
    done, _ = await asyncio.wait({task}, timeout=limit)
    assert done, f"shutdown(timeout={timeout}) still running after {limit}s"
    await task
    return time.monotonic() - began


async def test_jobs_in_flight_finish_within_the_timeout(
    client: awa.AsyncClient, conn: Conn
) -> None:
    finished: list[int] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        await asyncio.sleep(job.args.seconds)
        finished.append(job.id)

    jobs = [await client.insert(Work(0.5)) for _ in range(3)]
    await start(client)
    for job in jobs:
        await wait_for_state(conn, job.id, "running")
    took = await shutdown_within(client, 5, limit=4)
    assert took < 2
    assert sorted(finished) == [job.id for job in jobs]
    for job in jobs:
        final = row(conn, job.id)
        assert final["state"] == "completed"
        assert final["attempt"] == 1
    assert running_rows(conn) == []


async def test_handler_past_the_timeout_sees_is_cancelled(
    client: awa.AsyncClient, conn: Conn
) -> None:
    started = asyncio.Event()
    noticed: list[float] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        started.set()
        while not job.is_cancelled():
            await asyncio.sleep(0.01)
        noticed.append(time.monotonic())

    job = await client.insert(Work())
    await start(client)
    await asyncio.wait_for(started.wait(), 5)
    began = time.monotonic()
    await shutdown_within(client, 0.3, limit=3)
    assert len(noticed) == 1
    assert 0.25 <= noticed[0] - began < 0.3 + CANCEL_GRACE
    # It returned None after noticing, which completes the job.
    assert row(conn, job.id)["state"] == "completed"
    assert running_rows(conn) == []


async def test_handler_ignoring_cancellation_is_interrupted_and_requeued(
    client: awa.AsyncClient, conn: Conn
) -> None:
    interrupted = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        try:
            await asyncio.Event().wait()  # hangs until interrupted
        except asyncio.CancelledError:
            interrupted.append(job.id)
            raise

    job = await client.insert(Work(), max_attempts=1)
    await start(client)
    await wait_for_state(conn, job.id, "running")
    took = await shutdown_within(client, 0.2, limit=5)
    assert took < 0.2 + CANCEL_GRACE + 1
    assert interrupted == [job.id]
    final = row(conn, job.id)
    assert final["state"] == "available"
    assert final["attempt"] == 0  # the interrupted attempt is not consumed
    assert final["run_lease"] == 1
    assert final["heartbeat_at"] is None
    (error,) = final["errors"]
    assert error["error"].startswith("interrupted")
    assert error["attempt"] == 1
    assert running_rows(conn) == []


async def test_sync_handler_ignoring_cancellation_is_requeued(
    client: awa.AsyncClient, conn: Conn
) -> None:
    release = threading.Event()
    started = threading.Event()

    @client.task(Work)
    def handle(job: awa.Job[Work]) -> None:
        started.set()
        release.wait(job.args.seconds)  # ignores job.is_cancelled()

    job = await client.insert(Work(30))
    await start(client)
    await wait_for(started.is_set)
    try:
        await shutdown_within(client, 0.2, limit=5)
    finally:
        release.set()
    final = row(conn, job.id)
    assert final["state"] == "available"
    assert final["attempt"] == 0
    assert [e["attempt"] for e in final["errors"]] == [1]
    assert running_rows(conn) == []


async def test_prefetched_jobs_go_back_to_available(client: awa.AsyncClient, conn: Conn) -> None:
    release = asyncio.Event()

    @client.task(Quick)
    async def quick(job: awa.Job[Quick]) -> None:
        pass

    @client.task(Work)
    async def slow(job: awa.Job[Work]) -> None:
        await release.wait()

    await start(client, queue(max_workers=1, prefetch=4, poll_interval=10))
    # Quick jobs teach the dispatcher that handlers are fast, so it prefetches.
    warm = await client.insert_many([Quick(n) for n in range(5)])
    for job in warm:
        await wait_for_state(conn, job.id, "completed")
    # One blocking job first (priority 1), then four more claimed in the same batch.
    blocker = await client.insert(Work(), priority=1)
    rest = await client.insert_many([Quick(n) for n in range(4)], priority=2)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.stats()["default"]["buffered"] == 4)
    for job in rest:
        assert row(conn, job.id)["state"] == "running"  # claimed, not started

    task = asyncio.create_task(client.shutdown(timeout=5))
    for job in rest:
        await wait_for_state(conn, job.id, "available")
    release.set()
    await asyncio.wait_for(task, 5)
    assert row(conn, blocker.id)["state"] == "completed"
    for job in rest:
        final = row(conn, job.id)
        assert final["attempt"] == 0
        assert final["run_lease"] == 1
        assert final["errors"] == []
    assert running_rows(conn) == []


async def test_no_claims_after_shutdown_begins(client: awa.AsyncClient, conn: Conn) -> None:
    release = asyncio.Event()

    @client.task(Work)
    async def slow(job: awa.Job[Work]) -> None:
        await release.wait()

    await start(client, queue(max_workers=1, prefetch=0))
    busy = await client.insert(Work())
    await wait_for_state(conn, busy.id, "running")
    waiting = await client.insert(Work())  # no free slot, no prefetch: stays available

    task = asyncio.create_task(client.shutdown(timeout=5))
    await asyncio.sleep(0)  # shutdown has begun
    late = await client.insert(Work())
    release.set()  # the slot frees up during the drain
    await asyncio.wait_for(task, 5)

    assert row(conn, busy.id)["state"] == "completed"
    for job in (waiting, late):
        final = row(conn, job.id)
        assert final["state"] == "available"
        assert final["run_lease"] == 0
    assert running_rows(conn) == []


async def test_shutdown_right_after_a_wakeup_returns(client: awa.AsyncClient) -> None:
    """A wakeup that lands just as shutdown stops the dispatcher must not keep it alive."""

    @client.task(Quick)
    async def quick(job: awa.Job[Quick]) -> None:
        pass

    await start(client)
    runtime = client.runtime
    assert runtime is not None
    await asyncio.sleep(0.1)  # let the dispatcher settle into its idle wait
    runtime.wake("default")
    await shutdown_within(client, 1, limit=5)


async def test_repeated_shutdowns_under_load_leave_nothing_running(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Shutting down while claims are in flight loses no job: every job is either completed
    or back to available with its attempt intact."""

    @client.task(Quick)
    async def quick(job: awa.Job[Quick]) -> None:
        await asyncio.sleep(0.002)

    await client.insert_many([Quick(n) for n in range(600)])
    for cycle in range(8):
        await start(client, queue(max_workers=4, claim_batch_size=5))
        target = state_counts(conn).get("completed", 0) + 10
        await wait_for(partial(_completed_at_least, conn, target))
        await shutdown_within(client, 2, limit=6)
        assert running_rows(conn) == [], f"cycle {cycle}: {state_counts(conn)}"
        bad = conn.execute(
            "SELECT count(*) FROM awa.jobs WHERE state = 'available' AND attempt <> 0"
        ).fetchone()
        assert bad == (0,)


async def test_jobs_given_back_at_shutdown_wake_other_workers(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """Interrupted and unstarted jobs go back to available with a notification, so another
    runtime (here with a 10 s poll) picks them up at once, not at its next poll."""
    ran_on_b: list[int] = []

    @client.task(Quick)
    async def warm(job: awa.Job[Quick]) -> None:
        pass

    @client.task(Work)
    async def stubborn(job: awa.Job[Work]) -> None:
        await asyncio.Event().wait()  # hangs, ignoring is_cancelled(), until interrupted

    async with second_client(database_url) as other:

        @other.task(Work)
        async def finish(job: awa.Job[Work]) -> None:
            ran_on_b.append(job.id)

        other.task(Quick)(warm)
        await start(client, queue(max_workers=1, prefetch=4, poll_interval=10))
        for job in await client.insert_many([Quick(n) for n in range(5)]):
            await wait_for_state(conn, job.id, "completed")
        running = await client.insert(Work(), priority=1)
        buffered = await client.insert_many([Work() for _ in range(2)], priority=2)
        runtime = client.runtime
        assert runtime is not None
        await wait_for(lambda: runtime.stats()["default"]["buffered"] == 2)
        await wait_for_state(conn, running.id, "running")

        # Runtime B starts idle: its first claim finds nothing, then it waits 10 s.
        await start(other, queue(max_workers=4, poll_interval=10))
        other_runtime = other.runtime
        assert other_runtime is not None
        await wait_for(lambda: other_runtime.stats()["default"]["claimed"] == 0)
        await asyncio.sleep(0.1)

        await shutdown_within(client, 0.1, limit=5)
        for job in [running, *buffered]:
            await wait_for_state(conn, job.id, "completed", timeout=2)
        await other.shutdown()
    assert sorted(ran_on_b) == sorted(job.id for job in [running, *buffered])


async def test_heartbeats_continue_during_the_drain(client: awa.AsyncClient, conn: Conn) -> None:
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        await release.wait()

    job = await client.insert(Work())
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    await wait_for_state(conn, job.id, "running")
    task = asyncio.create_task(client.shutdown(timeout=10))
    await asyncio.sleep(0)
    first = row(conn, job.id)["heartbeat_at"]

    def advanced() -> bool:
        current = row(conn, job.id)["heartbeat_at"]
        return current is not None and current > first

    await wait_for(advanced, 2)
    assert not task.done()
    release.set()
    await asyncio.wait_for(task, 5)
    assert row(conn, job.id)["state"] == "completed"


def _completed_at_least(conn: Conn, count: int) -> bool:
    return state_counts(conn).get("completed", 0) >= count
