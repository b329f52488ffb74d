"""Maintenance rescue: the three sweeps (stale heartbeat, deadline exceeded, expired
callback), what a rescue writes, the Rescued event and follow-ups, the unique-collision
fallback, bounded sweeps, and rescue liveness when user code misbehaves.

Stranded attempts are made with plain SQL (a ``running`` row nobody works, its heartbeat or
deadline pushed into the past), so each sweep is deterministic. Rescued jobs stay on a queue
no runtime works unless the test wants them to run again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import awa
from awa.lifecycle.events import RescueReason
from awa.worker import rescue as rescue_module
from awa.worker.rescue import SWEEPS, rescue
from helpers_lifecycle import Counters, Recorder, hooks_idle, jobs_of_kind, metric_reader
from helpers_worker import (
    db_now,
    insert_raw,
    queue,
    row,
    second_client,
    seconds,
    start,
    wait_for,
    wait_for_all,
    wait_for_state,
)
from jobs_helpers import Conn, count_jobs

STRANDED_QUEUE = "stranded"  # no runtime in these tests works it

# Sweep every 100 ms; a heartbeat older than a second is stale.
RESCUE: dict[str, Any] = {
    "heartbeat_rescue_interval": 0.1,
    "deadline_rescue_interval": 0.1,
    "callback_rescue_interval": 0.1,
    "heartbeat_interval": 0.2,
    "heartbeat_staleness": 1.0,
}


@dataclasses.dataclass
class Stranded:
    n: int = 0


@dataclasses.dataclass
class Idle:
    pass


@dataclasses.dataclass
class RescueNote:
    rescued_job_id: int
    reason: str


@pytest.fixture(autouse=True)
def _metrics() -> None:
    metric_reader()  # route awa's counters to an in-memory reader


def idle_worker(client: awa.AsyncClient) -> None:
    """Give the runtime something to work (on ``default``), so it runs and leads."""

    @client.task(Idle)
    async def handle(job: awa.Job[Idle]) -> None:
        pass


def strand(
    conn: Conn,
    *,
    attempt: int = 1,
    max_attempts: int = 5,
    heartbeat_age: float = 3600.0,
    deadline_in: float = 3600.0,
    queue_name: str = STRANDED_QUEUE,
    n: int = 0,
) -> int:
    """A ``running`` attempt that no process works, with its heartbeat ``heartbeat_age``
    seconds old and its deadline ``deadline_in`` seconds away (negative: passed)."""
    return insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, args, state, attempt, max_attempts, run_lease,"
        " attempted_at, heartbeat_at, deadline_at)"
        " VALUES ('stranded', %s, jsonb_build_object('n', %s::int), 'running', %s, %s, %s,"
        " now() - make_interval(secs => %s), now() - make_interval(secs => %s),"
        " now() + make_interval(secs => %s)) RETURNING id",
        queue_name,
        n,
        attempt,
        max_attempts,
        attempt,
        heartbeat_age,
        heartbeat_age,
        deadline_in,
    )


def park(conn: Conn, *, timeout_in: float, attempt: int = 1, max_attempts: int = 5) -> int:
    """A job parked on a callback (``waiting_external``) whose timeout is ``timeout_in``
    seconds away (negative: expired)."""
    return insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, state, attempt, max_attempts, run_lease,"
        " attempted_at, callback_id, callback_timeout_at)"
        " VALUES ('stranded', %s, 'waiting_external', %s, %s, %s, now(), %s,"
        " now() + make_interval(secs => %s)) RETURNING id",
        STRANDED_QUEUE,
        attempt,
        max_attempts,
        attempt,
        uuid.uuid4(),
        timeout_in,
    )


def rescue_entries(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry for entry in job["errors"] if "rescued" in entry]


# The three sweeps -----------------------------------------------------------------------


async def test_stale_heartbeat_is_rescued_to_retryable_with_backoff(
    client: awa.AsyncClient, conn: Conn
) -> None:
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    fresh = strand(conn, heartbeat_age=0.0)  # a live attempt: must be left alone
    stale = strand(conn, attempt=2, max_attempts=5)
    await start(client, **RESCUE)

    rescued = await wait_for_state(conn, stale, "retryable")
    [entry] = rescue_entries(rescued)
    assert entry["rescued"] == "stale_heartbeat"
    assert "heartbeat stale" in entry["error"]
    assert entry["attempt"] == 2  # the attempt counts
    assert rescued["attempt"] == 2
    assert rescued["heartbeat_at"] is None
    assert rescued["deadline_at"] is None
    # Backoff after attempt 2: 2**2 s plus up to 25 % jitter.
    delay = seconds(rescued["run_at"] - rescued["finalized_at"])
    assert 4.0 <= delay <= 5.0 + 0.1, delay

    [event] = await recorder.wait(awa.Rescued, stale)
    assert event.reason is RescueReason.STALE_HEARTBEAT
    assert event.reason == "stale_heartbeat"
    assert event.job.state is awa.JobState.RETRYABLE
    assert event.job.attempt == 2
    assert event.args == {"n": 0}
    await client.shutdown()
    assert row(conn, fresh)["state"] == "running"
    assert recorder.of(awa.Rescued, fresh) == []


async def test_rescue_on_the_last_attempt_fails_the_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    last = strand(conn, attempt=3, max_attempts=3)
    await start(client, **RESCUE)

    failed = await wait_for_state(conn, last, "failed")
    assert failed["attempt"] == 3
    assert failed["finalized_at"] is not None
    [entry] = rescue_entries(failed)
    assert entry["rescued"] == "stale_heartbeat"
    assert entry["attempt"] == 3
    # The Rescued event still fires; its row shows failed. Rescue emits no Exhausted.
    [event] = await recorder.wait(awa.Rescued, last)
    assert event.job.state is awa.JobState.FAILED
    await hooks_idle(client)
    assert recorder.names(last) == ["Rescued"]
    await client.shutdown()


async def test_deadline_exceeded_is_rescued(client: awa.AsyncClient, conn: Conn) -> None:
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    # A heartbeat that is still fresh: only the deadline sweep may take it.
    overdue = strand(conn, heartbeat_age=0.0, deadline_in=-1.0)
    await start(client, **{**RESCUE, "heartbeat_staleness": 3600.0})

    rescued = await wait_for_state(conn, overdue, "retryable")
    [entry] = rescue_entries(rescued)
    assert entry["rescued"] == "deadline_exceeded"
    assert "deadline exceeded" in entry["error"]
    assert entry["attempt"] == 1
    [event] = await recorder.wait(awa.Rescued, overdue)
    assert event.reason is RescueReason.DEADLINE_EXCEEDED
    await client.shutdown()


async def test_expired_callback_is_rescued(client: awa.AsyncClient, conn: Conn) -> None:
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    waiting = park(conn, timeout_in=3600.0)
    expired = park(conn, timeout_in=-1.0)
    exhausted = park(conn, timeout_in=-1.0, attempt=2, max_attempts=2)
    await start(client, **RESCUE)

    rescued = await wait_for_state(conn, expired, "retryable")
    [entry] = rescue_entries(rescued)
    assert entry["rescued"] == "expired_callback"
    assert "callback timed out" in entry["error"]
    assert rescued["callback_id"] is None
    assert rescued["callback_timeout_at"] is None
    failed = await wait_for_state(conn, exhausted, "failed")
    assert rescue_entries(failed)[0]["rescued"] == "expired_callback"
    events = await recorder.wait(awa.Rescued, count=2)
    assert {event.reason for event in events} == {RescueReason.EXPIRED_CALLBACK}
    await client.shutdown()
    assert row(conn, waiting)["state"] == "waiting_external"


async def test_deadline_rescue_cancels_the_handler_in_another_process(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """The rescue announces the attempt on awa_cancel: a handler running it in a runtime
    that is not the leader sees ``job.is_cancelled()`` too."""
    saw_cancel = asyncio.Event()

    @client.task(Idle, queue="leader-only")
    async def idle(job: awa.Job[Idle]) -> None:
        pass

    # The leader works another queue only: the job can run in the second runtime alone.
    await start(client, queue("leader-only"), **{**RESCUE, "heartbeat_staleness": 3600.0})
    leader = client.runtime
    assert leader is not None
    await wait_for(lambda: leader.is_leader, 5)
    async with second_client(database_url) as other:

        @other.task(Stranded)
        async def handle(job: awa.Job[Stranded]) -> None:
            if job.attempt > 1:
                return
            async with asyncio.timeout(10):
                while not job.is_cancelled():
                    await asyncio.sleep(0.01)
            saw_cancel.set()

        await start(
            other, queue(deadline_duration=0.3), **{**RESCUE, "heartbeat_staleness": 3600.0}
        )
        assert other.runtime is not None
        assert not other.runtime.is_leader
        job = await other.insert(Stranded(), max_attempts=2)
        final = await wait_for_state(conn, job.id, "completed", timeout=15)
        await other.shutdown()
    await client.shutdown()
    assert saw_cancel.is_set()
    assert final["attempt"] == 2
    [entry] = rescue_entries(final)
    assert entry["rescued"] == "deadline_exceeded"


async def test_deadline_rescue_cancels_the_handler_in_the_leaders_process(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The handler of a rescued attempt running in the leader's own process sees
    ``job.is_cancelled()``; the job then runs again and completes."""
    saw_cancel: list[tuple[int, float]] = []

    @client.task(Stranded)
    async def handle(job: awa.Job[Stranded]) -> None:
        if job.attempt > 1:
            return
        started = time.monotonic()
        while not job.is_cancelled() and time.monotonic() - started < 10:
            await asyncio.sleep(0.01)
        saw_cancel.append((job.attempt, time.monotonic() - started))

    await start(client, queue(deadline_duration=0.3), **{**RESCUE, "heartbeat_staleness": 3600.0})
    job = await client.insert(Stranded(), max_attempts=2)
    final = await wait_for_state(conn, job.id, "completed", timeout=10)
    await client.shutdown()
    assert len(saw_cancel) == 1
    attempt, waited = saw_cancel[0]
    assert attempt == 1
    assert waited < 5, f"the handler saw the cancellation only after {waited:.1f}s"
    assert final["attempt"] == 2
    [entry] = rescue_entries(final)
    assert entry["rescued"] == "deadline_exceeded"


