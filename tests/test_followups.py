"""Durable follow-up jobs (issue "Durable follow-up jobs"): ``on_*_enqueue`` specs on the
worker path.

Semantics (seed lifecycle-hooks.md "Durable follow-up jobs", DESIGN §2 and §4.5/4.7,
semantics.md §7.4-7.7, §8.2 cases 1-6 and §8.3 items 1-5): a follow-up is inserted in the
same transaction as the outcome that triggers it; a closure that raises (or a follow-up that
fails validation) rolls the outcome back, and the attempt is then recorded as failed; a
follow-up whose unique key is held is skipped and the trigger still commits; ``_with``
closures may return None to insert nothing. Callback and rescue triggers belong to other
issues.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import subprocess
import sys
import threading
from typing import Any

import pytest

import awa
from helpers_lifecycle import Counters, Recorder, hooks_idle, jobs_of_kind, metric_reader
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
from jobs_helpers import Conn, job_insert_trigger

TRIGGERS = "signups"  # the queue triggers run on; follow-ups go elsewhere and stay put


@dataclasses.dataclass
class Signup:
    user_id: int


@dataclasses.dataclass
class WelcomeEmail:
    user_id: int
    triggered_by_job_id: int


@dataclasses.dataclass
class AuditEntry:
    user_id: int


@dataclasses.dataclass
class Flaky:
    user_id: int


@pytest.fixture(autouse=True)
def _metrics() -> None:
    metric_reader()  # route awa's counters to an in-memory reader before any test runs


def welcome(args: Signup, job: awa.JobRow) -> WelcomeEmail:
    return WelcomeEmail(user_id=args.user_id, triggered_by_job_id=job.id)


def follow_ups(conn: Conn, kind: str = "welcome_email") -> list[dict[str, Any]]:
    return jobs_of_kind(conn, kind)


def trigger_queue(**options: Any) -> dict[str, Any]:
    return queue(TRIGGERS, **options)


def finalized_at(conn: Conn, job_id: int) -> dt.datetime:
    value: dt.datetime = row(conn, job_id)["finalized_at"]
    return value


def created_at(conn: Conn, job_id: int) -> dt.datetime:
    found = conn.execute("SELECT created_at FROM awa.jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    value: dt.datetime = found[0]
    return value


async def insert_trigger(client: awa.AsyncClient, user_id: int = 42, **kwargs: Any) -> awa.JobRow:
    return await client.insert(Signup(user_id), queue=TRIGGERS, **kwargs)


async def wait_follow_ups(
    conn: Conn, count: int, kind: str = "welcome_email"
) -> list[dict[str, Any]]:
    return await wait_for(
        lambda: (rows := follow_ups(conn, kind)) and len(rows) >= count and rows,
        message=lambda: f"{kind} follow-ups: {follow_ups(conn, kind)}",
    )


# §8.2 worker-path cases ---------------------------------------------------------------------


async def test_completed_inserts_follow_up_in_the_same_transaction(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.2.1: the trigger completes -> one available follow-up with the closure's args; the
    closure got the decoded args and the committed row. The follow-up's created_at equals the
    trigger's finalized_at: both are now() of one transaction."""
    seen: list[tuple[Any, awa.JobState, int, Any]] = []

    @client.on_completed_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        seen.append((args, job.state, job.id, job.finalized_at))
        return welcome(args, job)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    inserted = Counters.capture(
        "awa.job.follow_ups_committed", **{"awa.follow_up.result": "inserted"}
    )
    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    db = await wait_for_state(conn, trigger.id, "completed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["state"] == "available"
    assert follow_up["queue"] == "default"
    assert follow_up["args"] == {"user_id": 42, "triggered_by_job_id": trigger.id}
    assert seen == [(Signup(42), awa.JobState.COMPLETED, trigger.id, db["finalized_at"])]
    assert created_at(conn, follow_up["id"]) == db["finalized_at"]
    assert inserted.delta() == 1


async def test_raising_closure_rolls_back_and_the_attempt_fails(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """§8.2.2 and DESIGN §4.10: the closure raises -> the trigger's completion and the
    follow-up roll back together; then, in a transaction of its own, the attempt is recorded
    as failed: retryable with backoff, an error naming the spec's closure and the exception,
    a Retried event. It never sits in running waiting for rescue. The worker keeps working."""
    caplog.set_level(logging.ERROR, logger="awa.worker")
    recorder = Recorder()
    client.on_event(Signup, recorder)

    @client.on_completed_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        if args.user_id == 13:
            raise RuntimeError("closure exploded")
        return welcome(args, job)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "signup"})
    bad = await insert_trigger(client, 13)
    await start(client, trigger_queue())
    bad_row = await wait_for_state(conn, bad.id, "retryable", timeout=1.0)
    good = await insert_trigger(client, 14)
    await wait_for_state(conn, good.id, "completed")  # the worker keeps running
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["args"]["triggered_by_job_id"] == good.id
    assert bad_row["attempt"] == 1
    [error] = bad_row["errors"]
    assert error["attempt"] == 1
    assert "follow-up failed" in error["error"]
    assert "on_completed_enqueue for 'signup'" in error["error"]
    assert "spec" in error["error"]  # the closure's name
    assert "RuntimeError: closure exploded" in error["error"]
    assert failures.delta() == 1
    [record] = [r for r in caplog.records if "follow-up" in r.getMessage()]
    assert f"job {bad.id}" in record.getMessage()
    assert "signup" in record.getMessage()
    assert "closure exploded" in record.getMessage()
    await wait_for(lambda: len(recorder.names(bad.id)) == 2)
    events = [e for e in recorder.events if e.job.id == bad.id]
    assert [type(e).__name__ for e in events] == ["Started", "Retried"]
    assert "closure exploded" in events[1].error  # type: ignore[attr-defined]


