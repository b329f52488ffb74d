"""External callbacks (issue "External callbacks"): parking, resolution through the worker
client (hooks and follow-ups) and through awa.admin (neither), and waits in the handler.

Semantics: seed lifecycle-hooks.md "Callbacks" and its atomicity table, DESIGN §2,
semantics.md §6 and §8.1 cases 15-21, §8.2 cases 7 and 13-18, §8.4. Design choices of this
port: complete_external's payload becomes the job's output; fail_external fails the job
terminally; resume_external on a job parked by WaitForCallback makes it run again (attempt
given back) with the payload in ``job.callback_result``, while a handler waiting in
``job.wait_for_callback`` gets the payload back and continues.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
import uuid
from typing import Any

import psycopg
import pytest

import awa
from awa.lifecycle.followups import FollowUpError
from helpers_callbacks import (
    QUEUE,
    Payment,
    Receipt,
    callback_of,
    insert_parked,
    last_error,
    register_parking_task,
    wait_parked,
)
from helpers_lifecycle import Recorder, hooks_idle, jobs_of_kind
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

CALLBACK_COLUMNS = (
    "callback_id",
    "callback_timeout_at",
    "callback_filter",
    "callback_on_complete",
    "callback_on_fail",
    "callback_transform",
)


def payments(max_workers: int = 4, **options: Any) -> dict[str, Any]:
    return queue(QUEUE, max_workers, **options)


def assert_callback_cleared(db: dict[str, Any]) -> None:
    for name in CALLBACK_COLUMNS:
        assert db[name] is None, f"{name} still set: {db[name]!r}"


async def parked_job(
    client: awa.AsyncClient, conn: Conn, recorder: Recorder | None = None, **insert: Any
) -> tuple[awa.JobRow, str]:
    """Insert a Payment (the parking task must be registered and the worker started) and
    wait until it parks; returns the inserted row and its callback id."""
    job = await client.insert(Payment(), queue=QUEUE, **insert)
    callback_id = await wait_parked(conn, job.id)
    if recorder is not None:
        await recorder.wait(awa.WaitingForCallback, job.id)
    return job, callback_id


# Parking (§8.1.15, §8.1.20, E1) ------------------------------------------------------------


async def test_park_fires_waiting_for_callback(client: awa.AsyncClient, conn: Conn) -> None:
    """The handler registers and returns WaitForCallback -> waiting_external with the
    callback set, no heartbeat and no deadline; WaitingForCallback carries that row."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client, timeout_seconds=600)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    db = row(conn, job.id)
    assert db["heartbeat_at"] is None
    assert db["deadline_at"] is None
    assert db["attempt"] == 1
    remaining = (db["callback_timeout_at"] - db["attempted_at"]).total_seconds()
    assert 590 < remaining <= 601
    [event] = recorder.of(awa.WaitingForCallback, job.id)
    assert event.job.state is awa.JobState.WAITING_EXTERNAL
    assert event.job.callback_id == callback_id
    assert event.job.heartbeat_at is None
    assert event.args == Payment()
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started", "WaitingForCallback"]


async def test_parked_job_releases_its_slot(client: awa.AsyncClient, conn: Conn) -> None:
    """With one slot, a second job runs while the first is parked; heartbeats keep coming
    for the running one and never touch the parked row."""

    @dataclasses.dataclass
    class Slow:
        pass

    release = asyncio.Event()
    register_parking_task(client)

    @client.task(Slow, queue=QUEUE)
    async def slow(job: awa.Job[Slow]) -> None:
        await release.wait()

    await start(client, payments(max_workers=1))
    parked, _ = await parked_job(client, conn)
    # The row is parked once its commit returns; the attempt leaves the in-flight set just
    # after, in this process.
    await wait_for(lambda: parked.id not in client.runtime.inflight)  # type: ignore[union-attr]
    other = await client.insert(Slow(), queue=QUEUE)
    running = await wait_for_state(conn, other.id, "running")
    await wait_for(lambda: row(conn, other.id)["heartbeat_at"] > running["heartbeat_at"])
    db = row(conn, parked.id)
    assert db["state"] == "waiting_external"
    assert db["heartbeat_at"] is None
    assert db["deadline_at"] is None
    release.set()
    await wait_for_state(conn, other.id, "completed")


