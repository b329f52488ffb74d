"""Lifecycle hooks (issue "Lifecycle hooks"): every worker outcome and the event it fires.

Semantics (seed lifecycle-hooks.md, DESIGN §2 and §4.6, semantics.md §7.2-7.3 and §8.1):
events are frozen dataclasses carrying the committed post-transition row (``job``) and the
args (typed for ``on_event``, the JSON for ``on_event_kind``); hooks run after the commit,
in registration order per kind, never hold a worker slot, are not awaited by shutdown, and
a hook that raises is logged without stopping the next one. Snooze and stale outcomes fire
no outcome event. Callback and rescue events belong to other issues.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any

import pytest

import awa
from helpers_lifecycle import Recorder, hooks_idle
from helpers_worker import (
    no_longer_in_flight,
    queue,
    row,
    second_client,
    start,
    wait_for,
    wait_for_all,
    wait_for_state,
)
from jobs_helpers import Conn


@dataclasses.dataclass
class Work:
    value: int = 0


@dataclasses.dataclass
class Strict:
    """Args with a required field, to make rows that no longer decode."""

    value: int
    label: str


@dataclasses.dataclass
class Other:
    pass


OUTCOME_EVENTS = (awa.Completed, awa.Retried, awa.Exhausted, awa.Cancelled)


def outcome_names(recorder: Recorder, job_id: int) -> list[str]:
    return [
        type(event).__name__
        for event in recorder.events
        if isinstance(event, OUTCOME_EVENTS) and event.job.id == job_id
    ]


def assert_row_matches(event: awa.JobEvent[Any], db: dict[str, Any]) -> None:
    """The event's row is the committed row: the columns a transition writes agree."""
    job = event.job
    assert isinstance(job, awa.JobRow)
    for name in (
        "id",
        "kind",
        "queue",
        "args",
        "priority",
        "attempt",
        "max_attempts",
        "run_lease",
        "run_at",
        "errors",
        "metadata",
        "tags",
        "finalized_at",
        "heartbeat_at",
        "deadline_at",
        "progress",
    ):
        assert getattr(job, name) == db[name], (
            f"{name}: event {getattr(job, name)!r} != {db[name]!r}"
        )
    assert job.state == awa.JobState(db["state"])


# §8.1 worker outcomes ----------------------------------------------------------------------


