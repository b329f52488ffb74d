"""Guarded writes of a live attempt: a late outcome after the row moved on (re-claimed,
cancelled) changes nothing; admin cancel reaches the running handler; heartbeats (from their
own thread) and progress reach the row while handlers wait or block."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import psycopg
import pytest

import awa
from awa.worker.config import RuntimeConfig
from helpers_worker import (
    no_longer_in_flight,
    queue,
    row,
    second_client,
    start,
    wait_for,
    wait_for_state,
)
from jobs_helpers import Conn


@dataclasses.dataclass
class Work:
    n: int = 0


@dataclasses.dataclass
class Blocking:
    seconds: float


@dataclasses.dataclass
class Marker:
    pass


async def test_stale_completion_after_a_reclaim_is_rejected(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """Runtime A claims the job and blocks; the row is put back and runtime B re-claims it
    (lease 2). When A's handler finally returns, its completion must not touch the row."""
    release_first = asyncio.Event()
    release_second = asyncio.Event()
    runs: list[tuple[str, int]] = []

    @client.task(Work)
    async def first(job: awa.Job[Work]) -> None:
        runs.append(("a", job.run_lease))
        await release_first.wait()

    async with second_client(database_url) as other:

        @other.task(Work)
        async def second(job: awa.Job[Work]) -> None:
            runs.append(("b", job.run_lease))
            await release_second.wait()

        job = await client.insert(Work())
        await start(client, queue(max_workers=1, prefetch=0))
        await wait_for(lambda: runs == [("a", 1)])

        # The row moves out from under runtime A (as a rescue would do).
        conn.execute(
            "UPDATE awa.jobs SET state = 'available', heartbeat_at = NULL WHERE id = %s",
            (job.id,),
        )
        await start(other, queue(max_workers=1, prefetch=0))
        await wait_for(lambda: runs == [("a", 1), ("b", 2)])

        release_first.set()  # A's stale completion
        await no_longer_in_flight(client, job.id)
        current = row(conn, job.id)
        assert current["state"] == "running"
        assert current["run_lease"] == 2
        assert current["attempt"] == 2
        assert current["finalized_at"] is None

        release_second.set()  # B's completion is the real one
        final = await wait_for_state(conn, job.id, "completed")
        assert final["run_lease"] == 2
        await other.shutdown()
    await client.shutdown()


OUTCOMES: dict[str, Any] = {
    "complete": lambda: None,
    "raise": lambda: ValueError("late failure"),
    "terminal": lambda: awa.TerminalError("late terminal"),
    "retry_after": lambda: awa.RetryAfter(0.1),
    "snooze": lambda: awa.Snooze(0.1),
    "cancel": lambda: awa.Cancel("late cancel"),
}


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
async def test_late_outcome_of_a_cancelled_job_changes_nothing(
    client: awa.AsyncClient, conn: Conn, outcome: str
) -> None:
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> Any:
        job.set_progress(50, "late progress")
        await release.wait()
        result = OUTCOMES[outcome]()
        if isinstance(result, BaseException):
            raise result
        return result

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "running")
    cancelled = await client.cancel(job.id)
    assert cancelled is not None
    assert cancelled.state is awa.JobState.CANCELLED
    before = row(conn, job.id)

    release.set()
    await no_longer_in_flight(client, job.id)
    await client.shutdown()
    after = row(conn, job.id)
    assert after == before
    assert after["state"] == "cancelled"
    assert after["errors"] == []