async def test_raising_closure_on_the_last_attempt_exhausts_the_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """On its last attempt, a job whose follow-up fails ends failed, with an Exhausted
    event and the Exhausted follow-ups of its kind (the failure's own specs still run)."""
    recorder = Recorder()
    client.on_event(Signup, recorder)

    @client.on_completed_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        raise RuntimeError("closure exploded")

    client.on_exhausted_enqueue(Signup, lambda args, job, error, attempt: AuditEntry(attempt))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    bad = await client.insert(Signup(13), queue=TRIGGERS, max_attempts=1)
    await start(client, trigger_queue())
    failed = await wait_for_state(conn, bad.id, "failed", timeout=1.0)
    assert "closure exploded" in failed["errors"][-1]["error"]
    [audit] = await wait_follow_ups(conn, 1, kind="audit_entry")
    assert audit["args"] == {"user_id": 1}
    # The hook is dispatched just after the commit that the test saw: wait for it.
    await wait_for(lambda: len(recorder.names(bad.id)) == 2)
    assert recorder.names(bad.id) == ["Started", "Exhausted"]


async def test_failing_failure_follow_ups_still_record_the_failure(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """When the failure's own follow-ups (here the Retried spec) fail as well, the failed
    attempt is committed without follow-ups rather than left running."""

    @client.on_completed_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        raise RuntimeError("completion spec exploded")

    @client.on_retried_enqueue(Signup)
    def on_retry(args: Signup, job: awa.JobRow, error: str, attempt: int, at: object) -> None:
        raise RuntimeError("retry spec exploded")

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    bad = await insert_trigger(client, 13)
    await start(client, trigger_queue())
    retryable = await wait_for_state(conn, bad.id, "retryable", timeout=1.0)
    assert "completion spec exploded" in retryable["errors"][-1]["error"]
    assert follow_ups(conn) == []


class ClosureCrash(BaseException):
    """A BaseException that is not an Exception."""


@pytest.mark.parametrize(
    "raised", [ClosureCrash("crash"), asyncio.CancelledError("own")], ids=["base", "cancelled"]
)
async def test_closure_raising_a_base_exception_rolls_back_like_any_error(
    client: awa.AsyncClient, conn: Conn, raised: BaseException
) -> None:
    """A closure raising a BaseException subclass, or a CancelledError of its own, is a
    failing closure like any other: rolled back, counted, the attempt recorded as failed,
    and the worker goes on."""

    @client.on_completed_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        if args.user_id == 13:
            raise raised
        return welcome(args, job)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "signup"})
    bad = await insert_trigger(client, 13)
    await start(client, trigger_queue(max_workers=1))
    await wait_for(lambda: failures.delta() == 1)
    retryable = await wait_for_state(conn, bad.id, "retryable", timeout=1.0)
    assert type(raised).__name__ in retryable["errors"][-1]["error"]
    good = await insert_trigger(client, 14)
    await wait_for_state(conn, good.id, "completed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["args"]["triggered_by_job_id"] == good.id


async def test_with_closure_routes_to_queue_and_priority(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.2.3: a _with closure's .queue().priority() are respected."""
    client.on_completed_enqueue_with(
        Signup,
        lambda args, job: awa.EnqueueRequest(welcome(args, job)).queue("emails").priority(1),
    )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, "completed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["queue"] == "emails"
    assert follow_up["priority"] == 1
    assert follow_up["args"] == {"user_id": 42, "triggered_by_job_id": trigger.id}


async def test_cancelled_inserts_follow_up(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.2.4: the handler cancels -> trigger cancelled, follow-up inserted; the closure got
    the reason and the cancelled row."""
    seen: list[tuple[str, awa.JobState]] = []

    @client.on_cancelled_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow, reason: str) -> WelcomeEmail:
        seen.append((reason, job.state))
        return welcome(args, job)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> awa.Cancel:
        return awa.Cancel("user deleted")

    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    db = await wait_for_state(conn, trigger.id, "cancelled")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["args"] == {"user_id": 42, "triggered_by_job_id": trigger.id}
    assert seen == [("user deleted", awa.JobState.CANCELLED)]
    assert created_at(conn, follow_up["id"]) == db["finalized_at"]


@pytest.mark.parametrize("how", ["terminal", "last_attempt_raises", "last_attempt_retry_after"])
async def test_exhausted_inserts_follow_up(client: awa.AsyncClient, conn: Conn, how: str) -> None:
    """§8.2.5: a terminal error, or a failure on the last attempt -> trigger failed and the
    follow-up inserted; the closure got the error text and the attempt."""
    seen: list[tuple[str, int, awa.JobState]] = []

    @client.on_exhausted_enqueue(Signup)
    def spec(args: Signup, job: awa.JobRow, error: str, attempt: int) -> WelcomeEmail:
        seen.append((error, attempt, job.state))
        return welcome(args, job)

    retried: list[int] = []
    client.on_retried_enqueue(Signup, lambda args, job, error, attempt, when: retried.append(1))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> awa.RetryAfter:
        if how == "terminal":
            raise awa.TerminalError("card declined")
        if how == "last_attempt_raises":
            raise RuntimeError("card declined")
        return awa.RetryAfter(0.01)

    trigger = await insert_trigger(client, max_attempts=5 if how == "terminal" else 1)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, "failed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["args"] == {"user_id": 42, "triggered_by_job_id": trigger.id}
    [(error, attempt, state)] = seen
    assert attempt == 1
    assert state is awa.JobState.FAILED
    if how == "last_attempt_retry_after":
        assert "max_attempts exhausted" in error
    else:
        assert "card declined" in error
    assert retried == []


async def test_retried_inserts_follow_up_per_retry(client: awa.AsyncClient, conn: Conn) -> None:
    """§8.2.6: a retryable error with attempts left -> a follow-up per retried attempt; the
    closure got the error, the attempt and next_run_at (= the committed row's run_at). The
    last attempt exhausts instead and fires the Exhausted spec, not the Retried one."""
    seen: list[tuple[str, int, dt.datetime, dt.datetime, awa.JobState]] = []

    @client.on_retried_enqueue(Signup)
    def on_retry(
        args: Signup, job: awa.JobRow, error: str, attempt: int, next_run_at: dt.datetime
    ) -> WelcomeEmail:
        seen.append((error, attempt, next_run_at, job.run_at, job.state))
        return welcome(args, job)

    client.on_exhausted_enqueue(Signup, lambda args, job, error, attempt: AuditEntry(attempt))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        raise RuntimeError(f"smtp down {job.attempt}")

    trigger = await insert_trigger(client, max_attempts=3)
    await start(client, trigger_queue(retry=awa.RetryPolicy(max_delay=0.05)))
    await wait_for_state(conn, trigger.id, "failed")
    await no_longer_in_flight(client, trigger.id)
    rows = follow_ups(conn)
    assert [r["args"] for r in rows] == [{"user_id": 42, "triggered_by_job_id": trigger.id}] * 2
    assert [(error.split("\n")[0], attempt) for error, attempt, *_ in seen] == [
        ("RuntimeError: smtp down 1", 1),
        ("RuntimeError: smtp down 2", 2),
    ]
    for _, _, next_run_at, run_at, state in seen:
        assert next_run_at == run_at
        assert state is awa.JobState.RETRYABLE
    [audit] = follow_ups(conn, "audit_entry")
    assert audit["args"] == {"user_id": 3}


async def test_retry_after_with_attempts_left_passes_an_empty_error(
    client: awa.AsyncClient, conn: Conn
) -> None:
    seen: list[tuple[str, int]] = []

    @client.on_retried_enqueue_with(Signup)
    def spec(
        args: Signup, job: awa.JobRow, error: str, attempt: int, next_run_at: dt.datetime
    ) -> None:
        seen.append((error, attempt))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> awa.RetryAfter | None:
        return awa.RetryAfter(0.05) if job.attempt == 1 else None

    trigger = await insert_trigger(client, max_attempts=3)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, "completed")
    assert seen == [("", 1)]
    assert follow_ups(conn) == []


@pytest.mark.parametrize("outcome", ["completed", "cancelled", "retried", "exhausted"])
async def test_with_variant_of_each_outcome_inserts_its_request(
    client: awa.AsyncClient, conn: Conn, outcome: str
) -> None:
    """Every outcome's _with variant: the closure gets the outcome's values after
    (args, job) and its EnqueueRequest is inserted with the request's options."""
    received: list[tuple[Any, ...]] = []

    def spec(args: Signup, job: awa.JobRow, *values: Any) -> awa.EnqueueRequest[WelcomeEmail]:
        received.append((args, job.id, job.state, *values))
        return awa.EnqueueRequest(welcome(args, job)).queue(f"after_{outcome}").priority(4)

    getattr(client, f"on_{outcome}_enqueue_with")(Signup, spec)
    state = {
        "completed": "completed",
        "cancelled": "cancelled",
        "retried": "retryable",
        "exhausted": "failed",
    }[outcome]

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> awa.Cancel | None:
        if outcome == "cancelled":
            return awa.Cancel("bye")
        if outcome == "retried":
            raise RuntimeError("again")
        if outcome == "exhausted":
            raise awa.TerminalError("never")
        return None

    trigger = await insert_trigger(client, max_attempts=3)
    await start(client, trigger_queue())
    db = await wait_for_state(conn, trigger.id, state)
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["queue"] == f"after_{outcome}"
    assert follow_up["priority"] == 4
    assert follow_up["args"] == {"user_id": 42, "triggered_by_job_id": trigger.id}
    [(args, job_id, job_state, *values)] = received
    assert (args, job_id, job_state) == (Signup(42), trigger.id, awa.JobState(state))
    if outcome == "cancelled":
        assert values == ["bye"]
    elif outcome == "retried":
        error, attempt, next_run_at = values
        assert error.startswith("RuntimeError: again")
        assert (attempt, next_run_at) == (1, db["run_at"])
    elif outcome == "exhausted":
        error, attempt = values
        assert error.startswith("awa.errors.TerminalError: never")
        assert attempt == 1
    else:
        assert values == []


# §8.3 conditional follow-ups ---------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["completed", "cancelled", "retried", "exhausted"])
async def test_with_returning_none_commits_the_trigger_alone(
    client: awa.AsyncClient, conn: Conn, outcome: str
) -> None:
    """§8.3.1: a _with closure returning None -> the transition commits, no follow-up."""
    calls: list[str] = []

    def nothing(*args: Any) -> None:
        calls.append(outcome)
        return None

    register = getattr(client, f"on_{outcome}_enqueue_with")
    register(Signup, nothing)
    expected = {
        "completed": "completed",
        "cancelled": "cancelled",
        "retried": "retryable",
        "exhausted": "failed",
    }[outcome]

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> awa.Cancel | None:
        if outcome == "cancelled":
            return awa.Cancel("no")
        if outcome == "retried":
            raise RuntimeError("again")
        if outcome == "exhausted":
            raise awa.TerminalError("never")
        return None

    trigger = await insert_trigger(client, max_attempts=3)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, expected)
    await no_longer_in_flight(client, trigger.id)
    assert calls == [outcome]
    assert jobs_of_kind(conn, "signup")[0]["state"] == expected
    assert len(jobs_of_kind(conn, "signup")) == 1
    count = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert count is not None
    assert count[0] == 1


async def test_completed_spec_returning_none_completes_in_a_batch(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.2: a kind with a Completed spec whose closure returns None still completes (the
    closure runs on the committed, completed row); completions with follow-up specs are
    batched like plain ones (DESIGN §4.7), so with a long completion linger the five jobs
    share one transaction and its finalized_at."""
    seen: list[tuple[int, awa.JobState]] = []

    @client.on_completed_enqueue_with(Signup)
    def spec(args: Signup, job: awa.JobRow) -> None:
        seen.append((job.id, job.state))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    triggers = await client.insert_many([Signup(n) for n in range(5)], queue=TRIGGERS)
    await start(client, trigger_queue(), completion_linger=0.5)
    await wait_for_all(conn, "completed", 5)
    assert sorted(seen) == sorted((t.id, awa.JobState.COMPLETED) for t in triggers)
    assert follow_ups(conn) == []
    stamps = {finalized_at(conn, t.id) for t in triggers}
    assert len(stamps) == 1


async def test_kinds_without_specs_still_complete_through_the_batch(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A kind whose specs are for other outcomes (and a kind with none) completes on the
    batched path: with a long linger, one statement completes them together."""
    client.on_cancelled_enqueue(Signup, welcome)
    client.on_exhausted_enqueue(Signup, lambda args, job, error, attempt: AuditEntry(0))
    client.on_completed_enqueue(Flaky, lambda args, job: AuditEntry(args.user_id))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    @client.task(AuditEntry, queue=TRIGGERS)
    async def audit(job: awa.Job[AuditEntry]) -> None:
        return None

    triggers = await client.insert_many([Signup(n) for n in range(5)], queue=TRIGGERS)
    plain = await client.insert_many([AuditEntry(n) for n in range(5)], queue=TRIGGERS)
    await start(client, trigger_queue(max_workers=10), completion_linger=0.5)
    await wait_for_all(conn, "completed", 10)
    stamps = {finalized_at(conn, job.id) for job in [*triggers, *plain]}
    assert len(stamps) < 10, "every job got its own transaction"
    assert follow_ups(conn) == []


# Options, validation, ordering -------------------------------------------------------------


async def test_enqueue_request_chain_sets_every_option(client: awa.AsyncClient, conn: Conn) -> None:
    later = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=2)

    @client.on_completed_enqueue_with(Signup)
    def spec(args: Signup, job: awa.JobRow) -> awa.EnqueueRequest[WelcomeEmail]:
        return (
            awa.EnqueueRequest(welcome(args, job))
            .queue("emails")
            .priority(3)
            .max_attempts(7)
            .metadata({"source": "signup", "n": 1})
            .tags(["welcome", "v2"])
            .unique(awa.UniqueOpts(by_queue=True))
            .run_at(later)
            .deadline_duration(42)
            .ordering_key("user-42")
        )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, "completed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["queue"] == "emails"
    assert follow_up["priority"] == 3
    assert follow_up["max_attempts"] == 7
    assert follow_up["metadata"] == {
        "source": "signup",
        "n": 1,
        # The lineage: the job whose outcome inserted it (the UI walks chains with it).
        "awa:trigger": {
            "id": trigger.id,
            "kind": "signup",
            "outcome": "completed",
            "via": "follow_up",
        },
    }
    assert follow_up["tags"] == ["welcome", "v2"]
    assert follow_up["unique_key"] is not None
    assert follow_up["state"] == "scheduled"
    assert follow_up["run_at"] == later
    assert follow_up["deadline_duration"] == dt.timedelta(seconds=42)
    assert bytes(follow_up["ordering_key"]) == b"user-42"


async def test_with_opts_replaces_earlier_options(client: awa.AsyncClient, conn: Conn) -> None:
    @client.on_completed_enqueue_with(Signup)
    def spec(args: Signup, job: awa.JobRow) -> awa.EnqueueRequest[WelcomeEmail]:
        return (
            awa.EnqueueRequest(welcome(args, job))
            .queue("ignored")
            .priority(1)
            .tags(["ignored"])
            .with_opts(awa.InsertOpts(queue="chosen", max_attempts=3))
            .metadata({"after": True})
        )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    await wait_for_state(conn, trigger.id, "completed")
    [follow_up] = await wait_follow_ups(conn, 1)
    assert follow_up["queue"] == "chosen"
    assert follow_up["priority"] == 2  # the default again: with_opts replaced priority(1)
    assert follow_up["max_attempts"] == 3
    assert follow_up["tags"] == []
    assert follow_up["metadata"]["after"] is True  # set after with_opts, so it stays


@pytest.mark.parametrize(
    "request_for",
    [
        lambda follow_up: awa.EnqueueRequest(follow_up).priority(5),
        lambda follow_up: awa.EnqueueRequest(follow_up).max_attempts(0),
        lambda follow_up: awa.EnqueueRequest(follow_up).queue("q" * 201),
        lambda follow_up: awa.EnqueueRequest(follow_up).tags([f"t{n}" for n in range(21)]),
        lambda follow_up: awa.EnqueueRequest({"bad": "nul\x00"}, kind="welcome_email"),
        lambda follow_up: "not a request",
    ],
    ids=["priority", "max_attempts", "queue", "tags", "nul", "wrong_type"],
)
async def test_invalid_follow_up_rolls_back_like_a_raise(
    client: awa.AsyncClient,
    conn: Conn,
    caplog: pytest.LogCaptureFixture,
    request_for: Any,
) -> None:
    """Follow-ups are validated like any insert: an invalid one rolls the trigger back and
    the attempt fails with the validation error."""
    caplog.set_level(logging.ERROR, logger="awa.worker")
    client.on_completed_enqueue_with(Signup, lambda args, job: request_for(welcome(args, job)))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "signup"})
    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    await wait_for(lambda: failures.delta() == 1)
    retryable = await wait_for_state(conn, trigger.id, "retryable", timeout=1.0)
    error = retryable["errors"][-1]["error"]
    assert "follow-up failed" in error
    assert "on_completed_enqueue_with for 'signup'" in error
    assert follow_ups(conn) == []
    assert any(f"job {trigger.id}" in r.getMessage() for r in caplog.records)


async def test_plain_closure_returning_none_is_an_error(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The plain form must return follow-up args; None there is a mistake (the _with form
    is the conditional one), so the trigger is rolled back."""
    client.on_completed_enqueue(Signup, lambda args, job: None)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    failures = Counters.capture("awa.job.follow_up_failures", **{"awa.job.kind": "signup"})
    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    await wait_for(lambda: failures.delta() == 1)
    retryable = await wait_for_state(conn, trigger.id, "retryable", timeout=1.0)
    assert "returned None" in retryable["errors"][-1]["error"]


async def test_several_specs_run_in_registration_order(client: awa.AsyncClient, conn: Conn) -> None:
    """Specs of one outcome and kind run in registration order, plain and _with mixed, and
    all insert in the trigger's transaction; specs of other outcomes do not run."""
    order: list[str] = []

    def first(args: Signup, job: awa.JobRow) -> WelcomeEmail:
        order.append("first")
        return welcome(args, job)

    def second(args: Signup, job: awa.JobRow) -> awa.EnqueueRequest[AuditEntry]:
        order.append("second")
        return awa.EnqueueRequest(AuditEntry(args.user_id)).queue("audit")

    async def third(args: Signup, job: awa.JobRow) -> AuditEntry:
        order.append("third")
        return AuditEntry(-args.user_id)

    client.on_completed_enqueue(Signup, first)
    client.on_completed_enqueue_with(Signup, second)
    client.on_completed_enqueue(Signup, third)
    client.on_cancelled_enqueue(Signup, lambda args, job, reason: order.append("cancel"))

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    trigger = await insert_trigger(client)
    await start(client, trigger_queue())
    db = await wait_for_state(conn, trigger.id, "completed")
    await no_longer_in_flight(client, trigger.id)
    assert order == ["first", "second", "third"]
    [email] = follow_ups(conn)
    audits = follow_ups(conn, "audit_entry")
    assert [a["args"]["user_id"] for a in audits] == [42, -42]
    assert [a["queue"] for a in audits] == ["audit", "default"]
    assert email["id"] < audits[0]["id"] < audits[1]["id"]
    for job in (email, *audits):
        assert created_at(conn, job["id"]) == db["finalized_at"]


async def test_stale_outcome_inserts_no_follow_up(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """The first attempt's row is moved away (as a rescue would) and a second runtime
    completes the job (one follow-up). When the first handler finishes, its guarded
    completion matches nothing: no second follow-up and no event."""
    release = threading.Event()
    recorder = Recorder()
    client.on_event(Signup, recorder)
    client.on_completed_enqueue(Signup, welcome)

    @client.task(Signup, queue=TRIGGERS)
    async def slow(job: awa.Job[Signup]) -> None:
        await asyncio.to_thread(release.wait, 10)

    trigger = await insert_trigger(client)
    await start(client, trigger_queue(max_workers=1, prefetch=0))
    await wait_for_state(conn, trigger.id, "running")
    conn.execute(
        "UPDATE awa.jobs SET state = 'available', heartbeat_at = NULL WHERE id = %s",
        (trigger.id,),
    )
    async with second_client(database_url) as other:
        other.on_completed_enqueue(Signup, welcome)

        @other.task(Signup, queue=TRIGGERS)
        async def quick(job: awa.Job[Signup]) -> None:
            return None

        await start(other, trigger_queue())
        await wait_for_state(conn, trigger.id, "completed")
        await other.shutdown()
    release.set()
    await no_longer_in_flight(client, trigger.id)
    await hooks_idle(client)
    [follow_up] = follow_ups(conn)
    assert follow_up["args"]["triggered_by_job_id"] == trigger.id
    assert recorder.of(awa.Completed) == []


# Deduplication ---------------------------------------------------------------------------


async def test_duplicate_follow_up_is_skipped_and_both_triggers_commit(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.3: two triggers ask for the same follow-up with UniqueOpts() -> both triggers
    complete, one follow-up exists, the second is counted as a duplicate."""
    client.on_completed_enqueue_with(
        Signup,
        lambda args, job: awa.EnqueueRequest(AuditEntry(args.user_id)).unique(awa.UniqueOpts()),
    )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    inserted = Counters.capture(
        "awa.job.follow_ups_committed", **{"awa.follow_up.result": "inserted"}
    )
    duplicates = Counters.capture(
        "awa.job.follow_ups_committed", **{"awa.follow_up.result": "duplicate"}
    )
    first = await insert_trigger(client, 7)
    second = await insert_trigger(client, 7)
    await start(client, trigger_queue())
    await wait_for_state(conn, first.id, "completed")
    await wait_for_state(conn, second.id, "completed")
    await no_longer_in_flight(client, second.id)
    await no_longer_in_flight(client, first.id)
    [audit] = follow_ups(conn, "audit_entry")
    assert audit["args"] == {"user_id": 7}
    assert inserted.delta() == 1
    assert duplicates.delta() == 1


async def test_dedup_by_args_false_collapses_different_args(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.4: by_args=False -> follow-ups of the kind collapse whatever their args."""
    client.on_completed_enqueue_with(
        Signup,
        lambda args, job: awa.EnqueueRequest(AuditEntry(args.user_id)).unique(
            awa.UniqueOpts(by_args=False)
        ),
    )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    triggers = await client.insert_many([Signup(n) for n in range(4)], queue=TRIGGERS)
    await start(client, trigger_queue())
    await wait_for_all(conn, "completed", 4)
    for trigger in triggers:
        await no_longer_in_flight(client, trigger.id)
    assert len(follow_ups(conn, "audit_entry")) == 1


async def test_dedup_without_completed_state_lasts_while_the_follow_up_is_live(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.5: a states set without completed blocks duplicates only while the follow-up is
    scheduled/available/running/retryable; once it completes, a new trigger inserts anew."""
    live = {"scheduled", "available", "running", "retryable"}
    client.on_completed_enqueue_with(
        Signup,
        lambda args, job: (
            awa.EnqueueRequest(AuditEntry(args.user_id))
            .queue("audit")
            .unique(awa.UniqueOpts(states=live))
        ),
    )
    release = asyncio.Event()

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    @client.task(AuditEntry, queue="audit")
    async def audit(job: awa.Job[AuditEntry]) -> None:
        await release.wait()

    first = await insert_trigger(client, 5)
    await start(client, {**trigger_queue(), **queue("audit")})
    [audit_row] = await wait_follow_ups(conn, 1, "audit_entry")
    await wait_for_state(conn, audit_row["id"], "running")
    second = await insert_trigger(client, 5)  # while the follow-up runs: a duplicate
    await wait_for_state(conn, second.id, "completed")
    await no_longer_in_flight(client, second.id)
    assert len(follow_ups(conn, "audit_entry")) == 1
    release.set()
    await wait_for_state(conn, audit_row["id"], "completed")
    third = await insert_trigger(client, 5)  # the follow-up completed: a new one
    await wait_for_state(conn, third.id, "completed")
    rows = await wait_follow_ups(conn, 2, "audit_entry")
    assert [r["args"] for r in rows] == [{"user_id": 5}, {"user_id": 5}]
    assert first.id != third.id


async def test_default_dedup_keeps_blocking_after_completion(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The default states include completed: a finished follow-up still blocks."""
    client.on_completed_enqueue_with(
        Signup,
        lambda args, job: awa.EnqueueRequest(AuditEntry(args.user_id)).queue("audit").unique(),
    )

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    @client.task(AuditEntry, queue="audit")
    async def audit(job: awa.Job[AuditEntry]) -> None:
        return None

    await insert_trigger(client, 5)
    await start(client, {**trigger_queue(), **queue("audit")})
    [audit_row] = await wait_follow_ups(conn, 1, "audit_entry")
    await wait_for_state(conn, audit_row["id"], "completed")
    again = await insert_trigger(client, 5)
    await wait_for_state(conn, again.id, "completed")
    await no_longer_in_flight(client, again.id)
    assert len(follow_ups(conn, "audit_entry")) == 1


async def test_two_runtimes_racing_for_one_unique_follow_up(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    """Two runtimes (two AsyncClients) complete different triggers, both asking for the
    same unique follow-up: both triggers commit and exactly one follow-up exists. The
    closures meet at a barrier, so both transactions have updated their trigger and are
    still open when the two inserts race."""
    barrier = asyncio.Barrier(2)
    closures: list[tuple[str, int]] = []
    duplicates = Counters.capture(
        "awa.job.follow_ups_committed", **{"awa.follow_up.result": "duplicate"}
    )

    def register(target: awa.AsyncClient, name: str) -> None:
        @target.on_completed_enqueue_with(Signup)
        async def spec(args: Signup, job: awa.JobRow) -> awa.EnqueueRequest[AuditEntry]:
            closures.append((name, job.id))
            await asyncio.wait_for(barrier.wait(), 5)
            return awa.EnqueueRequest(AuditEntry(0)).unique(awa.UniqueOpts())

        @target.task(Signup, queue=TRIGGERS)
        async def handle(job: awa.Job[Signup]) -> None:
            return None

    register(client, "one")
    # One trigger per runtime: each runs its own queue, so neither can take both triggers
    # (its completion batch would then hold both closures).
    first = await insert_trigger(client, 1)
    second = await client.insert(Signup(2), queue="other-signups")
    async with second_client(database_url) as other:
        register(other, "two")
        await start(client, trigger_queue(max_workers=1, prefetch=0))
        await start(other, queue("other-signups", max_workers=1, prefetch=0))
        await wait_for_state(conn, first.id, "completed")
        await wait_for_state(conn, second.id, "completed")
        await wait_for(lambda: duplicates.delta() == 1)
    assert sorted(name for name, _ in closures) == ["one", "two"]
    assert sorted(job_id for _, job_id in closures) == sorted([first.id, second.id])
    [audit] = follow_ups(conn, "audit_entry")
    assert audit["args"] == {"user_id": 0}


async def test_trigger_and_follow_up_on_a_worked_queue(client: awa.AsyncClient, conn: Conn) -> None:
    """End to end: the follow-up is an ordinary job that a worker then runs."""
    done: list[WelcomeEmail] = []
    client.on_completed_enqueue(Signup, welcome)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    @client.task(WelcomeEmail)
    async def send(job: awa.Job[WelcomeEmail]) -> None:
        done.append(job.args)

    trigger = await insert_trigger(client, 9)
    await start(client, {**trigger_queue(), **queue()})
    [follow_up] = await wait_follow_ups(conn, 1)
    await wait_for_state(conn, follow_up["id"], "completed")
    assert done == [WelcomeEmail(9, trigger.id)]


async def test_per_job_completions_count_as_completed_by_the_runtime(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """runtime.completed (read by `awa bench` and progress displays) counts completions of
    the per-job path as well as the batched ones."""
    client.on_completed_enqueue(Signup, welcome)

    @client.task(Signup, queue=TRIGGERS)
    async def handle(job: awa.Job[Signup]) -> None:
        return None

    @client.task(AuditEntry, queue=TRIGGERS)
    async def audit(job: awa.Job[AuditEntry]) -> None:
        return None

    await client.insert_many([Signup(n) for n in range(3)], queue=TRIGGERS)
    await client.insert_many([AuditEntry(n) for n in range(2)], queue=TRIGGERS)
    await start(client, trigger_queue())
    await wait_for_all(conn, "completed", 5)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.completed == 5, message=lambda: f"{runtime.completed}")


def test_counters_route_to_a_meter_provider_set_after_import() -> None:
    """awa.observability.metrics creates its instruments at import, through the OpenTelemetry API's
    global proxy; an SDK provider installed afterwards still receives them (checked in a
    fresh interpreter, where nothing has installed a provider yet)."""
    program = (
        "import awa.observability.metrics as m\n"
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "m.follow_up_failures.add(1, {'awa.job.kind': 'k'})\n"
        "data = reader.get_metrics_data()\n"
        "print([(x.name, [p.value for p in x.data.data_points]) for r in data.resource_metrics"
        " for s in r.scope_metrics for x in s.metrics])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[('awa.job.follow_up_failures', [1])]"


async def test_follow_up_insert_refused_by_the_database_fails_the_attempt(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A follow-up that passes validation but that the database refuses (here a trigger
    raises for its kind) is a failed follow-up like a raising closure: the attempt is
    recorded as failed with the database's message, not left running."""
    refuse = "BEGIN RAISE EXCEPTION 'refused by a trigger'; END"
    with job_insert_trigger(conn, "awa_test_refuse", refuse, "NEW.kind = 'audit_entry'"):
        client.on_completed_enqueue(Signup, lambda args, job: AuditEntry(args.user_id))

        @client.task(Signup, queue=TRIGGERS)
        async def handle(job: awa.Job[Signup]) -> None:
            return None

        trigger = await insert_trigger(client)
        await start(client, trigger_queue())
        retryable = await wait_for_state(conn, trigger.id, "retryable", timeout=1.0)
        error = retryable["errors"][-1]["error"]
        assert "inserting the follow-ups of on_completed_enqueue for 'signup'" in error
        assert "refused by a trigger" in error
        assert follow_ups(conn, "audit_entry") == []
        await client.shutdown()