async def test_typed_completed_event(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.1: Completed with typed args, the inserted id, state completed; row completed."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work(value=7))
    await start(client)
    [event] = await recorder.wait(awa.Completed, job.id)
    db = await wait_for_state(conn, job.id, "completed")
    assert event.args == Work(value=7)
    assert event.job.id == job.id
    assert event.job.state is awa.JobState.COMPLETED
    assert event.job.finalized_at is not None
    assert_row_matches(event, db)


async def test_typed_started_event(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.2: Started with state running and typed args."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work(value=3))
    await start(client)
    [event] = await recorder.wait(awa.Started, job.id)
    assert event.job.state is awa.JobState.RUNNING
    assert event.job.attempt == 1
    assert event.job.run_lease == 1
    assert event.job.finalized_at is None
    assert event.args == Work(value=3)
    await wait_for_state(conn, job.id, "completed")


async def test_typed_retried_event(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.3: a retryable error with attempts left -> Retried (retryable, attempt 1, the
    error text, next_run_at later than the insert and equal to the row's run_at, the error
    in job.errors, finalized_at set)."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        raise RuntimeError(f"retry {job.args.value}")

    inserted = await client.insert(Work(value=5), max_attempts=3)
    await start(client)
    [event] = await recorder.wait(awa.Retried, inserted.id)
    db = await wait_for_state(conn, inserted.id, "retryable")
    assert event.job.state is awa.JobState.RETRYABLE
    assert event.attempt == 1
    assert "retry 5" in event.error
    assert event.error.startswith("RuntimeError: retry 5")
    assert event.next_run_at > inserted.run_at
    assert event.next_run_at == db["run_at"]
    assert event.job.run_at == db["run_at"]
    assert [entry["error"] for entry in event.job.errors] == [event.error]
    assert event.job.finalized_at is not None
    assert event.args == Work(value=5)
    assert_row_matches(event, db)


async def test_typed_exhausted_event(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.4: a retryable error on the only attempt -> Exhausted (failed, attempt 1)."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        raise ValueError("boom 9")

    job = await client.insert(Work(value=9), max_attempts=1)
    await start(client)
    [event] = await recorder.wait(awa.Exhausted, job.id)
    db = await wait_for_state(conn, job.id, "failed")
    assert event.job.state is awa.JobState.FAILED
    assert event.attempt == 1
    assert "boom 9" in event.error
    assert_row_matches(event, db)
    await hooks_idle(client)
    assert outcome_names(recorder, job.id) == ["Exhausted"]


async def test_retry_after_on_final_attempt_exhausts(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.5: RetryAfter on every attempt, max_attempts 2 -> Retried (error '') after the
    first, Exhausted ('max_attempts exhausted', attempt 2) after the second, two runs."""
    recorder = Recorder()
    client.on_event(Work, recorder)
    runs = 0

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.RetryAfter:
        nonlocal runs
        runs += 1
        return awa.RetryAfter(0.05)

    job = await client.insert(Work(), max_attempts=2)
    await start(client)
    [exhausted] = await recorder.wait(awa.Exhausted, job.id)
    db = await wait_for_state(conn, job.id, "failed")
    await client.shutdown()  # waits for the slots: no attempt can still be on its way
    [retried] = recorder.of(awa.Retried, job.id)
    assert retried.error == ""
    assert retried.attempt == 1
    assert retried.job.state is awa.JobState.RETRYABLE
    assert exhausted.job.state is awa.JobState.FAILED
    assert exhausted.attempt == 2
    assert "max_attempts exhausted" in exhausted.error
    assert db["attempt"] == 2
    assert runs == 2
    assert_row_matches(exhausted, db)


async def test_retry_after_below_bound_still_retries(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.7: RetryAfter on attempt 1, success on attempt 2 -> Retried, then Completed
    with job.attempt 2."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.RetryAfter | None:
        return awa.RetryAfter(0.05) if job.attempt == 1 else None

    job = await client.insert(Work(), max_attempts=3)
    await start(client)
    [completed] = await recorder.wait(awa.Completed, job.id)
    db = await wait_for_state(conn, job.id, "completed")
    await hooks_idle(client)
    assert outcome_names(recorder, job.id) == ["Retried", "Completed"]
    [retried] = recorder.of(awa.Retried, job.id)
    assert retried.error == ""  # RetryAfter with attempts left records no error
    assert retried.job.errors == []
    assert completed.job.attempt == 2
    assert db["attempt"] == 2
    assert_row_matches(completed, db)


async def test_typed_cancelled_event(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.8: Cancel(reason) -> Cancelled with the reason and state cancelled."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.Cancel:
        return awa.Cancel(f"cancel {job.args.value}")

    job = await client.insert(Work(value=4))
    await start(client)
    [event] = await recorder.wait(awa.Cancelled, job.id)
    db = await wait_for_state(conn, job.id, "cancelled")
    assert event.reason == "cancel 4"
    assert event.job.state is awa.JobState.CANCELLED
    assert_row_matches(event, db)


async def test_untyped_hooks_stack_for_dict_handlers(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.9: a handler registered by kind with dict args, two on_event_kind hooks -> both
    get Completed with the same id; event.args is the JSON dict."""
    first, second = Recorder(), Recorder()
    client.on_event_kind("raw_work", first)
    client.on_event_kind("raw_work", second)

    @client.task(None, kind="raw_work")
    async def handle(job: awa.Job[dict[str, Any]]) -> None:
        assert job.args == {"n": 1, "nested": {"a": [1, 2]}}

    job = await client.insert({"n": 1, "nested": {"a": [1, 2]}}, kind="raw_work")
    await start(client)
    [a] = await first.wait(awa.Completed, job.id)
    [b] = await second.wait(awa.Completed, job.id)
    assert a.job.id == b.job.id == job.id
    assert a.job.state is b.job.state is awa.JobState.COMPLETED
    assert a.args == {"n": 1, "nested": {"a": [1, 2]}}
    assert isinstance(a.args, dict)
    await wait_for_state(conn, job.id, "completed")


async def test_raising_hook_is_logged_and_next_hook_runs(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """§8.1.10: the first hook raises on Completed -> logged with job id and kind; the
    second hook still receives the event; the job is completed."""
    caplog.set_level(logging.ERROR, logger="awa.hooks")
    after = Recorder()

    @client.on_event(Work)
    async def explode(event: awa.JobEvent[Work]) -> None:
        if isinstance(event, awa.Completed):
            raise RuntimeError("hook exploded")

    client.on_event(Work, after)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await after.wait(awa.Completed, job.id)
    await wait_for_state(conn, job.id, "completed")
    await hooks_idle(client)
    [record] = [r for r in caplog.records if r.name == "awa.hooks"]
    message = record.getMessage()
    assert f"job {job.id}" in message
    assert "kind work" in message
    assert "Completed" in message
    assert record.exc_info is not None
    assert "hook exploded" in str(record.exc_info[1])


class HookCrash(BaseException):
    """A BaseException that is not an Exception."""


@pytest.mark.parametrize("raised", [HookCrash("base crash"), asyncio.CancelledError("own")])
async def test_hook_raising_a_base_exception_is_logged_and_next_hook_runs(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture, raised: BaseException
) -> None:
    """Not only Exception: a hook raising a BaseException subclass, or a CancelledError of
    its own (nobody cancelled it), is logged like any failing hook and later hooks run."""
    caplog.set_level(logging.ERROR, logger="awa.hooks")
    after = Recorder()

    @client.on_event(Work)
    async def explode(event: awa.JobEvent[Work]) -> None:
        raise raised

    client.on_event(Work, after)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await after.wait(awa.Completed, job.id)
    await hooks_idle(client)
    assert sorted(after.names(job.id)) == ["Completed", "Started"]
    messages = [r.getMessage() for r in caplog.records if r.name == "awa.hooks"]
    assert len(messages) == 2, messages
    assert all(f"job {job.id} (kind work)" in text for text in messages)


async def test_no_hooks_still_completes(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.11: no hooks registered -> the job completes normally."""

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "completed")
    assert client.hook_dispatcher.pending() == 0


@pytest.mark.parametrize("outcome", ["complete", "raise", "cancel"])
async def test_stale_outcome_fires_no_event(
    client: awa.AsyncClient, database_url: str, conn: Conn, outcome: str
) -> None:
    """§8.1.12 (translated): while the first attempt runs, SQL moves its row away (back to
    available, as a rescue would) and a second runtime re-claims and completes it. The first
    handler then finishes: its write is stale, so it fires no outcome event (Started did
    fire). Covers the batched completion and per-job outcome statements."""
    recorder = Recorder()
    client.on_event(Work, recorder)
    release = threading.Event()

    @client.task(Work)
    async def slow(job: awa.Job[Work]) -> awa.Cancel | None:
        await asyncio.to_thread(release.wait, 10)
        if outcome == "raise":
            raise RuntimeError("late failure")
        return awa.Cancel("late cancel") if outcome == "cancel" else None

    job = await client.insert(Work(), max_attempts=3)
    await start(client, queue(max_workers=1, prefetch=0))
    await recorder.wait(awa.Started, job.id)
    conn.execute(
        "UPDATE awa.jobs SET state = 'available', heartbeat_at = NULL, deadline_at = NULL"
        " WHERE id = %s",
        (job.id,),
    )
    other_recorder = Recorder()
    async with second_client(database_url) as other:
        other.on_event(Work, other_recorder)

        @other.task(Work)
        async def quick(job: awa.Job[Work]) -> None:
            return None

        await start(other)
        db = await wait_for_state(conn, job.id, "completed")
        assert db["run_lease"] == 2
        [theirs] = await other_recorder.wait(awa.Completed, job.id)
        assert theirs.job.run_lease == 2
        await other.shutdown()
    release.set()
    await no_longer_in_flight(client, job.id)
    await hooks_idle(client)
    assert [e.job.run_lease for e in recorder.of(awa.Started, job.id)] == [1]
    assert outcome_names(recorder, job.id) == []
    final = row(conn, job.id)
    assert final["state"] == "completed"
    assert final["errors"] == []


async def test_terminal_error_emits_exhausted(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.13: TerminalError with attempts left -> Exhausted (attempt 1) and nothing else."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        raise awa.TerminalError("permanent failure")

    job = await client.insert(Work(), max_attempts=5)
    await start(client)
    [event] = await recorder.wait(awa.Exhausted, job.id)
    db = await wait_for_state(conn, job.id, "failed")
    await hooks_idle(client)
    assert "permanent failure" in event.error
    assert event.attempt == 1
    assert event.job.errors[-1]["terminal"] is True
    assert outcome_names(recorder, job.id) == ["Exhausted"]
    assert sorted(recorder.names(job.id)) == ["Exhausted", "Started"]
    assert_row_matches(event, db)


async def test_snooze_only_emits_started(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.1.14: Snooze -> Started only; no outcome event once the snooze has committed."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.Snooze:
        return awa.Snooze(3600)

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "scheduled")
    await no_longer_in_flight(client, job.id)
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started"]


# Registration ------------------------------------------------------------------------------


async def test_on_event_as_decorator_and_plain_call(client: awa.AsyncClient, conn: Conn) -> None:
    seen: list[str] = []

    @client.on_event(Work)
    async def decorated(event: awa.JobEvent[Work]) -> None:
        if isinstance(event, awa.Completed):
            seen.append("decorated")

    async def plain(event: awa.JobEvent[Work]) -> None:
        if isinstance(event, awa.Completed):
            seen.append("plain")

    assert client.on_event(Work, plain) is plain
    assert decorated.__name__ == "decorated"  # the decorator returns the function

    @client.on_event_kind("work")
    def kind_decorated(event: awa.JobEvent[Any]) -> None:
        if isinstance(event, awa.Completed):
            seen.append("kind")

    assert kind_decorated.__name__ == "kind_decorated"

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "completed")
    await wait_for(lambda: len(seen) == 3)
    assert seen == ["decorated", "plain", "kind"]


async def test_sync_and_async_hooks_run_in_registration_order(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Several hooks per kind, mixing def and async def, run one after another in the order
    they were registered, for every event; def hooks run off the event loop."""
    order: list[tuple[str, str]] = []
    loop_thread = threading.get_ident()
    sync_threads: list[int] = []

    async def first(event: awa.JobEvent[Work]) -> None:
        await asyncio.sleep(0.05)  # a slow first hook must still finish before the second
        order.append(("first", type(event).__name__))

    def second(event: awa.JobEvent[Work]) -> None:
        sync_threads.append(threading.get_ident())
        time.sleep(0.02)
        order.append(("second", type(event).__name__))

    async def third(event: awa.JobEvent[Any]) -> None:
        order.append(("third", type(event).__name__))

    client.on_event(Work, first)
    client.on_event(Work, second)
    client.on_event_kind("work", third)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "completed")
    await wait_for(lambda: len(order) == 6)
    for name in ("Started", "Completed"):
        assert [hook for hook, event in order if event == name] == ["first", "second", "third"]
    assert sync_threads
    assert all(ident != loop_thread for ident in sync_threads)


async def test_typed_hook_skips_rows_whose_args_do_not_decode(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose args miss a required field of the hook's type: the typed hook is skipped
    with a warning naming the job, while an on_event_kind hook still gets the event."""
    caplog.set_level(logging.WARNING, logger="awa.hooks")
    typed, untyped = Recorder(), Recorder()
    client.on_event(Strict, typed)
    client.on_event_kind("strict", untyped)

    @client.task(None, kind="strict")
    async def handle(job: awa.Job[dict[str, Any]]) -> None:
        return None

    [(bad_id,)] = conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args) VALUES ('strict', 'default', %s) RETURNING id",
        ('{"value": 1}',),
    ).fetchall()
    good = await client.insert(Strict(value=2, label="ok"))
    await start(client)
    await wait_for_state(conn, bad_id, "completed")
    await wait_for_state(conn, good.id, "completed")
    await untyped.wait(awa.Completed, bad_id)
    await typed.wait(awa.Completed, good.id)
    await hooks_idle(client)
    assert typed.of(awa.JobEvent, bad_id) == []
    assert [type(e).__name__ for e in untyped.of(awa.JobEvent, bad_id)] == [
        "Started",
        "Completed",
    ]
    assert untyped.of(awa.Completed, bad_id)[0].args == {"value": 1}
    assert typed.of(awa.Completed, good.id)[0].args == Strict(value=2, label="ok")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # Started and Completed each skip the typed hook
    assert all(f"job {bad_id}" in text and "Strict" in text for text in warnings)


async def test_started_for_each_claimed_job(client: awa.AsyncClient, conn: Conn) -> None:
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    jobs = await client.insert_many([Work(value=n) for n in range(50)])
    await start(client, queue(max_workers=8))
    await wait_for_all(conn, "completed", 50)
    started = await recorder.wait(awa.Started, count=50)
    completed = await recorder.wait(awa.Completed, count=50)
    assert sorted(e.job.id for e in started) == sorted(job.id for job in jobs)
    assert sorted(e.job.id for e in completed) == sorted(job.id for job in jobs)
    assert {e.args.value for e in started} == set(range(50))
    await hooks_idle(client)
    assert len(recorder.events) == 100


async def test_hooks_of_another_kind_are_not_called(client: awa.AsyncClient, conn: Conn) -> None:
    """A kind without hooks builds no events: hooks registered for another kind never see
    its jobs (and the runtime does not want events for it)."""
    other = Recorder()
    client.on_event(Other, other)
    client.on_event_kind("work_unrelated", other)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    @client.task(Other)
    async def handle_other(job: awa.Job[Other]) -> None:
        return None

    jobs = await client.insert_many([Work(value=n) for n in range(10)])
    marker = await client.insert(Other())
    await start(client)
    await wait_for_all(conn, "completed", 11)
    await other.wait(awa.Completed, marker.id)
    await hooks_idle(client)
    assert not client.hook_dispatcher.wants("work")
    assert {e.job.id for e in other.events} == {marker.id}
    assert all(e.job.kind == "other" for e in other.events)
    assert len(jobs) == 10


# Event objects -----------------------------------------------------------------------------


async def test_events_are_frozen_and_match(client: awa.AsyncClient, conn: Conn) -> None:
    """Events are frozen dataclasses subclassing awa.JobEvent, usable with ``match``;
    Completed.duration is a timedelta at least as long as the handler ran."""
    seen: list[str] = []
    events: list[awa.JobEvent[Work]] = []

    @client.on_event(Work)
    async def hook(event: awa.JobEvent[Work]) -> None:
        events.append(event)
        match event:
            case awa.Started(job=job, args=Work(value=v)):
                seen.append(f"started {job.state} {v}")
            case awa.Completed(duration=duration, output=output):
                seen.append(f"completed {duration >= dt.timedelta(seconds=0.2)} {output}")
            case awa.Retried(error=error, attempt=attempt, next_run_at=when):
                seen.append(f"retried {attempt} {when is not None} {error}")
            case awa.Exhausted(error=error, attempt=attempt):
                seen.append(f"exhausted {attempt}")
            case awa.Cancelled(reason=reason):
                seen.append(f"cancelled {reason}")
            case awa.JobEvent():
                seen.append("other")

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        await asyncio.sleep(0.2)

    job = await client.insert(Work(value=1))
    await start(client)
    await wait_for_state(conn, job.id, "completed")
    await wait_for(lambda: len(seen) == 2)
    assert sorted(seen) == ["completed True None", "started running 1"]
    completed = next(e for e in events if isinstance(e, awa.Completed))
    assert isinstance(completed, awa.JobEvent)
    assert isinstance(completed.duration, dt.timedelta)
    assert completed.duration >= dt.timedelta(seconds=0.2)
    assert dataclasses.is_dataclass(completed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        completed.duration = dt.timedelta(0)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        completed.job = completed.job  # type: ignore[misc]
    fields = [field.name for field in dataclasses.fields(awa.Retried)]
    assert fields == ["job", "args", "error", "attempt", "next_run_at"]
    assert [f.name for f in dataclasses.fields(awa.Exhausted)] == [
        "job",
        "args",
        "error",
        "attempt",
    ]
    assert [f.name for f in dataclasses.fields(awa.Cancelled)] == ["job", "args", "reason"]
    assert [f.name for f in dataclasses.fields(awa.Completed)] == [
        "job",
        "args",
        "duration",
        "output",
    ]
    for cls in (awa.Started, awa.WaitingForCallback, awa.Completed, awa.Retried):
        assert issubclass(cls, awa.JobEvent)


async def test_sync_handler_events(client: awa.AsyncClient, conn: Conn) -> None:
    """A plain def handler fires the same events as an async one."""
    recorder = Recorder()
    client.on_event(Work, recorder)

    @client.task(Work)
    def handle(job: awa.Job[Work]) -> None:
        time.sleep(0.05)
        if job.attempt == 1:
            raise KeyError("first attempt")

    job = await client.insert(Work(), max_attempts=2)
    await start(client, queue(retry=awa.RetryPolicy(max_delay=0.05)))
    [completed] = await recorder.wait(awa.Completed, job.id)
    await hooks_idle(client)
    assert outcome_names(recorder, job.id) == ["Retried", "Completed"]
    assert completed.job.attempt == 2
    assert completed.duration >= dt.timedelta(seconds=0.05)
    [retried] = recorder.of(awa.Retried, job.id)
    assert "first attempt" in retried.error


SLOW_HOOK_SECONDS = 2.0


# Hooks never slow the worker ---------------------------------------------------------------


async def test_slow_hook_does_not_slow_a_drain(client: awa.AsyncClient, conn: Conn) -> None:
    """A hook that takes 2 s on every event (or until the test releases it): all 1,000 jobs
    are completed in the database before the first slow hook call has even finished (hooks
    hold no worker slot)."""
    count = 1000
    calls_started: list[float] = []
    calls_finished: list[float] = []
    release = asyncio.Event()

    @client.on_event(Work)
    async def slow(event: awa.JobEvent[Work]) -> None:
        calls_started.append(time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), SLOW_HOOK_SECONDS)
        calls_finished.append(time.monotonic())

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    await client.insert_many_copy([Work(value=n) for n in range(count)])
    await start(client, queue(max_workers=50))
    await wait_for_all(conn, "completed", count, timeout=30)
    drained_at = time.monotonic()
    assert calls_started, "no hook ran"
    assert calls_finished == [] or min(calls_finished) > drained_at, (
        f"a slow hook finished {drained_at - min(calls_finished):.2f}s before the drain did"
    )
    assert client.hook_dispatcher.pending() > 0
    release.set()


async def test_shutdown_does_not_wait_for_hooks(client: awa.AsyncClient, conn: Conn) -> None:
    """shutdown() returns while hooks still sleep; the hooks are still pending after it."""
    entered = asyncio.Event()
    finished: list[int] = []

    @client.on_event(Work)
    async def slow(event: awa.JobEvent[Work]) -> None:
        if isinstance(event, awa.Completed):
            entered.set()
            await asyncio.Event().wait()  # blocks until client.close() cancels it
            finished.append(event.job.id)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    job = await client.insert(Work())
    await start(client)
    await wait_for_state(conn, job.id, "completed")
    await asyncio.wait_for(entered.wait(), 5)
    began = time.monotonic()
    await asyncio.wait_for(client.shutdown(), 10)
    assert time.monotonic() - began < 5
    assert client.hook_dispatcher.pending() >= 1
    assert finished == []


async def test_blocked_def_hooks_do_not_block_shutdown(client: awa.AsyncClient, conn: Conn) -> None:
    """Plain def hooks that block (here until the test ends) on 100 events: shutdown still
    returns. They must not hold threads the runtime itself needs (asyncio's default
    executor, which shutdown uses)."""
    release = threading.Event()
    entered: list[int] = []

    @client.on_event(Work)
    def blocking(event: awa.JobEvent[Work]) -> None:
        entered.append(event.job.id)
        release.wait(30)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    try:
        await client.insert_many([Work(value=n) for n in range(50)])
        await start(client, queue(max_workers=10))
        await wait_for_all(conn, "completed", 50)
        await wait_for(lambda: len(entered) > 0)
        await asyncio.wait_for(client.shutdown(), 10)
        assert client.hook_dispatcher.pending() > 0
    finally:
        release.set()


async def test_registration_errors(client: awa.AsyncClient) -> None:
    """Hooks take an args class (or a kind via on_event_kind) and a callable, and are
    registered before start()."""
    with pytest.raises(TypeError, match="on_event_kind"):
        client.on_event("work", Recorder())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="callable"):
        client.on_event(Work, "not a function")  # type: ignore[call-overload]
    with pytest.raises(awa.ValidationError):
        client.on_event_kind("", Recorder())
    with pytest.raises(TypeError, match="not callable"):
        client.on_completed_enqueue(Work, 5)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        return None

    await start(client)
    with pytest.raises(awa.AwaError, match="before start"):
        client.on_event(Work, Recorder())
    with pytest.raises(awa.AwaError, match="before start"):
        client.on_completed_enqueue(Work, lambda args, job: Other())


async def test_started_only_for_attempts_whose_handler_runs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Started means the handler is about to run. Jobs claimed into the prefetch buffer and
    given back at shutdown never ran: they get no Started (and when claimed again, one
    Started for the attempt that does run)."""
    recorder = Recorder()
    client.on_event(Work, recorder)
    gate = asyncio.Event()
    ran: list[int] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        ran.append(job.id)
        if job.args.value == 1:
            await gate.wait()

    warm = await client.insert_many([Work() for _ in range(5)])  # quick jobs enable prefetch
    await start(client, queue(max_workers=1, prefetch=4))
    await wait_for_all(conn, "completed", len(warm))
    blocked = await client.insert_many([Work(value=1) for _ in range(5)])
    await wait_for(lambda: len(ran) == len(warm) + 1)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.stats()["default"]["buffered"] > 0)
    shutdown = asyncio.create_task(client.shutdown(timeout=5))

    def released() -> bool:
        return any(row(conn, job.id)["state"] == "available" for job in blocked)

    await wait_for(released)  # shutdown gave the buffered jobs back
    gate.set()
    await shutdown
    await hooks_idle(client)
    started = {event.job.id for event in recorder.of(awa.Started)}
    assert started == set(ran), f"Started for jobs that never ran: {started - set(ran)}"