async def test_a_handler_that_always_hangs_ends_failed(client: awa.AsyncClient, conn: Conn) -> None:
    """A poison job that hangs past its deadline on every attempt (ignoring cancellation)
    is failed after max_attempts instead of looping forever."""
    attempts: list[int] = []

    @client.task(Stranded)
    async def handle(job: awa.Job[Stranded]) -> None:
        attempts.append(job.attempt)
        await asyncio.Event().wait()  # hangs for good, ignoring is_cancelled()

    await start(client, queue(deadline_duration=0.2), **{**RESCUE, "heartbeat_staleness": 3600.0})
    job = await client.insert(Stranded(), max_attempts=2)
    failed = await wait_for_state(conn, job.id, "failed", timeout=15)
    await client.shutdown(timeout=0.1)
    assert attempts == [1, 2]
    assert failed["attempt"] == 2
    assert [entry["rescued"] for entry in rescue_entries(failed)] == ["deadline_exceeded"] * 2


# Follow-ups -----------------------------------------------------------------------------


async def test_rescued_follow_ups_run_after_the_rescue_commits(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    idle_worker(client)
    seen: list[tuple[str, str, str]] = []

    def note(args: Stranded, job: awa.JobRow, reason: RescueReason) -> RescueNote:
        # What another connection sees now: the rescue has committed already.
        with psycopg.connect(database_url, autocommit=True) as other:
            state = other.execute(
                "SELECT state::text FROM awa.jobs WHERE id = %s", (job.id,)
            ).fetchone()
        assert state is not None
        seen.append((state[0], job.state.value, reason))
        return RescueNote(job.id, str(reason))

    client.on_rescued_enqueue(Stranded, note)
    client.on_rescued_enqueue_with(
        Stranded,
        lambda args, job, reason: (
            awa.EnqueueRequest(RescueNote(job.id, "with")).queue("notes").priority(1)
            if args.n == 1
            else None
        ),
    )
    stale = strand(conn, n=1)
    overdue = strand(conn, heartbeat_age=0.0, deadline_in=-1.0, n=2)
    await start(client, **RESCUE)

    await wait_for(lambda: len(jobs_of_kind(conn, "rescue_note")) == 3, 5)
    await client.shutdown()
    assert sorted(seen) == [
        ("retryable", "retryable", "deadline_exceeded"),
        ("retryable", "retryable", "stale_heartbeat"),
    ]
    notes = {
        (n["args"]["rescued_job_id"], n["args"]["reason"]): n
        for n in jobs_of_kind(conn, "rescue_note")
    }
    assert set(notes) == {
        (stale, "stale_heartbeat"),
        (overdue, "deadline_exceeded"),
        (stale, "with"),
    }
    assert notes[stale, "with"]["queue"] == "notes"
    assert notes[stale, "with"]["priority"] == 1
    # The follow-up's transaction started after the rescue's had committed.
    for (job_id, _), note_row in notes.items():
        finalized = row(conn, job_id)["finalized_at"]
        created = conn.execute(
            "SELECT created_at FROM awa.jobs WHERE id = %s", (note_row["id"],)
        ).fetchone()
        assert created is not None
        assert created[0] > finalized


async def test_a_failing_rescue_follow_up_is_logged_and_the_rescue_stands(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)

    def broken(args: Stranded, job: awa.JobRow, reason: RescueReason) -> RescueNote:
        raise RuntimeError("follow-up exploded")

    client.on_rescued_enqueue(Stranded, broken)
    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "stranded"})
    stale = strand(conn)
    with caplog.at_level(logging.ERROR, logger="awa.worker"):
        await start(client, **RESCUE)
        await wait_for_state(conn, stale, "retryable")
        # The hook still fires, after the follow-up failed.
        await recorder.wait(awa.Rescued, stale)
        await wait_for(lambda: failures.delta() == 1, 5)
    await client.shutdown()
    assert row(conn, stale)["state"] == "retryable"
    assert jobs_of_kind(conn, "rescue_note") == []
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        f"job {stale}" in text and "follow-up exploded" in text and "rescue stands" in text
        for text in messages
    ), messages


