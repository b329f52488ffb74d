"""Every handler outcome and the row it leaves: state, attempt, run_at window and errors.

Semantics (DESIGN §2, semantics.md §4): return -> completed; raise -> retryable with backoff
(failed once attempts run out); TerminalError -> failed at once; RetryAfter consumes the
attempt; Snooze does not; Cancel -> cancelled; undecodable args and invalid return values
fail terminally; crashes of any BaseException kind are retryable. A kind the worker has no
handler for is never claimed: it waits for a worker that runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

import pytest

import awa
from helpers_worker import (
    insert_raw,
    no_longer_in_flight,
    queue,
    row,
    seconds,
    start,
    wait_for,
    wait_for_state,
)
from jobs_helpers import Conn, must_job_row


@dataclasses.dataclass
class Work:
    n: int = 0


@dataclasses.dataclass
class Other:
    pass


class Crash(BaseException):
    """A BaseException that is not an Exception."""


def only_error(row: dict[str, Any]) -> dict[str, Any]:
    assert len(row["errors"]) == 1, row["errors"]
    error: dict[str, Any] = row["errors"][0]
    return error


async def run_one(
    client: awa.AsyncClient,
    conn: Conn,
    handler: Callable[[awa.Job[Work]], Any],
    state: str,
    *,
    queue_options: dict[str, Any] | None = None,
    timeout: float = 5.0,
    **insert: Any,
) -> dict[str, Any]:
    """Register ``handler`` for Work, run one job to ``state`` and return its row."""
    client.task(Work)(handler)
    job = await client.insert(Work(), **insert)
    await start(client, queue(**(queue_options or {})))
    final = await wait_for_state(conn, job.id, state, timeout)
    await no_longer_in_flight(client, job.id)
    await client.shutdown()
    return final


async def test_completed(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> str:
        return "ignored return value"

    final = await run_one(client, conn, handle, "completed")
    assert final["attempt"] == 1
    assert final["run_lease"] == 1
    assert final["finalized_at"] is not None
    assert final["finalized_at"] >= final["attempted_at"]
    assert final["errors"] == []
    assert final["heartbeat_at"] is None
    assert final["deadline_at"] is None
    assert final["output"] is None


async def test_exception_is_retryable_with_backoff(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> None:
        raise ValueError("msg")

    final = await run_one(client, conn, handle, "retryable")
    assert final["attempt"] == 1
    assert final["heartbeat_at"] is None
    assert final["deadline_at"] is None
    # Backoff after attempt 1 is 2 s plus up to 25 % jitter, counted from the update.
    delay = seconds(final["run_at"] - final["finalized_at"])
    assert 2.0 <= delay <= 2.5
    error = only_error(final)
    assert error["attempt"] == 1
    assert error["error"].startswith("ValueError: msg\n")
    assert 'in handle\n    raise ValueError("msg")' in error["error"]
    assert "terminal" not in error
    assert error["at"]


async def test_exception_on_the_last_attempt_exhausts(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> None:
        raise ValueError("no luck")

    final = await run_one(client, conn, handle, "failed", max_attempts=1)
    assert final["attempt"] == 1
    assert final["finalized_at"] is not None
    error = only_error(final)
    assert error["error"].startswith("ValueError: no luck")
    assert error["attempt"] == 1
    assert "terminal" not in error


async def test_exhaustion_counts_executions(client: awa.AsyncClient, conn: Conn) -> None:
    runs: list[int] = []

    async def handle(job: awa.Job[Work]) -> None:
        runs.append(job.attempt)
        raise ValueError(f"attempt {job.attempt}")

    quick = awa.RetryPolicy(base=1.0, jitter=0.0, max_delay=0.01)
    final = await run_one(
        client, conn, handle, "failed", max_attempts=3, queue_options={"retry": quick}
    )
    assert runs == [1, 2, 3]
    assert final["attempt"] == 3
    assert [e["attempt"] for e in final["errors"]] == [1, 2, 3]
    assert [e["error"].split("\n")[0] for e in final["errors"]] == [
        "ValueError: attempt 1",
        "ValueError: attempt 2",
        "ValueError: attempt 3",
    ]


async def test_terminal_error_fails_at_once(client: awa.AsyncClient, conn: Conn) -> None:
    class BadInput(awa.TerminalError):
        pass

    async def handle(job: awa.Job[Work]) -> None:
        raise BadInput("never valid")

    final = await run_one(client, conn, handle, "failed", max_attempts=25)
    assert final["attempt"] == 1
    error = only_error(final)
    assert error["terminal"] is True
    assert "BadInput: never valid" in error["error"].split("\n")[0]
    assert error["attempt"] == 1


async def test_retry_after_keeps_fractions_and_records_no_error(
    client: awa.AsyncClient, conn: Conn
) -> None:
    runs: list[int] = []
    retried = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.RetryAfter | None:
        runs.append(job.attempt)
        if job.attempt == 1:
            return awa.RetryAfter(0.3)
        await retried.wait()
        return None

    job = await client.insert(Work())
    await start(client)
    pending = await wait_for_state(conn, job.id, "retryable")
    assert pending["attempt"] == 1
    assert pending["errors"] == []
    assert seconds(pending["run_at"] - pending["finalized_at"]) == pytest.approx(0.3, abs=1e-6)
    await wait_for(lambda: runs == [1, 2])
    retried.set()
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert final["attempt"] == 2
    assert final["errors"] == []


async def test_retry_after_on_the_final_attempt_exhausts(
    client: awa.AsyncClient, conn: Conn
) -> None:
    runs: list[int] = []

    async def handle(job: awa.Job[Work]) -> awa.RetryAfter:
        runs.append(job.attempt)
        return awa.RetryAfter(0.05)

    final = await run_one(client, conn, handle, "failed", max_attempts=3)
    assert runs == [1, 2, 3]
    assert final["attempt"] == 3
    error = only_error(final)
    assert error["error"].startswith("max_attempts exhausted")
    assert "retry after 0.05s" in error["error"]
    assert error["attempt"] == 3
    assert "terminal" not in error


async def test_snooze_does_not_consume_attempts(client: awa.AsyncClient, conn: Conn) -> None:
    seen: list[int] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> awa.Snooze | None:
        seen.append(job.attempt)
        return awa.Snooze(0.2) if len(seen) <= 3 else None

    # max_attempts=1: snoozes are not bounded by it.
    job = await client.insert(Work(), max_attempts=1)
    await start(client)
    snoozed = await wait_for_state(conn, job.id, "scheduled")
    assert snoozed["attempt"] == 0
    assert snoozed["run_lease"] == 1
    assert snoozed["errors"] == []
    assert snoozed["finalized_at"] is None
    assert seconds(snoozed["run_at"] - snoozed["attempted_at"]) == pytest.approx(0.2, abs=0.05)
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert seen == [1, 1, 1, 1]
    assert final["attempt"] == 1
    assert final["run_lease"] == 4
    assert final["errors"] == []


async def test_cancel(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> awa.Cancel:
        return awa.Cancel("why")

    final = await run_one(client, conn, handle, "cancelled")
    assert final["attempt"] == 1
    assert final["finalized_at"] is not None
    error = only_error(final)
    assert error["error"] == "cancelled: why"
    assert error["attempt"] == 1


async def test_cancel_with_the_default_reason(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> awa.Cancel:
        return awa.Cancel()

    final = await run_one(client, conn, handle, "cancelled")
    assert only_error(final)["error"] == "cancelled: cancelled by handler"


async def test_an_unknown_kind_waits_for_a_worker_that_runs_it(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    job = await client.insert({"x": 1}, kind="nobody_handles_this")
    after = await client.insert(Work(1))  # behind it in the lane
    await start(client)
    await wait_for_state(conn, after.id, "completed")
    await client.shutdown()
    row = must_job_row(conn, job.id)
    assert (row["state"], row["attempt"], row["errors"]) == ("available", 0, [])


async def test_undecodable_args_fail_terminally(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        raise AssertionError("must not run")

    job_id = insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, args) VALUES ('work', 'default', %s) RETURNING id",
        '{"n": "not a number", "extra": true}',
    )
    await start(client)
    final = await wait_for_state(conn, job_id, "failed")
    await client.shutdown()
    error = only_error(final)
    assert error["terminal"] is True
    assert error["error"].startswith("failed to decode args of kind 'work' into Work:")
    assert "n" in error["error"]


@pytest.mark.parametrize(
    ("returned", "text"),
    [
        (awa.RetryAfter, "the class RetryAfter was returned"),
        (awa.Snooze, "the class Snooze was returned"),
        (awa.Cancel, "the class Cancel was returned"),
    ],
)
async def test_returning_an_outcome_class_fails_terminally(
    client: awa.AsyncClient, conn: Conn, returned: type, text: str
) -> None:
    async def handle(job: awa.Job[Work]) -> type:
        return returned

    final = await run_one(client, conn, handle, "failed")
    error = only_error(final)
    assert error["terminal"] is True
    assert text in error["error"]


async def test_returning_a_coroutine_fails_terminally(client: awa.AsyncClient, conn: Conn) -> None:
    async def helper() -> None:
        pass

    def handle(job: awa.Job[Work]) -> Any:
        return helper()

    final = await run_one(client, conn, handle, "failed")
    error = only_error(final)
    assert error["terminal"] is True
    assert "coroutine" in error["error"]


async def test_retry_policy_per_queue(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> None:
        raise ValueError("again")

    policy = awa.RetryPolicy(base=1.5, jitter=0, max_delay=3600)
    final = await run_one(client, conn, handle, "retryable", queue_options={"retry": policy})
    assert seconds(final["run_at"] - final["finalized_at"]) == pytest.approx(1.5, abs=1e-6)


async def test_retry_policy_max_delay_caps(client: awa.AsyncClient, conn: Conn) -> None:
    async def handle(job: awa.Job[Work]) -> None:
        raise ValueError("again")

    policy = awa.RetryPolicy(base=10, jitter=0.25, max_delay=0.75)
    final = await run_one(client, conn, handle, "retryable", queue_options={"retry": policy})
    assert seconds(final["run_at"] - final["finalized_at"]) == pytest.approx(0.75, abs=1e-6)


async def test_sync_handler_outcomes(client: awa.AsyncClient, conn: Conn) -> None:
    """Plain def handlers choose outcomes the same way."""

    @client.task(Work)
    def handle(job: awa.Job[Work]) -> Any:
        match job.args.n:
            case 1:
                return None
            case 2:
                raise ValueError("sync failure")
            case 3:
                raise awa.TerminalError("sync terminal")
            case 4:
                return awa.Cancel("sync cancel")
            case 5:
                return awa.RetryAfter(60)
        return awa.Snooze(60)

    jobs = {n: await client.insert(Work(n)) for n in range(1, 7)}
    await start(client)
    done = await wait_for_state(conn, jobs[1].id, "completed")
    retry = await wait_for_state(conn, jobs[2].id, "retryable")
    terminal = await wait_for_state(conn, jobs[3].id, "failed")
    cancelled = await wait_for_state(conn, jobs[4].id, "cancelled")
    after = await wait_for_state(conn, jobs[5].id, "retryable")
    snoozed = await wait_for_state(conn, jobs[6].id, "scheduled")
    await client.shutdown()
    assert done["errors"] == []
    assert only_error(retry)["error"].startswith("ValueError: sync failure")
    assert only_error(terminal)["terminal"] is True
    assert only_error(cancelled)["error"] == "cancelled: sync cancel"
    assert after["errors"] == []
    assert after["attempt"] == 1
    assert seconds(after["run_at"] - after["finalized_at"]) == pytest.approx(60, abs=1e-6)
    assert snoozed["attempt"] == 0


CRASHES: list[tuple[str, Callable[[], BaseException], str]] = [
    ("system_exit", lambda: SystemExit(3), "SystemExit: 3"),
    ("keyboard_interrupt", KeyboardInterrupt, "KeyboardInterrupt"),
    ("base_exception", lambda: Crash("boom"), "Crash: boom"),
    ("cancelled_error", lambda: asyncio.CancelledError("from the handler"), "CancelledError"),
]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize(("name", "make", "text"), CRASHES, ids=[c[0] for c in CRASHES])
async def test_crash_kinds_are_retryable_and_the_worker_keeps_serving(
    client: awa.AsyncClient,
    conn: Conn,
    sync: bool,
    name: str,
    make: Callable[[], BaseException],
    text: str,
) -> None:
    others: list[int] = []

    if sync:

        @client.task(Work)
        def crash_sync(job: awa.Job[Work]) -> None:
            assert threading.current_thread() is not threading.main_thread()
            raise make()

    else:

        @client.task(Work)
        async def crash_async(job: awa.Job[Work]) -> None:
            raise make()

    @client.task(Other)
    async def fine(job: awa.Job[Other]) -> None:
        others.append(job.id)

    # One slot: the same slot must survive the crash to run the next job.
    await start(client, queue(max_workers=1))
    crashed = await client.insert(Work())
    final = await wait_for_state(conn, crashed.id, "retryable")
    error = only_error(final)
    assert error["attempt"] == 1
    assert text in error["error"].split("\n")[0]
    assert "terminal" not in error
    after = [await client.insert(Other()) for _ in range(3)]
    for job in after:
        await wait_for_state(conn, job.id, "completed")
    await client.shutdown(timeout=2)
    assert others == [job.id for job in after]
    assert only_error(row(conn, crashed.id))["attempt"] == 1


@pytest.mark.parametrize("outcome", [awa.RetryAfter, awa.Snooze])
def test_delays_past_the_year_9999_are_refused(outcome: type) -> None:
    with pytest.raises(awa.ValidationError, match="9999"):
        outcome(1e12)
    with pytest.raises(awa.ValidationError, match=r"non-negative number of seconds, got -1"):
        outcome(-1)
    with pytest.raises(TypeError, match="not str"):
        outcome("5")
    assert outcome(dt.timedelta(milliseconds=1500)).seconds == 1.5


@pytest.mark.parametrize("seconds", [1e12, 1e15])
async def test_an_out_of_range_delay_fails_the_attempt_and_the_worker_keeps_serving(
    client: awa.AsyncClient, conn: Conn, seconds: float
) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> Any:
        return awa.Snooze(seconds) if job.args.n == 1 else awa.RetryAfter(seconds)

    @client.task(Other)
    async def fine(job: awa.Job[Other]) -> None:
        pass

    await start(client, queue(max_workers=1))
    snoozer = await client.insert(Work(1))
    retrier = await client.insert(Work(2))
    for job in (snoozer, retrier):
        final = await wait_for_state(conn, job.id, "retryable")
        assert "9999" in only_error(final)["error"].split("\n")[0]
    after = await client.insert(Other())
    await wait_for_state(conn, after.id, "completed")
    await client.shutdown(timeout=2)


async def test_nul_bytes_in_error_texts_are_stored_escaped(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Postgres text cannot hold NUL: an exception message or cancel reason containing one is
    stored with the NUL escaped, and the worker keeps serving."""

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> Any:
        if job.args.n == 1:
            raise ValueError("bad \x00 input")
        if job.args.n == 2:
            raise awa.TerminalError("terminal \x00 input")
        return awa.Cancel("reason \x00 here")

    await start(client, queue(max_workers=1))
    raised = await client.insert(Work(1))
    terminal = await client.insert(Work(2))
    cancelled = await client.insert(Work(3))
    retry_row = await wait_for_state(conn, raised.id, "retryable")
    fail_row = await wait_for_state(conn, terminal.id, "failed")
    cancel_row = await wait_for_state(conn, cancelled.id, "cancelled")
    await client.shutdown(timeout=2)
    assert only_error(retry_row)["error"].startswith("ValueError: bad \\x00 input")
    assert "terminal \\x00 input" in only_error(fail_row)["error"]
    assert only_error(cancel_row)["error"] == "cancelled: reason \\x00 here"


async def test_an_unexpected_error_while_finalizing_costs_no_slot(
    client: awa.AsyncClient, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: if committing an outcome fails in a way nobody planned for, the
    handler slot survives (the next job runs) and the attempt leaves the in-flight set, so
    it is no longer heartbeated as if it were alive."""
    from awa.worker.runtime import Runtime

    original = Runtime._finalize
    failures: list[int] = []

    async def flaky(self: Runtime, job: awa.Job[Any], outcome: Any, queue_config: Any) -> None:
        if not failures:
            failures.append(job.id)
            raise RuntimeError("injected finalizer failure")
        await original(self, job, outcome, queue_config)

    monkeypatch.setattr(Runtime, "_finalize", flaky)

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        pass

    await start(client, queue(max_workers=1))
    first = await client.insert(Work(1))
    await wait_for(lambda: failures == [first.id])
    await no_longer_in_flight(client, first.id)
    second = await client.insert(Work(2))
    await wait_for_state(conn, second.id, "completed")
    await client.shutdown(timeout=2)
    assert row(conn, first.id)["state"] == "running"  # left for rescue