async def test_wait_for_callback_without_registration_fails_terminally(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """WaitForCallback with a token the attempt never registered -> failed at once with a
    terminal error that says what to do, and Exhausted fires."""
    recorder = Recorder()
    client.on_event(Payment, recorder)

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        return awa.WaitForCallback(awa.CallbackToken("00000000-0000-4000-8000-000000000000"))

    job = await client.insert(Payment(), queue=QUEUE, max_attempts=5)
    await start(client, payments())
    [event] = await recorder.wait(awa.Exhausted, job.id)
    db = await wait_for_state(conn, job.id, "failed")
    assert db["finalized_at"] is not None
    assert db["attempt"] == 1
    entry = last_error(conn, job.id)
    assert entry["terminal"] is True
    assert "WaitForCallback returned without a registered callback" in entry["error"]
    assert "register_callback" in entry["error"]
    assert event.error == entry["error"]
    assert event.attempt == 1
    await hooks_idle(client)
    assert "WaitingForCallback" not in recorder.names(job.id)


async def test_registering_again_makes_the_first_token_stale(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A second register_callback replaces the first: the old id is no longer found."""
    tokens: list[awa.CallbackToken] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        tokens.append(await job.register_callback())
        tokens.append(await job.register_callback())
        return awa.WaitForCallback(tokens[-1])

    await start(client, payments())
    _job, callback_id = await parked_job(client, conn)
    first, second = tokens
    assert callback_id == second.id != first.id
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(first)
    completed = await client.complete_external(second)
    assert completed.state is awa.JobState.COMPLETED


async def test_parking_with_the_first_of_two_tokens_fails(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Returning WaitForCallback with a replaced token is returning an unregistered one."""

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        first = await job.register_callback()
        await job.register_callback()
        return awa.WaitForCallback(first)

    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    await wait_for_state(conn, job.id, "failed")
    assert last_error(conn, job.id)["terminal"] is True


async def test_register_callback_validates_its_arguments(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A bad timeout or CEL expression raises ValidationError in the handler (naming the
    expression), before anything is stored; the attempt carries on."""
    errors: dict[str, str] = {}

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> None:
        attempts: dict[str, dict[str, Any]] = {
            "negative": {"timeout_seconds": -1},
            "nan": {"timeout_seconds": float("nan")},
            "syntax": {"filter": "payload.status =="},
            "variable": {"on_complete": "request.status == 'ok'"},
            "empty": {"transform": "  "},
            "on_fail": {"on_fail": "payload.x && other"},
        }
        for name, kwargs in attempts.items():
            try:
                await job.register_callback(**kwargs)
            except awa.ValidationError as error:
                errors[name] = str(error)
        return None

    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    await wait_for_state(conn, job.id, "completed")
    assert set(errors) == {"negative", "nan", "syntax", "variable", "empty", "on_fail"}
    assert "timeout_seconds" in errors["negative"]
    assert "timeout_seconds" in errors["nan"]
    assert errors["syntax"].startswith("invalid CEL expression for filter")
    assert errors["variable"].startswith("invalid CEL expression for on_complete")
    assert "request" in errors["variable"]
    assert "payload" in errors["variable"]
    assert errors["empty"].startswith("invalid CEL expression for transform")
    assert "other" in errors["on_fail"]
    assert row(conn, job.id)["callback_id"] is None


# Resolution through the worker client: hooks (§8.1.16-19, E2-E4) --------------------------


async def test_client_complete_external_fires_completed(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """complete_external returns the completed row; Completed fires with duration 0 and the
    payload as the job's output; the callback columns are cleared."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    completed = await client.complete_external(callback_id, {"paid": True})
    assert completed.id == job.id
    assert completed.state is awa.JobState.COMPLETED
    assert completed.output == {"paid": True}
    [event] = recorder.of(awa.Completed, job.id)  # dispatched before the call returned
    assert event.duration == dt.timedelta(0)
    assert event.output == {"paid": True}
    assert event.job.state is awa.JobState.COMPLETED
    assert event.args == Payment()
    db = row(conn, job.id)
    assert db["state"] == "completed"
    assert db["finalized_at"] is not None
    assert db["output"] == {"paid": True}
    assert db["progress"] is None
    assert_callback_cleared(db)
    assert recorder.names(job.id) == ["Started", "WaitingForCallback", "Completed"]


async def test_client_complete_external_without_payload(
    client: awa.AsyncClient, conn: Conn
) -> None:
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    await client.complete_external(awa.CallbackToken(callback_id))
    [event] = recorder.of(awa.Completed, job.id)
    assert event.output is None
    assert row(conn, job.id)["output"] is None


async def test_client_fail_external_fires_exhausted(client: awa.AsyncClient, conn: Conn) -> None:
    """fail_external fails the job terminally whatever attempts are left; Exhausted carries
    the error and the attempt."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder, max_attempts=5)
    failed = await client.fail_external(callback_id, "payment declined")
    assert failed.state is awa.JobState.FAILED
    [event] = recorder.of(awa.Exhausted, job.id)
    assert event.error == "payment declined"
    assert event.attempt == 1
    assert event.job.state is awa.JobState.FAILED
    db = row(conn, job.id)
    assert db["state"] == "failed"
    assert db["finalized_at"] is not None
    assert_callback_cleared(db)
    entry = last_error(conn, job.id)
    assert entry["error"] == "payment declined"
    assert entry["terminal"] is True
    assert entry["attempt"] == 1


async def test_client_resolve_callback_fires_completed(client: awa.AsyncClient, conn: Conn) -> None:
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    result = await client.resolve_callback(callback_id, None, "complete")
    assert result.is_completed()
    assert result.job is not None
    assert result.job.state is awa.JobState.COMPLETED
    [event] = recorder.of(awa.Completed, job.id)
    assert event.duration == dt.timedelta(0)
    assert row(conn, job.id)["state"] == "completed"


async def test_client_resolve_callback_fail_fires_exhausted(
    client: awa.AsyncClient, conn: Conn
) -> None:
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client, on_fail='payload.status == "declined"')
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    result = await client.resolve_callback(callback_id, {"status": "declined"})
    assert result.is_failed()
    [event] = recorder.of(awa.Exhausted, job.id)
    assert event.error == "callback failed: on_fail expression matched"
    assert event.attempt == 1


async def test_client_resolve_callback_ignored_fires_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    recorder = Recorder()
    client.on_event(Payment, recorder)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    result = await client.resolve_callback(callback_id, {"status": "pending"})
    assert result.is_ignored()
    assert result.job is None
    assert result.reason == "no expressions configured, default is ignore"
    assert client.hook_dispatcher.pending() == 0
    assert recorder.names(job.id) == ["Started", "WaitingForCallback"]
    assert callback_of(conn, job.id) == callback_id


async def test_client_retry_external_fires_retried_with_the_parked_attempt(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """retry_external makes the job available with attempt 0; Retried reports the attempt
    that parked (1), and the job runs and parks again."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    runs = register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    retried = await client.retry_external(callback_id)
    assert retried.state is awa.JobState.AVAILABLE
    assert retried.attempt == 0
    assert retried.callback_id is None
    [event] = recorder.of(awa.Retried, job.id)
    assert event.attempt == 1
    assert event.error == ""
    assert event.next_run_at == retried.run_at
    assert event.job.state is awa.JobState.AVAILABLE
    await recorder.wait(awa.WaitingForCallback, job.id, count=2)
    new_callback = await wait_parked(conn, job.id)
    assert new_callback != callback_id
    assert len(runs) == 2
    assert runs[1].attempt == 1
    assert runs[1].run_lease == 2


async def test_retry_external_only_takes_parked_jobs(client: awa.AsyncClient, conn: Conn) -> None:
    """A job still running with its callback registered cannot be retried through it."""
    job_id, callback_id = await insert_parked(client, conn, state="running")
    with pytest.raises(awa.CallbackNotFound):
        await client.retry_external(callback_id)
    assert row(conn, job_id)["state"] == "running"


@pytest.mark.parametrize("operation", ["complete", "fail", "retry", "resolve", "resume"])
async def test_admin_resolution_fires_no_hook(
    client: awa.AsyncClient, database_url: str, conn: Conn, operation: str
) -> None:
    """§8.1.21: awa.admin resolves the callback (the row changes) but no hook and no
    follow-up fires."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    client.on_completed_enqueue(Payment, lambda args, job: Receipt(args.order, job.id))
    client.on_exhausted_enqueue(Payment, lambda args, job, e, a: Receipt(args.order, job.id))
    client.on_retried_enqueue(Payment, lambda args, job, e, a, n: Receipt(args.order, job.id))
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    await client.shutdown()  # nothing re-runs the job: only the resolution can fire events
    expected = {
        "complete": "completed",
        "fail": "failed",
        "retry": "available",
        "resolve": "completed",
        "resume": "available",
    }[operation]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        if operation == "complete":
            changed = await awa.admin.complete_external(aconn, callback_id, {"ok": 1})
        elif operation == "fail":
            changed = await awa.admin.fail_external(aconn, callback_id, "declined")
        elif operation == "retry":
            changed = await awa.admin.retry_external(aconn, callback_id)
        elif operation == "resolve":
            result = await awa.admin.resolve_callback(aconn, callback_id, None, "complete")
            assert result.job is not None
            changed = result.job
        else:
            changed = await awa.admin.resume_external(aconn, callback_id, {"ok": 1})
    assert changed.state.value == expected
    assert row(conn, job.id)["state"] == expected
    assert client.hook_dispatcher.pending() == 0
    await asyncio.sleep(0.2)  # give a stray dispatch the chance to show up
    assert recorder.names(job.id) == ["Started", "WaitingForCallback"]
    assert jobs_of_kind(conn, "receipt") == []


def test_admin_resolution_on_a_blocking_connection(sync_client: awa.Client, conn: Conn) -> None:
    """The admin functions also run on a blocking psycopg connection."""
    with sync_client.connection() as sync_conn:
        job = sync_client.insert(Payment(), queue="nobody-works-this")

        callback_id = str(uuid.uuid4())
        conn.execute(
            "UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, callback_id = %s"
            " WHERE id = %s",
            (callback_id, job.id),
        )
        completed = awa.admin.complete_external(sync_conn, callback_id, {"n": 1})
        assert completed.state is awa.JobState.COMPLETED
        assert completed.output == {"n": 1}
        with pytest.raises(awa.CallbackNotFound):
            awa.admin.complete_external(sync_conn, callback_id)


async def test_blocking_client_resolves_callbacks(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    """awa.Client has every resolution method; each commits the transition (no hooks or
    follow-ups: the blocking client has no lifecycle registry)."""
    job_id, callback_id = await insert_parked(client, conn, timeout_seconds=10)
    extended = sync_client.heartbeat_callback(callback_id, 7200)
    assert extended.callback_timeout_at is not None
    assert extended.callback_timeout_at > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=7000)
    completed = sync_client.complete_external(callback_id, {"paid": True})
    assert (completed.id, completed.state, completed.output) == (
        job_id,
        awa.JobState.COMPLETED,
        {"paid": True},
    )
    with pytest.raises(awa.CallbackNotFound):
        sync_client.complete_external(callback_id)

    job_id, callback_id = await insert_parked(client, conn)
    failed = sync_client.fail_external(callback_id, "declined")
    assert failed.state is awa.JobState.FAILED
    assert last_error(conn, job_id)["error"] == "declined"

    job_id, callback_id = await insert_parked(client, conn)
    retried = sync_client.retry_external(callback_id)
    assert (retried.state, retried.attempt) == (awa.JobState.AVAILABLE, 0)

    job_id, callback_id = await insert_parked(client, conn)
    resumed = sync_client.resume_external(callback_id, {"step": 2})
    assert resumed.id == job_id
    assert resumed.state is not awa.JobState.WAITING_EXTERNAL

    job_id, callback_id = await insert_parked(client, conn, on_complete="payload.ok")
    result = sync_client.resolve_callback(callback_id, {"ok": True})
    assert result.is_completed()
    assert row(conn, job_id)["state"] == "completed"
    with pytest.raises(awa.ValidationError):
        sync_client.complete_external("not-a-uuid")


async def test_a_resume_signal_between_two_waits_is_kept(client: awa.AsyncClient) -> None:
    """A callback notification that arrives while the waiting handler reads its row (not
    waiting at that moment) wakes its next wait at once instead of leaving it to the poll."""

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> None:
        pass

    await start(client, payments())
    runtime = client.runtime
    assert runtime is not None
    attempt = dataclasses.make_dataclass("Attempt", [("id", int)])(424242)
    runtime.inflight.add(attempt)
    runtime._wake_callback_waiter(attempt.id)  # nobody waits yet
    began = time.monotonic()
    await runtime.wait_signal(attempt.id, timeout=30)
    assert time.monotonic() - began < 5
    with pytest.raises(TimeoutError):  # consumed: the next wait sleeps
        async with asyncio.timeout(0.2):
            await runtime.wait_signal(attempt.id, timeout=30)
    runtime._wake_callback_waiter(999_999)  # not an attempt of this process: nothing kept
    assert 999_999 not in runtime._callback_waiters
    runtime.inflight.remove(attempt)
    await client.shutdown()


# Resume --------------------------------------------------------------------------------------


async def test_resume_parked_job_runs_it_again_with_the_payload(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """resume_external on a parked job fires nothing itself: the job goes back to
    available (attempt given back), runs again (Started) and finds the payload in
    job.callback_result; its own outcome then fires (Completed)."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    seen: list[Any] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback | None:
        seen.append(job.callback_result)
        if job.callback_result is None:
            return awa.WaitForCallback(await job.register_callback())
        return None

    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    await client.shutdown()
    resumed = await client.resume_external(callback_id, {"payment_id": "pay_123"})
    assert resumed.state is awa.JobState.AVAILABLE
    assert resumed.attempt == 0
    assert resumed.metadata["_awa_callback_result"] == {"payment_id": "pay_123"}
    assert resumed.callback_id is None
    assert client.hook_dispatcher.pending() == 0
    assert recorder.names(job.id) == ["Started", "WaitingForCallback"]
    await start(client, payments())
    await recorder.wait(awa.Completed, job.id)
    db = await wait_for_state(conn, job.id, "completed")
    assert seen == [None, {"payment_id": "pay_123"}]
    assert db["attempt"] == 1
    assert db["run_lease"] == 2
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started", "WaitingForCallback", "Started", "Completed"]


async def test_resume_before_the_handler_parks(client: awa.AsyncClient, conn: Conn) -> None:
    """A resume arriving while the handler still runs is kept: the park that follows sends
    the job straight back to run again with the payload, without a WaitingForCallback."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    registered: asyncio.Queue[str] = asyncio.Queue()
    release = asyncio.Event()
    seen: list[Any] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback | None:
        seen.append(job.callback_result)
        if job.callback_result is not None:
            return None
        token = await job.register_callback()
        await registered.put(token.id)
        await release.wait()
        return awa.WaitForCallback(token)

    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await asyncio.wait_for(registered.get(), 5)
    resumed = await client.resume_external(callback_id, {"early": True})
    assert resumed.state is awa.JobState.RUNNING
    release.set()
    await recorder.wait(awa.Completed, job.id)
    db = await wait_for_state(conn, job.id, "completed")
    assert seen == [None, {"early": True}]
    assert db["attempt"] == 1
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started", "Started", "Completed"]


async def test_resumed_job_returning_a_stale_token_fails(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """After a resume the job runs again; if it returns WaitForCallback with the token it
    already used (no longer registered) it fails terminally instead of looping."""
    tokens: list[awa.CallbackToken] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        if not tokens:
            tokens.append(await job.register_callback())
        return awa.WaitForCallback(tokens[0])

    await start(client, payments())
    job, callback_id = await parked_job(client, conn, max_attempts=3)
    await client.resume_external(callback_id, {"n": 1})
    db = await wait_for_state(conn, job.id, "failed")
    assert db["run_lease"] == 2
    assert "without a registered callback" in last_error(conn, job.id)["error"]


async def test_two_rounds_of_parking(client: awa.AsyncClient, conn: Conn) -> None:
    """Park, resume, park again with a new callback, complete it: two waits, one job."""
    seen: list[Any] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        seen.append(job.callback_result)
        return awa.WaitForCallback(await job.register_callback())

    await start(client, payments())
    job, first = await parked_job(client, conn)
    await client.resume_external(first, {"step": 1})
    second = await wait_for(lambda: (cb := callback_of(conn, job.id)) not in (None, first) and cb)
    await wait_parked(conn, job.id)
    completed = await client.complete_external(second, {"step": 2})
    assert completed.output == {"step": 2}
    assert seen == [None, {"step": 1}]
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(first)


async def test_resume_of_a_resolved_callback_is_not_found(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job_id, callback_id = await insert_parked(client, conn)
    await client.complete_external(callback_id)
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(callback_id, {"late": True})
    assert row(conn, job_id)["state"] == "completed"


async def test_resume_keeps_metadata_and_stores_null_without_payload(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """E27/E28: the job's metadata keys stay; no payload stores JSON null."""
    job = await client.insert(Payment(), queue="nobody", metadata={"customer": "c1", "p": 2})

    callback_id = str(uuid.uuid4())
    conn.execute(
        "UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, callback_id = %s"
        " WHERE id = %s",
        (callback_id, job.id),
    )
    resumed = await client.resume_external(callback_id)
    assert resumed.metadata == {"customer": "c1", "p": 2, "_awa_callback_result": None}


# Follow-ups (§8.2.7, 13-17) ------------------------------------------------------------------


async def test_waiting_for_callback_follow_up_sees_the_callback_id(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.2.7: the follow-up is inserted in the park transaction; its closure sees the
    parked row with its callback id."""
    seen: list[awa.JobRow] = []

    def receipt(args: Payment, job: awa.JobRow) -> Receipt:
        seen.append(job)
        return Receipt(args.order, job.id)

    client.on_waiting_for_callback_enqueue(Payment, receipt)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn)
    [follow_up] = jobs_of_kind(conn, "receipt")
    assert follow_up["args"] == {"order": 1, "payment_job_id": job.id}
    [closure_row] = seen
    assert closure_row.callback_id == callback_id
    assert closure_row.state is awa.JobState.WAITING_EXTERNAL


async def test_waiting_for_callback_follow_up_failure_rolls_the_park_back(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A raising park follow-up rolls the park back, and the attempt is recorded as failed
    (retryable, with an error naming the spec); nothing is parked."""

    def boom(args: Payment, job: awa.JobRow) -> Receipt:
        raise RuntimeError("no receipts today")

    client.on_waiting_for_callback_enqueue(Payment, boom)
    register_parking_task(client)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    db = await wait_for_state(conn, job.id, "retryable")
    assert "on_waiting_for_callback_enqueue for 'payment'" in db["errors"][-1]["error"]
    assert "no receipts today" in db["errors"][-1]["error"]
    assert jobs_of_kind(conn, "receipt") == []


@pytest.mark.parametrize("operation", ["complete", "fail", "retry", "resolve_complete"])
async def test_client_resolution_inserts_its_follow_up(
    client: awa.AsyncClient, conn: Conn, operation: str
) -> None:
    """§8.2.13-15: complete/fail/retry_external (and resolve_callback) run the Completed,
    Exhausted and Retried specs in the resolution's transaction, with the trigger's values."""
    contexts: list[tuple[Any, ...]] = []

    def on_completed(args: Payment, job: awa.JobRow) -> Receipt:
        contexts.append(("completed", job.state, job.output))
        return Receipt(args.order, job.id)

    def on_exhausted(args: Payment, job: awa.JobRow, error: str, attempt: int) -> Receipt:
        contexts.append(("exhausted", job.state, error, attempt))
        return Receipt(args.order, job.id)

    def on_retried(
        args: Payment, job: awa.JobRow, error: str, attempt: int, next_run_at: dt.datetime
    ) -> Receipt:
        contexts.append(("retried", job.state, error, attempt, next_run_at == job.run_at))
        return Receipt(args.order, job.id)

    client.on_completed_enqueue(Payment, on_completed)
    client.on_exhausted_enqueue(Payment, on_exhausted)
    client.on_retried_enqueue(Payment, on_retried)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn)
    await client.shutdown()
    if operation == "complete":
        await client.complete_external(callback_id, {"paid": True})
        expected: tuple[Any, ...] = ("completed", awa.JobState.COMPLETED, None)
    elif operation == "fail":
        await client.fail_external(callback_id, "external rejected")
        expected = ("exhausted", awa.JobState.FAILED, "external rejected", 1)
    elif operation == "retry":
        await client.retry_external(callback_id)
        expected = ("retried", awa.JobState.AVAILABLE, "", 1, True)
    else:
        await client.resolve_callback(callback_id, {"x": 1}, "complete")
        expected = ("completed", awa.JobState.COMPLETED, None)
    assert contexts == [expected]  # the closure sees the row without its output
    [follow_up] = jobs_of_kind(conn, "receipt")
    assert follow_up["args"] == {"order": 1, "payment_job_id": job.id}


@pytest.mark.parametrize("operation", ["complete", "fail", "retry", "resolve"])
async def test_raising_follow_up_rolls_the_resolution_back(
    client: awa.AsyncClient, conn: Conn, operation: str
) -> None:
    """§8.2.17: a closure that raises makes the client call raise; the job stays parked with
    the same callback id, no follow-up exists, no hook fired; after the fix a retry works."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    broken = True

    def receipt(args: Payment, job: awa.JobRow, *rest: Any) -> Receipt:
        if broken:
            raise RuntimeError("receipt service down")
        return Receipt(args.order, job.id)

    client.on_completed_enqueue(Payment, receipt)
    client.on_exhausted_enqueue(Payment, receipt)
    client.on_retried_enqueue(Payment, receipt)
    register_parking_task(client)
    await start(client, payments())
    job, callback_id = await parked_job(client, conn, recorder)
    await client.shutdown()

    async def resolve() -> None:
        if operation == "complete":
            await client.complete_external(callback_id, {"paid": True})
        elif operation == "fail":
            await client.fail_external(callback_id, "declined")
        elif operation == "retry":
            await client.retry_external(callback_id)
        else:
            await client.resolve_callback(callback_id, None, "complete")

    with pytest.raises(FollowUpError, match="receipt service down"):
        await resolve()
    db = row(conn, job.id)
    assert db["state"] == "waiting_external"
    assert str(db["callback_id"]) == callback_id
    assert db["output"] is None
    assert db["errors"] == []
    assert jobs_of_kind(conn, "receipt") == []
    assert recorder.names(job.id) == ["Started", "WaitingForCallback"]
    broken = False
    await resolve()
    assert len(jobs_of_kind(conn, "receipt")) == 1
    assert row(conn, job.id)["callback_id"] is None


async def test_duplicate_follow_up_through_complete_external_is_skipped(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.6: a follow-up whose unique key is held is skipped; complete_external still
    commits without an error and one follow-up exists."""

    @dataclasses.dataclass
    class Notify:
        order: int

    client.on_completed_enqueue_with(
        Payment, lambda args, job: awa.EnqueueRequest(Notify(args.order)).unique({})
    )
    first_id, first_cb = await insert_parked(client, conn, args=Payment(order=7))
    second_id, second_cb = await insert_parked(client, conn, args=Payment(order=7))
    await client.complete_external(first_cb)
    completed = await client.complete_external(second_cb)
    assert completed.state is awa.JobState.COMPLETED
    assert row(conn, first_id)["state"] == row(conn, second_id)["state"] == "completed"
    assert len(jobs_of_kind(conn, "notify")) == 1


async def test_with_follow_up_returning_none_commits_the_resolution_alone(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.1 through complete_external and resolve_callback."""
    client.on_completed_enqueue_with(Payment, lambda args, job: None)
    first_id, first_cb = await insert_parked(client, conn)
    second_id, second_cb = await insert_parked(client, conn)
    await client.complete_external(first_cb)
    await client.resolve_callback(second_cb, None, "complete")
    assert row(conn, first_id)["state"] == row(conn, second_id)["state"] == "completed"
    assert jobs_of_kind(conn, "receipt") == []


# Not found, validation, leases, races (E6, E7, E11, E15, E16, E23, C16, C17) -----------------


async def test_second_resolution_is_not_found(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, callback_id = await insert_parked(client, conn)
    await client.complete_external(callback_id)
    for again in (
        client.complete_external(callback_id),
        client.fail_external(callback_id, "late"),
        client.retry_external(callback_id),
        client.resume_external(callback_id),
        client.resolve_callback(callback_id, None, "complete"),
        client.heartbeat_callback(callback_id),
    ):
        with pytest.raises(awa.CallbackNotFound, match=callback_id):
            await again
    db = row(conn, job_id)
    assert db["state"] == "completed"
    assert db["errors"] == []


async def test_unknown_callback_is_not_found(client: awa.AsyncClient) -> None:

    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(str(uuid.uuid4()))
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(uuid.uuid4())


@pytest.mark.parametrize("bad", ["not-a-uuid", "", "1234", "00000000-0000-0000-0000-00000000000g"])
async def test_bad_callback_id_is_a_validation_error(client: awa.AsyncClient, bad: str) -> None:
    for call in (
        client.complete_external(bad),
        client.fail_external(bad, "x"),
        client.retry_external(bad),
        client.resume_external(bad),
        client.resolve_callback(bad),
        client.heartbeat_callback(bad),
    ):
        with pytest.raises(awa.ValidationError, match="not a UUID"):
            await call


async def test_other_bad_arguments_are_validation_errors(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job_id, callback_id = await insert_parked(client, conn)
    with pytest.raises(awa.ValidationError, match="default_action"):
        await client.resolve_callback(callback_id, None, "explode")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="timeout_seconds"):
        await client.heartbeat_callback(callback_id, -5)
    with pytest.raises(awa.ValidationError, match="run_lease"):
        await client.complete_external(callback_id, None, "1")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="error"):
        await client.fail_external(callback_id, "nul\x00byte")
    with pytest.raises(awa.ValidationError):
        await client.complete_external(callback_id, {"bad": float("nan")})
    db = row(conn, job_id)
    assert db["state"] == "waiting_external"
    assert str(db["callback_id"]) == callback_id


@pytest.mark.parametrize("operation", ["complete", "fail", "resolve", "resume"])
async def test_callback_on_a_job_still_running_is_accepted(
    client: awa.AsyncClient, conn: Conn, operation: str
) -> None:
    """E11/E15/C16: the answer arrives before the handler returns WaitForCallback. It is
    accepted; the park that follows writes nothing and fires no WaitingForCallback (for
    resume, the job runs again)."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    registered: asyncio.Queue[str] = asyncio.Queue()
    release = asyncio.Event()

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback | None:
        if job.callback_result is not None:
            return None
        token = await job.register_callback()
        await registered.put(token.id)
        await release.wait()
        return awa.WaitForCallback(token)

    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await asyncio.wait_for(registered.get(), 5)
    if operation == "complete":
        changed = await client.complete_external(callback_id, {"fast": True})
        expected, event = "completed", awa.Completed
    elif operation == "fail":
        changed = await client.fail_external(callback_id, "declined fast")
        expected, event = "failed", awa.Exhausted
    elif operation == "resolve":
        result = await client.resolve_callback(callback_id, None, "complete")
        assert result.job is not None
        changed, expected, event = result.job, "completed", awa.Completed
    else:
        changed = await client.resume_external(callback_id, {"fast": True})
        expected, event = "running", awa.Completed
    assert changed.state.value == expected
    release.set()
    await no_longer_in_flight(client, job.id)
    final = "completed" if operation == "resume" else expected
    await wait_for_state(conn, job.id, final)
    await recorder.wait(event, job.id)
    await hooks_idle(client)
    names = recorder.names(job.id)
    assert "WaitingForCallback" not in names
    assert names.count(event.__name__) == 1


async def test_run_lease_must_match(client: awa.AsyncClient, conn: Conn) -> None:
    """E16/E24: with run_lease, only the attempt that registered is matched."""
    job_id, callback_id = await insert_parked(client, conn)
    conn.execute("UPDATE awa.jobs SET run_lease = 2 WHERE id = %s", (job_id,))
    for call in (
        client.complete_external(callback_id, None, 1),
        client.fail_external(callback_id, "x", 1),
        client.retry_external(callback_id, 1),
        client.resume_external(callback_id, None, 1),
        client.resolve_callback(callback_id, None, "complete", 1),
    ):
        with pytest.raises(awa.CallbackNotFound):
            await call
    assert row(conn, job_id)["state"] == "waiting_external"
    completed = await client.complete_external(callback_id, None, 2)
    assert completed.state is awa.JobState.COMPLETED


async def test_resume_with_the_lease_then_a_new_lease(client: awa.AsyncClient, conn: Conn) -> None:
    """E16 through the worker: park (lease 1), retry_external, park again (lease 2): the
    new callback does not answer to lease 1."""
    register_parking_task(client)
    await start(client, payments())
    job, first = await parked_job(client, conn)
    await client.retry_external(first, 1)
    second = await wait_for(lambda: (cb := callback_of(conn, job.id)) not in (None, first) and cb)
    await wait_parked(conn, job.id)
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(second, None, 1)
    completed = await client.complete_external(second, None, 2)
    assert completed.run_lease == 2


async def _race(database_url: str, callback_id: str, calls: list[str]) -> list[Any]:
    async with second_client(database_url) as one, second_client(database_url) as two:
        clients = [one, two]

        async def call(index: int, name: str) -> Any:
            target = clients[index % 2]
            if name == "complete":
                return await target.complete_external(callback_id, {"by": index})
            if name == "fail":
                return await target.fail_external(callback_id, f"failed by {index}")
            if name == "resume":
                return await target.resume_external(callback_id, {"by": index})
            if name == "retry":
                return await target.retry_external(callback_id)
            return await target.resolve_callback(callback_id, {"by": index}, "complete")

        return await asyncio.gather(
            *(call(i, name) for i, name in enumerate(calls)), return_exceptions=True
        )


@pytest.mark.parametrize(
    "calls",
    [
        ["complete", "fail"],
        ["complete", "complete"],
        ["resume", "resume"],
        ["resolve", "resolve"],
        ["retry", "complete"],
        ["complete", "fail", "resume", "resolve", "retry", "complete"],
    ],
)
async def test_concurrent_resolutions_exactly_one_wins(
    client: awa.AsyncClient, database_url: str, conn: Conn, calls: list[str]
) -> None:
    """E23/C17: resolutions racing on two connections: one succeeds, the rest get
    CallbackNotFound, and the row shows the winner's transition only."""
    for _ in range(3):
        job_id, callback_id = await insert_parked(client, conn)
        results = await _race(database_url, callback_id, calls)
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1, results
        assert all(isinstance(r, awa.CallbackNotFound) for r in losers), losers
        db = row(conn, job_id)
        assert db["callback_id"] is None
        assert len(db["errors"]) <= 1


async def test_heartbeat_callback_extends_the_timeout(client: awa.AsyncClient, conn: Conn) -> None:
    """E20/E21: heartbeat_callback pushes callback_timeout_at to now + timeout; after the
    job is resolved it is not found."""
    job_id, callback_id = await insert_parked(client, conn, timeout_seconds=10)
    before = row(conn, job_id)["callback_timeout_at"]
    extended = await client.heartbeat_callback(callback_id, 7200)
    assert extended.state is awa.JobState.WAITING_EXTERNAL
    assert extended.callback_timeout_at is not None
    assert extended.callback_timeout_at > before + dt.timedelta(seconds=7000)
    assert row(conn, job_id)["callback_timeout_at"] == extended.callback_timeout_at
    await client.complete_external(callback_id)
    with pytest.raises(awa.CallbackNotFound):
        await client.heartbeat_callback(callback_id)


async def test_heartbeat_callback_needs_a_parked_job(client: awa.AsyncClient, conn: Conn) -> None:
    _, callback_id = await insert_parked(client, conn, state="running")
    with pytest.raises(awa.CallbackNotFound):
        await client.heartbeat_callback(callback_id, 60)


async def test_admin_cancel_retry_and_drain_of_parked_jobs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """E8-E10: cancel and retry clear the callback; drain cancels parked jobs."""
    cancelled_id, cancelled_cb = await insert_parked(client, conn)
    retried_id, retried_cb = await insert_parked(client, conn)
    drained_id, _ = await insert_parked(client, conn)
    cancelled = await client.cancel(cancelled_id)
    assert cancelled is not None
    assert cancelled.state is awa.JobState.CANCELLED
    assert cancelled.callback_id is None
    retried = await client.retry(retried_id)
    assert retried is not None
    assert retried.state is awa.JobState.AVAILABLE
    assert retried.attempt == 0
    assert retried.callback_id is None
    for callback_id in (cancelled_cb, retried_cb):
        with pytest.raises(awa.CallbackNotFound):
            await client.complete_external(callback_id)
    assert await client.drain_queue("nobody-works-this") == 2  # the retried one and drained
    assert row(conn, drained_id)["state"] == "cancelled"


async def test_unique_job_keeps_its_key_while_parked(client: awa.AsyncClient, conn: Conn) -> None:
    """E13: with waiting_external in the unique mask a parked job holds its key."""
    register_parking_task(client)
    await start(client, payments())
    states = ["scheduled", "available", "running", "completed", "retryable", "waiting_external"]
    unique = awa.UniqueOpts(states=states)
    _job, callback_id = await parked_job(client, conn, unique_opts=unique)
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Payment(), queue=QUEUE, unique_opts=unique)
    completed = await client.complete_external(callback_id)
    assert completed.state is awa.JobState.COMPLETED


# Callback timeout (E5, §8.2.16) ---------------------------------------------------------------


async def test_expired_callback_is_rescued_then_fails_on_the_last_attempt(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """E5: max_attempts 2. The callback times out -> retryable (attempt 1), Rescued fires,
    the old id is gone; the next attempt times out too -> failed."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    client.on_rescued_enqueue(Payment, lambda args, job, reason: Receipt(args.order, job.id))
    register_parking_task(client, timeout_seconds=0.2)
    await start(client, payments(), callback_rescue_interval=0.1, leader_election_interval=0.1)
    job, first = await parked_job(client, conn, max_attempts=2)
    db = await wait_for_state(conn, job.id, "retryable")
    assert db["attempt"] == 1
    assert_callback_cleared(db)
    assert last_error(conn, job.id)["error"] == "callback timed out"
    [rescued] = await recorder.wait(awa.Rescued, job.id)
    assert rescued.reason is awa.RescueReason.EXPIRED_CALLBACK
    assert rescued.job.state is awa.JobState.RETRYABLE
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(first)
    conn.execute("UPDATE awa.jobs SET run_at = now() WHERE id = %s", (job.id,))  # skip backoff
    db = await wait_for_state(conn, job.id, "failed", timeout=10)
    assert db["attempt"] == 2
    assert_callback_cleared(db)
    [_, last] = await recorder.wait(awa.Rescued, job.id, count=2)
    assert last.job.state is awa.JobState.FAILED
    await wait_for(lambda: len(jobs_of_kind(conn, "receipt")) == 2)


async def test_heartbeat_callback_keeps_an_expiring_callback_alive(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A heartbeat pushes the timeout away before the rescue sweep sees it."""
    register_parking_task(client, timeout_seconds=1.5)
    await start(client, payments(), callback_rescue_interval=0.1, leader_election_interval=0.1)
    job, callback_id = await parked_job(client, conn)
    await client.heartbeat_callback(callback_id, 3600)
    other, other_cb = await parked_job(client, conn)  # its timeout is not extended
    await wait_for_state(conn, other.id, "retryable")
    assert row(conn, job.id)["state"] == "waiting_external"
    assert callback_of(conn, job.id) == callback_id
    assert other_cb != callback_id


# Waiting inside the handler: job.wait_for_callback (E19, E19b, E19c, E22) -------------------


class Waiter:
    """A Payment handler that waits in the handler for ``rounds`` callbacks in a row,
    handing each token to the test and recording what it got back (or the error)."""

    def __init__(self, client: awa.AsyncClient, rounds: int = 1, **register: Any) -> None:
        self.tokens: asyncio.Queue[str] = asyncio.Queue()
        self.results: list[Any] = []
        self.error: BaseException | None = None
        self.done = asyncio.Event()
        self.before_wait: asyncio.Event | None = None
        self.jobs: list[awa.Job[Payment]] = []

        @client.task(Payment, queue=QUEUE)
        async def pay(job: awa.Job[Payment]) -> Any:
            self.jobs.append(job)
            try:
                for _ in range(rounds):
                    token = await job.register_callback(**register)
                    await self.tokens.put(token.id)
                    if self.before_wait is not None:
                        await self.before_wait.wait()
                    self.results.append(await job.wait_for_callback(token))
                return None
            except BaseException as error:
                self.error = error
                raise
            finally:
                self.done.set()

    async def token(self) -> str:
        return await asyncio.wait_for(self.tokens.get(), 5)

    async def finished(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self.done.wait(), timeout)


async def test_wait_for_callback_returns_the_resumed_payload(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """E19: the row shows waiting_external (no heartbeat, no deadline) while the handler
    keeps its slot; resume_external hands the payload back; the job then completes, with
    the payload taken out of its metadata and no WaitingForCallback event."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    waiter = Waiter(client)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await waiter.token()
    db = await wait_for_state(conn, job.id, "waiting_external")
    assert db["heartbeat_at"] is None
    assert db["deadline_at"] is None
    assert job.id in client.runtime.inflight  # type: ignore[union-attr]
    resumed = await client.resume_external(callback_id, {"answer": 42})
    assert resumed.state is awa.JobState.RUNNING
    assert resumed.heartbeat_at is not None
    await waiter.finished()
    assert waiter.results == [{"answer": 42}]
    db = await wait_for_state(conn, job.id, "completed")
    assert "_awa_callback_result" not in db["metadata"]
    assert db["attempt"] == 1
    assert db["run_lease"] == 1
    await recorder.wait(awa.Completed, job.id)
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started", "Completed"]


async def test_wait_for_callback_two_rounds(client: awa.AsyncClient, conn: Conn) -> None:
    """Two sequential waits in one attempt, each with its own callback; same run_lease."""
    waiter = Waiter(client, rounds=2)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    first = await waiter.token()
    await wait_for_state(conn, job.id, "waiting_external")
    await client.resume_external(first, {"round": 1})
    second = await waiter.token()
    assert second != first
    await wait_for_state(conn, job.id, "waiting_external")
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(first, {"round": "stale"})
    await client.resume_external(second, {"round": 2}, 1)
    await waiter.finished()
    assert waiter.error is None
    assert waiter.results == [{"round": 1}, {"round": 2}]
    db = await wait_for_state(conn, job.id, "completed")
    assert db["run_lease"] == 1


async def test_wait_for_callback_early_resume(client: awa.AsyncClient, conn: Conn) -> None:
    """E19b: the resume arrives before the handler starts waiting; the wait returns it."""
    waiter = Waiter(client)
    waiter.before_wait = asyncio.Event()
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await waiter.token()
    resumed = await client.resume_external(callback_id, 7)
    assert resumed.state is awa.JobState.RUNNING
    waiter.before_wait.set()
    await waiter.finished()
    assert waiter.results == [7]
    db = await wait_for_state(conn, job.id, "completed")
    assert "_awa_callback_result" not in db["metadata"]


async def test_wait_for_callback_with_a_stale_token(client: awa.AsyncClient, conn: Conn) -> None:
    """E19c: wait on cb1, resumed, register cb2, wait on cb1 again -> CallbackWaitError
    saying the token is stale."""
    errors: list[BaseException] = []
    tokens: asyncio.Queue[str] = asyncio.Queue()

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> None:
        first = await job.register_callback()
        await tokens.put(first.id)
        await job.wait_for_callback(first)
        await job.register_callback()
        try:
            await job.wait_for_callback(first)
        except awa.CallbackWaitError as error:
            errors.append(error)

    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    await client.resume_external(await asyncio.wait_for(tokens.get(), 5))
    await wait_for_state(conn, job.id, "completed")
    [error] = errors
    assert "stale" in str(error)


async def test_wait_for_callback_with_an_unregistered_token(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A token this attempt never registered cannot be waited for, even when the job
    carries the payload of an earlier resume."""
    errors: list[BaseException] = []
    tokens: list[awa.CallbackToken] = []

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> Any:
        if job.callback_result is None:
            tokens.append(await job.register_callback())
            return awa.WaitForCallback(tokens[0])
        try:
            await asyncio.wait_for(job.wait_for_callback(tokens[0]), 3)
        except (awa.CallbackWaitError, TimeoutError) as error:
            errors.append(error)
        return None

    await start(client, payments())
    job, callback_id = await parked_job(client, conn)
    await client.resume_external(callback_id, {"first": True})
    await wait_for_state(conn, job.id, "completed")
    [error] = errors
    assert isinstance(error, awa.CallbackWaitError)


async def test_cancel_while_waiting_raises_quickly(client: awa.AsyncClient, conn: Conn) -> None:
    """An operator cancels the job while its handler waits: the wait raises
    CallbackWaitError at once (woken by the cancel notification, not the poll)."""
    waiter = Waiter(client)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await waiter.token()
    await wait_for_state(conn, job.id, "waiting_external")
    started = time.monotonic()
    cancelled = await client.cancel(job.id)
    assert cancelled is not None
    await waiter.finished()
    elapsed = time.monotonic() - started
    assert isinstance(waiter.error, awa.CallbackWaitError)
    assert "cancelled" in str(waiter.error)
    assert elapsed < 0.9, elapsed
    await no_longer_in_flight(client, job.id)
    db = row(conn, job.id)
    assert db["state"] == "cancelled"
    assert db["callback_id"] is None
    with pytest.raises(awa.CallbackNotFound):
        await client.resume_external(callback_id)


async def test_complete_while_waiting_ends_the_wait(client: awa.AsyncClient, conn: Conn) -> None:
    """complete_external on a job whose handler waits completes it; the wait raises and the
    handler's own outcome is stale (one Completed event, from the callback)."""
    recorder = Recorder()
    client.on_event(Payment, recorder)
    waiter = Waiter(client)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await waiter.token()
    await wait_for_state(conn, job.id, "waiting_external")
    await client.complete_external(callback_id, {"done": True})
    await waiter.finished()
    assert isinstance(waiter.error, awa.CallbackWaitError)
    assert "completed" in str(waiter.error)
    await no_longer_in_flight(client, job.id)
    db = row(conn, job.id)
    assert db["state"] == "completed"
    assert db["output"] == {"done": True}
    await hooks_idle(client)
    assert recorder.names(job.id) == ["Started", "Completed"]


async def test_expired_callback_while_waiting_raises(client: awa.AsyncClient, conn: Conn) -> None:
    """The callback times out while the handler waits: rescue makes the job retryable and
    the wait raises CallbackWaitError."""
    waiter = Waiter(client, timeout_seconds=0.2)
    job = await client.insert(Payment(), queue=QUEUE, max_attempts=3)
    await start(client, payments(), callback_rescue_interval=0.1, leader_election_interval=0.1)
    await waiter.token()
    await waiter.finished(timeout=5)
    assert isinstance(waiter.error, awa.CallbackWaitError)
    db = row(conn, job.id)
    assert db["state"] in ("retryable", "available", "running")
    assert "callback timed out" in [entry["error"] for entry in db["errors"]]


async def test_heartbeat_callback_while_waiting(client: awa.AsyncClient, conn: Conn) -> None:
    """E22: heartbeat_callback extends an in-handler wait's timeout; the resume still works."""
    waiter = Waiter(client, timeout_seconds=10)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    callback_id = await waiter.token()
    await wait_for_state(conn, job.id, "waiting_external")
    extended = await client.heartbeat_callback(callback_id, 7200)
    assert extended.callback_timeout_at is not None
    assert extended.callback_timeout_at > dt.datetime.now(dt.UTC) + dt.timedelta(seconds=7000)
    await client.resume_external(callback_id, "ok")
    await waiter.finished()
    assert waiter.results == ["ok"]


async def test_shutdown_while_waiting_does_not_strand_the_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The worker shuts down while a handler waits: the wait ends and the job does not stay
    parked with nobody waiting; it goes back to be run again."""
    waiter = Waiter(client)
    job = await client.insert(Payment(), queue=QUEUE)
    await start(client, payments())
    await waiter.token()
    await wait_for_state(conn, job.id, "waiting_external")
    await client.shutdown(timeout=0.1)
    assert isinstance(waiter.error, (awa.CallbackWaitError, asyncio.CancelledError))
    db = row(conn, job.id)
    # Back to run again: retried (the handler let the wait's error out) or requeued (it was
    # interrupted before it noticed).
    assert db["state"] in ("retryable", "available"), db["state"]
    assert db["callback_in_handler"] is False


async def test_def_handlers_register_and_wait_with_the_sync_forms(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A plain def handler (run on a thread) registers with register_callback_sync and
    parks, or waits with wait_for_callback_sync; the async forms refuse to be misused."""

    @dataclasses.dataclass
    class Waits:
        pass

    results: list[Any] = []
    misuse: list[str] = []

    @client.task(Payment, queue=QUEUE)
    def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        return awa.WaitForCallback(job.register_callback_sync(timeout_seconds=60))

    @client.task(Waits, queue=QUEUE)
    def waits(job: awa.Job[Waits]) -> None:
        token = job.register_callback_sync()
        results.append(job.wait_for_callback_sync(token))

    @client.task(Receipt, queue=QUEUE)
    async def misused(job: awa.Job[Receipt]) -> None:
        try:
            job.register_callback_sync()
        except RuntimeError as error:
            misuse.append(str(error))

    await start(client, payments())
    parked, callback_id = await parked_job(client, conn)
    assert (await client.complete_external(callback_id)).state is awa.JobState.COMPLETED
    waiting = await client.insert(Waits(), queue=QUEUE)
    await wait_for_state(conn, waiting.id, "waiting_external")
    await client.resume_external(str(row(conn, waiting.id)["callback_id"]), {"ok": True})
    await wait_for_state(conn, waiting.id, "completed")
    assert results == [{"ok": True}]
    other = await client.insert(Receipt(1, parked.id), queue=QUEUE)
    await wait_for_state(conn, other.id, "completed")
    [message] = misuse
    assert "await the async form" in message


async def test_stale_heartbeat_rescue_drops_a_registered_callback(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """E12: a running job that registered a callback and whose worker died is rescued by
    the heartbeat sweep; its callback goes with the attempt."""
    register_parking_task(client)
    job_id, callback_id = await insert_parked(client, conn, state="running")
    conn.execute(
        "UPDATE awa.jobs SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", (job_id,)
    )
    await start(client, payments(), heartbeat_rescue_interval=0.1, leader_election_interval=0.1)
    db = await wait_for_state(conn, job_id, "retryable")
    assert_callback_cleared(db)
    with pytest.raises(awa.CallbackNotFound):
        await client.complete_external(callback_id)