# Unique keys ----------------------------------------------------------------------------

PENDING_ONLY = awa.UniqueOpts(states=frozenset({"scheduled", "available", "retryable"}))


async def test_a_rescue_that_would_collide_with_a_newer_duplicate_is_cancelled(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """semantics.md §8.6 case 1: the stranded job A would re-enter its unique mask as
    retryable while a newer duplicate B holds the key. A is cancelled ("rescued as
    duplicate"), B keeps the key, and the other rescue of the same sweep (C) proceeds."""
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    duplicates = Counters.capture(
        "awa.maintenance.rescues", **{"awa.rescue.kind": "heartbeat_duplicate_cancelled"}
    )
    a = await client.insert(Stranded(7), queue=STRANDED_QUEUE, unique_opts=PENDING_ONLY)
    # A is claimed (running is outside its mask, which frees the key) and its worker dies.
    conn.execute(
        "UPDATE awa.jobs SET state = 'running', attempt = 1, run_lease = 1,"
        " heartbeat_at = now() - interval '1 hour' WHERE id = %s",
        (a.id,),
    )
    b = await client.insert(Stranded(7), queue=STRANDED_QUEUE, unique_opts=PENDING_ONLY)
    assert b.unique_key == a.unique_key
    c = strand(conn, n=8)
    await start(client, **RESCUE)

    cancelled = await wait_for_state(conn, a.id, "cancelled")
    assert "rescued as duplicate" in cancelled["errors"][-1]["error"]
    assert cancelled["finalized_at"] is not None
    assert (await wait_for_state(conn, c, "retryable"))["attempt"] == 1
    holders = conn.execute(
        "SELECT id, state::text FROM awa.jobs"
        " WHERE unique_key = %s AND awa.unique_key_held(unique_states, state)",
        (a.unique_key,),
    ).fetchall()
    assert holders == [(b.id, "available")]
    [event] = await recorder.wait(awa.Cancelled, a.id)
    assert "rescued as duplicate" in event.reason
    await recorder.wait(awa.Rescued, c)
    await client.shutdown()
    assert duplicates.delta() == 1
    assert recorder.of(awa.Rescued, a.id) == []
    # Sweeps after that find nothing more to do with A.
    assert row(conn, a.id)["state"] == "cancelled"


# Bounded sweeps -------------------------------------------------------------------------


def strand_many(conn: Conn, count: int) -> None:
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, state, attempt, run_lease, attempted_at,"
        " heartbeat_at) SELECT 'stranded', %s, 'running', 1, 1, now() - interval '1 hour',"
        " now() - interval '1 hour' FROM generate_series(1, %s)",
        (STRANDED_QUEUE, count),
    )