async def test_admin_cancel_reaches_the_running_handler(
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
    await client.cancel(job.id)
    await wait_for(lambda: noticed, 2)
    assert noticed[0] - began < 1.0
    await no_longer_in_flight(client, job.id)
    final = row(conn, job.id)
    assert final["state"] == "cancelled"
    assert final["run_lease"] == 1
    await client.shutdown()
    assert row(conn, job.id) == final


async def cancel_while_running(
    client: awa.AsyncClient, conn: Conn, reached: asyncio.Event, *, cancel_grace: float
) -> int:
    """Start one slot with ``cancel_grace``, cancel a Work(0) job once it runs, and wait
    until its handler sets ``reached``; returns the job's id."""
    await start(client, queue(max_workers=1), cancel_grace=cancel_grace)
    job = await client.insert(Work(0))
    await wait_for_state(conn, job.id, "running")
    await client.cancel(job.id)
    async with asyncio.timeout(5):
        await reached.wait()
    return job.id


async def test_a_handler_ignoring_cancellation_is_interrupted_after_the_grace(
    client: awa.AsyncClient, conn: Conn
) -> None:
    never = asyncio.Event()
    interrupted = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        if job.args.n == 0:
            try:
                await never.wait()  # ignores is_cancelled()
            except asyncio.CancelledError:
                interrupted.set()
                raise

    stubborn = await cancel_while_running(client, conn, interrupted, cancel_grace=0.2)
    # The only slot is free again, and the interrupted attempt changed nothing.
    after = await client.insert(Work(1))
    await wait_for_state(conn, after.id, "completed")
    await no_longer_in_flight(client, stubborn)
    final = row(conn, stubborn)
    assert (final["state"], final["errors"]) == ("cancelled", [])
    await client.shutdown()


async def test_a_handler_that_swallows_the_interruption_keeps_its_slot_working(
    client: awa.AsyncClient, conn: Conn
) -> None:
    swallowed = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        if job.args.n == 0:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.set()  # and returns normally
            # Later awaits and timeouts of the slot work as usual.
            async with asyncio.timeout(5):
                await asyncio.sleep(0)
        elif job.args.n == 1:
            # A handler raising CancelledError by itself is a crash like any other, also
            # in a slot that was interrupted before.
            raise asyncio.CancelledError

    stubborn = await cancel_while_running(client, conn, swallowed, cancel_grace=0)
    crashing = await client.insert(Work(1), max_attempts=1)
    await wait_for_state(conn, crashing.id, "failed")
    after = await client.insert(Work(2))
    await wait_for_state(conn, after.id, "completed")
    assert row(conn, stubborn)["state"] == "cancelled"
    await client.shutdown()


def test_cancel_grace_is_checked() -> None:
    with pytest.raises(awa.ValidationError, match="cancel_grace"):
        RuntimeConfig(cancel_grace=-1)
    assert RuntimeConfig(cancel_grace=None).cancel_grace is None


async def test_admin_cancel_reaches_a_sync_handler(client: awa.AsyncClient, conn: Conn) -> None:
    started = threading.Event()
    noticed = threading.Event()

    @client.task(Work)
    def handle(job: awa.Job[Work]) -> None:
        started.set()
        deadline = time.monotonic() + 5
        while not job.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if job.is_cancelled():
            noticed.set()

    job = await client.insert(Work())
    await start(client)
    await wait_for(started.is_set)
    await client.cancel(job.id)
    await wait_for(noticed.is_set, 2)
    await no_longer_in_flight(client, job.id)
    await client.shutdown()
    assert row(conn, job.id)["state"] == "cancelled"


async def test_cancel_of_another_attempt_does_not_flip_this_one(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The cancel notification carries the run lease; a stale lease is ignored."""
    started = asyncio.Event()
    release = asyncio.Event()
    flags: list[bool] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        started.set()
        await release.wait()
        flags.append(job.is_cancelled())

    @client.task(Marker)
    async def marker_handler(job: awa.Job[Marker]) -> None:
        pass

    job = await client.insert(Work())
    await start(client)
    await asyncio.wait_for(started.wait(), 5)
    payload = f'{{"job_id": {job.id}, "run_lease": 99}}'
    conn.execute("SELECT pg_notify('awa_cancel', %s)", (payload,))
    # A marker job on the same listener proves the notification was handled before it.
    marker = await client.insert(Marker())
    await wait_for_state(conn, marker.id, "completed")
    release.set()
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert flags == [False]


async def test_heartbeat_advances_while_an_async_handler_waits(
    client: awa.AsyncClient, conn: Conn
) -> None:
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        await release.wait()

    job = await client.insert(Work())
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    first = (await wait_for_state(conn, job.id, "running"))["heartbeat_at"]
    second = await wait_for(lambda: _heartbeat_after(conn, job.id, first), 2)
    await wait_for(lambda: _heartbeat_after(conn, job.id, second), 2)
    release.set()
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert final["heartbeat_at"] is None


async def test_heartbeat_advances_while_a_sync_handler_blocks(
    client: awa.AsyncClient, conn: Conn
) -> None:
    release = threading.Event()

    @client.task(Blocking)
    def handle(job: awa.Job[Blocking]) -> None:
        release.wait(job.args.seconds)

    job = await client.insert(Blocking(10))
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    try:
        first = (await wait_for_state(conn, job.id, "running"))["heartbeat_at"]
        second = await wait_for(lambda: _heartbeat_after(conn, job.id, first), 2)
        await wait_for(lambda: _heartbeat_after(conn, job.id, second), 2)
    finally:
        release.set()
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()


async def test_heartbeat_flows_while_a_handler_blocks_the_event_loop(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """The heartbeat runs on a thread of its own: an async handler that blocks the loop
    still gets heartbeats. It blocks (never yielding to the loop) until it has seen two
    more beats land, or its deadline passes."""
    observed: list[list[Any]] = []

    @client.task(Blocking)
    async def handle(job: awa.Job[Blocking]) -> None:
        beats = []
        with psycopg.connect(database_url, autocommit=True) as own:
            deadline = time.monotonic() + job.args.seconds
            while len(set(beats)) < 3 and time.monotonic() < deadline:
                found = own.execute(
                    "SELECT heartbeat_at FROM awa.jobs WHERE id = %s", (job.id,)
                ).fetchone()
                assert found is not None
                beats.append(found[0])
                time.sleep(0.02)  # noqa: ASYNC251 - blocks the event loop on purpose
        observed.append(beats)

    job = await client.insert(Blocking(10))
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    (beats,) = observed
    assert len(set(beats)) == 3, f"heartbeats seen while the loop was blocked: {set(beats)}"
    assert beats == sorted(beats)


async def test_progress_reaches_the_row_by_heartbeat(client: awa.AsyncClient, conn: Conn) -> None:
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        job.set_progress(40, "working")
        job.update_metadata({"step": 2})
        await release.wait()

    job = await client.insert(Work())
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    expected = {"percent": 40, "message": "working", "metadata": {"step": 2}}
    await wait_for(lambda: row(conn, job.id)["progress"] == expected, 3)
    release.set()
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert final["progress"] is None


@pytest.mark.parametrize(
    "bad",
    [
        lambda job: job.set_progress(10, "nul \x00 byte"),
        lambda job: job.update_metadata({"nul\x00key": 1}),
        lambda job: job.update_metadata({"ratio": float("nan")}),
        lambda job: job.update_metadata({"nested": [{"x": float("inf")}]}),
    ],
    ids=["nul_message", "nul_key", "nan", "inf"],
)
async def test_unstorable_progress_is_refused_and_heartbeats_go_on(
    client: awa.AsyncClient, conn: Conn, bad: Any
) -> None:
    """Progress Postgres cannot store is refused where it is set; it never reaches (and
    breaks) the heartbeat that carries every running job of the process."""
    release = asyncio.Event()
    refused: list[BaseException] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        if job.args.n == 1:
            try:
                bad(job)
            except awa.ValidationError as error:
                refused.append(error)
        await release.wait()

    poisoned = await client.insert(Work(1))
    healthy = await client.insert(Work(2))
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    try:
        await wait_for(lambda: refused, 2)
        first = (await wait_for_state(conn, healthy.id, "running"))["heartbeat_at"]
        await wait_for(lambda: _heartbeat_after(conn, healthy.id, first), 2)
    finally:
        release.set()
    await wait_for_state(conn, poisoned.id, "completed")
    await wait_for_state(conn, healthy.id, "completed")
    await client.shutdown()


def _heartbeat_after(conn: Conn, job_id: int, previous: Any) -> Any:
    current = row(conn, job_id)["heartbeat_at"]
    return current if current is not None and current > previous else None


async def test_job_cancelled_while_buffered_never_runs(client: awa.AsyncClient, conn: Conn) -> None:
    """A job claimed into the prefetch buffer and then cancelled by an operator must not
    reach its handler."""
    release = asyncio.Event()
    ran: list[int] = []

    @client.task(Marker, queue="side")
    async def quick(job: awa.Job[Marker]) -> None:
        pass

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        ran.append(job.args.n)
        if job.args.n > 0:
            await release.wait()

    await start(
        client,
        {**queue(max_workers=1, prefetch=4, poll_interval=10), **queue("side", poll_interval=10)},
    )
    # Quick jobs teach the dispatcher that handlers are fast, so it prefetches.
    for job in await client.insert_many([Work(0) for _ in range(5)]):
        await wait_for_state(conn, job.id, "completed")
    blocker = await client.insert(Work(1), priority=1)
    buffered = await client.insert(Work(2), priority=2)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.stats()["default"]["buffered"] == 1)
    await wait_for(lambda: ran[-1:] == [1])

    await client.cancel(buffered.id)
    # Notifications are handled in order: once a later job on another queue has run, the
    # cancel notification has reached the buffered attempt.
    marker = await client.insert(Marker(), queue="side")
    await wait_for_state(conn, marker.id, "completed")
    release.set()
    await wait_for_state(conn, blocker.id, "completed")
    await no_longer_in_flight(client, buffered.id)
    await client.shutdown()
    assert 2 not in ran
    final = row(conn, buffered.id)
    assert final["state"] == "cancelled"
    assert final["errors"] == []


async def test_heartbeat_carries_the_progress_of_a_new_attempt(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Progress bookkeeping is per attempt: attempt 2 of the same job, claimed right after
    attempt 1 by the same process, still gets its progress written by the heartbeat."""
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> Any:
        if job.attempt == 1:
            job.set_progress(10, "first")
            # Return just after a heartbeat wrote it, so attempt 2 is claimed before the
            # next beat.
            await wait_for(lambda: (row(conn, job.id)["progress"] or {}).get("message"), 3)
            return awa.RetryAfter(0)
        job.set_progress(20, "second")
        await release.wait()
        return None

    job = await client.insert(Work())
    await start(client, heartbeat_interval=0.2, heartbeat_staleness=1.0)
    try:
        await wait_for(
            lambda: row(conn, job.id)["progress"] == {"percent": 20, "message": "second"}, 3
        )
    finally:
        release.set()
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