async def test_each_bounded_sweep_makes_progress(database_url: str, conn: Conn) -> None:
    """C4: 1,500 stale jobs and a batch of 500: each sweep rescues 500 others, so three
    sweeps drain them and the fourth finds none; no job is rescued twice."""
    strand_many(conn, 1500)
    sweep = SWEEPS[RescueReason.STALE_HEARTBEAT]
    seen: set[int] = set()
    sizes = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as leader:
        for _ in range(4):
            rescued = await rescue(leader, sweep, staleness=60.0, limit=500)
            ids = {item.row.id for item in rescued}
            assert not ids & seen
            seen |= ids
            sizes.append(len(rescued))
    assert sizes == [500, 500, 500, 0]
    assert count_jobs(conn, "state = 'retryable'") == 1500
    once = count_jobs(
        conn, "jsonb_array_length(errors) = 1 AND errors -> 0 ->> 'rescued' = 'stale_heartbeat'"
    )
    assert once == 1500


async def test_the_runtime_drains_an_overload_in_bounded_sweeps(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    idle_worker(client)
    strand_many(conn, 1500)

    def sweeps() -> list[str]:
        return [
            record.getMessage()
            for record in caplog.records
            if record.getMessage().startswith("rescued ")
            and "heartbeat stale" in record.getMessage()
        ]

    with caplog.at_level(logging.WARNING, logger="awa.maintenance"):
        await start(client, **{**RESCUE, "rescue_batch_size": 500})
        await wait_for_all(conn, "retryable", 1500, timeout=10)
        # A sweep logs after its statement returns, a moment after its rows are visible.
        await wait_for(lambda: len(sweeps()) >= 3, 5)
        await client.shutdown()
    assert [text.split()[1] for text in sweeps()] == ["500", "500", "500"]
    assert count_jobs(conn, "jsonb_array_length(errors) = 1") == 1500


# Liveness -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_blocking_rescued_hook_does_not_stop_later_rescues(
    client: awa.AsyncClient, conn: Conn, flavour: str
) -> None:
    idle_worker(client)
    release = threading.Event()
    entered: list[int] = []

    async def block_async(event: awa.JobEvent[Any]) -> None:
        entered.append(event.job.id)
        while not release.is_set():
            await asyncio.sleep(0.01)

    def block_sync(event: awa.JobEvent[Any]) -> None:
        entered.append(event.job.id)
        release.wait(30)

    client.on_event_kind("stranded", block_async if flavour == "async" else block_sync)
    first = strand(conn)
    await start(client, **RESCUE)
    try:
        await wait_for(lambda: entered == [first], 5)
        second = strand(conn)
        await wait_for_state(conn, second, "retryable")
        await wait_for(lambda: entered == [first, second], 5)
        # Promotion (another duty of the same leader) goes on too.
        soon = await client.insert(Idle(), run_at=db_now(conn))
        await wait_for_state(conn, soon.id, "completed")
    finally:
        release.set()
    await client.shutdown()


async def test_a_blocking_rescued_follow_up_does_not_stop_later_rescues(
    client: awa.AsyncClient, conn: Conn
) -> None:
    idle_worker(client)
    release = asyncio.Event()
    entered: list[int] = []

    async def block(args: Stranded, job: awa.JobRow, reason: RescueReason) -> RescueNote:
        entered.append(job.id)
        if len(entered) == 1:
            await release.wait()
        return RescueNote(job.id, str(reason))

    client.on_rescued_enqueue(Stranded, block)
    first = strand(conn)
    await start(client, **RESCUE)
    try:
        await wait_for(lambda: entered == [first], 5)
        second = strand(conn)
        await wait_for_state(conn, second, "retryable")
        await wait_for(lambda: len(jobs_of_kind(conn, "rescue_note")) == 1, 5)
        soon = await client.insert(Idle(), run_at=db_now(conn))
        await wait_for_state(conn, soon.id, "completed")
    finally:
        release.set()
    await wait_for(lambda: len(jobs_of_kind(conn, "rescue_note")) == 2, 5)
    await client.shutdown()


async def test_a_rescued_follow_up_that_never_finishes_times_out(
    client: awa.AsyncClient,
    conn: Conn,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rescue_module, "RESCUE_FOLLOW_UP_TIMEOUT", 0.3)
    idle_worker(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)

    async def forever(args: Stranded, job: awa.JobRow, reason: RescueReason) -> RescueNote:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    client.on_rescued_enqueue(Stranded, forever)
    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "stranded"})
    stale = strand(conn)
    with caplog.at_level(logging.ERROR, logger="awa.worker"):
        await start(client, **RESCUE)
        await recorder.wait(awa.Rescued, stale)
    await client.shutdown()
    assert failures.delta() == 1
    assert any("not done within 0.3s" in record.getMessage() for record in caplog.records)
    assert row(conn, stale)["state"] == "retryable"
