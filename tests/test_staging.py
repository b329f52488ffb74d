"""Handler-staged follow-ups (issue "Handler-staged follow-ups, job outputs and the testing
harness"): ``job.enqueue_on_completion`` on the worker path.

Semantics (seed lifecycle-hooks.md "Handler-staged follow-ups", DESIGN §2 and §4.7,
semantics.md §7.9 and §8.3 items 7-13): staged follow-ups are inserted in the completion's
transaction, after the registered Completed specs, skipping held unique keys; every other
outcome discards them (WaitForCallback with a warning and a counter); staging validates
eagerly and a failed stage fails the attempt; limits per attempt; staging is sealed when the
handler returns; a job that stages takes the per-job transaction, others stay batched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

import awa
from awa.lifecycle.followups import FollowUpRegistry
from awa.testing import HandlerJob
from awa.worker import results
from awa.worker.finalizer import Finalizer
from helpers_lifecycle import Counters, Recorder, hooks_idle, jobs_of_kind, metric_reader
from helpers_worker import (
    no_longer_in_flight,
    queue,
    second_client,
    start,
    wait_for,
    wait_for_all,
    wait_for_state,
)
from jobs_helpers import Conn, must_job_row, writer_xid

QUEUE = "stage_a"
COMMITTED = "awa.job.staged_follow_ups_committed"
DISCARDED = "awa.job.staged_follow_ups_discarded"


@dataclasses.dataclass
class StageA:
    item: int


@dataclasses.dataclass
class StageB:
    item_id: int


@dataclasses.dataclass
class Audit:
    item: int


@dataclasses.dataclass
class Unhandled:
    item_id: int


@pytest.fixture(autouse=True)
def _metrics() -> None:
    metric_reader()


async def resolve_item(args: StageA) -> int:
    await asyncio.sleep(0)
    return args.item * 10


def stage_b_rows(conn: Conn) -> list[dict[str, Any]]:
    return jobs_of_kind(conn, "stage_b")


def xmin(conn: Conn, job_id: int) -> str:
    return writer_xid(conn, job_id)


def stage_queue(**options: Any) -> dict[str, Any]:
    return queue(QUEUE, **options)


# §8.3.7: inserted with the completion, after the registered specs -----------------------------


async def test_founding_example_inserts_the_staged_follow_up_after_the_specs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The founding document's Python example, verbatim: the follow-up is inserted in the
    completion's transaction (same xmin as the completed trigger), after the registered
    Completed spec's follow-up, and counted as inserted."""
    client.on_completed_enqueue(StageA, lambda args, job: Audit(args.item))
    inserted = Counters.capture(COMMITTED, **{"awa.follow_up.result": "inserted"})

    @client.task(StageA, queue="stage_a")
    async def resolve(job):
        item_id = await resolve_item(job.args)
        job.enqueue_on_completion(StageB(item_id=item_id), unique_opts={})

    await start(client, stage_queue())
    trigger = await client.insert(StageA(item=4), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()

    [audit] = jobs_of_kind(conn, "audit")
    [staged] = stage_b_rows(conn)
    assert staged["args"] == {"item_id": 40}
    assert staged["state"] == "available"
    assert staged["queue"] == "default"
    assert staged["unique_key"] is not None
    assert audit["id"] < staged["id"], "the staged follow-up goes in after the specs'"
    assert xmin(conn, trigger.id) == xmin(conn, staged["id"]) == xmin(conn, audit["id"])
    assert inserted.delta() == 1


async def test_staged_follow_up_keeps_its_insert_options(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Every keyword of Transaction.insert is honoured; a def handler can stage too."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)

    @client.task(StageA, queue=QUEUE)
    def resolve(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(
            {"item_id": job.args.item},
            kind="stage_b",
            queue="elsewhere",
            priority=1,
            max_attempts=3,
            tags=["staged"],
            metadata={"from": job.id},
            run_at=later,
            ordering_key="k",
            deadline_duration=30,
        )

    await start(client, stage_queue())
    trigger = await client.insert(StageA(item=5), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    [staged] = stage_b_rows(conn)
    assert staged["queue"] == "elsewhere"
    assert staged["priority"] == 1
    assert staged["max_attempts"] == 3
    assert staged["tags"] == ["staged"]
    assert staged["metadata"] == {
        "from": trigger.id,
        "awa:trigger": {
            "id": trigger.id,
            "kind": "stage_a",
            "outcome": "completed",
            "via": "staged",
        },
    }
    assert staged["state"] == "scheduled"
    assert staged["run_at"] == later
    assert staged["ordering_key"] == b"k"
    assert staged["deadline_duration"] == dt.timedelta(seconds=30)


async def test_sixteen_staged_follow_ups_are_all_inserted(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(StageA, queue=QUEUE)
    async def fan_out(job: awa.Job[StageA]) -> None:
        for n in range(awa.MAX_STAGED_FOLLOW_UPS):
            job.enqueue_on_completion(StageB(n))

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    assert [r["args"]["item_id"] for r in stage_b_rows(conn)] == list(range(16))


# §8.3.8: every other outcome discards them; a retried attempt starts empty ------------------


class Panic(BaseException):
    """Something a handler raises that is not even an Exception."""


OUTCOMES: dict[str, tuple[Callable[[], Any], str]] = {
    "retry_after": (lambda: awa.RetryAfter(0.01), "completed"),
    "snooze": (lambda: awa.Snooze(0.01), "completed"),
    "cancel": (lambda: awa.Cancel("no"), "cancelled"),
    "error": (lambda: RuntimeError("boom"), "completed"),
    "terminal_error": (lambda: awa.TerminalError("bad"), "failed"),
    "panic": (lambda: Panic("panic"), "completed"),
}


@pytest.mark.parametrize("name", list(OUTCOMES))
async def test_other_outcomes_discard_staged_follow_ups(
    name: str, client: awa.AsyncClient, conn: Conn
) -> None:
    """The first attempt stages and then retries, snoozes, cancels or raises: nothing is
    inserted, and an attempt that runs again starts with nothing staged."""
    make, final_state = OUTCOMES[name]
    staged_on_rerun: list[int] = []

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> Any:
        if staged_on_rerun or job.metadata.get("rerun"):
            staged_on_rerun.append(len(job.staged))
            return None
        job.enqueue_on_completion(StageB(job.args.item))
        staged_on_rerun.append(-1)  # the first run
        result = make()
        if isinstance(result, BaseException):
            raise result
        return result

    fast_retry = awa.RetryPolicy(max_delay=0.01)
    await start(client, stage_queue(retry=fast_retry), promote_interval=0.02)
    trigger = await client.insert(StageA(1), queue=QUEUE, max_attempts=3)
    await wait_for_state(conn, trigger.id, final_state)
    await client.shutdown()
    assert stage_b_rows(conn) == []
    assert staged_on_rerun == ([-1, 0] if final_state == "completed" else [-1])


async def test_a_rescued_attempt_inserts_nothing_and_its_rerun_starts_empty(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Deadline rescue takes the job from its attempt; that attempt then completes, but its
    completion is stale and inserts nothing. The rerun starts with an empty buffer."""
    staged_at_start: list[int] = []

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        staged_at_start.append(len(job.staged))
        if job.attempt > 1:
            return
        job.enqueue_on_completion(StageB(job.args.item))
        while not job.is_cancelled():
            await asyncio.sleep(0.01)

    await start(
        client,
        stage_queue(deadline_duration=0.3),
        deadline_rescue_interval=0.1,
        heartbeat_staleness=3600.0,
    )
    trigger = await client.insert(StageA(1), queue=QUEUE, max_attempts=2)
    final = await wait_for_state(conn, trigger.id, "completed", timeout=10)
    await client.shutdown()
    assert final["attempt"] == 2
    assert staged_at_start == [0, 0]
    assert stage_b_rows(conn) == []


async def test_an_attempt_superseded_by_a_new_lease_inserts_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """While the handler runs, its lease moves on (as when another worker re-claims the
    job); its completion is stale and its staged follow-up is dropped with it."""
    superseded = asyncio.Event()

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(job.args.item))
        await superseded.wait()

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "running")
    conn.execute("UPDATE awa.jobs SET run_lease = run_lease + 1 WHERE id = %s", (trigger.id,))
    superseded.set()
    await no_longer_in_flight(client, trigger.id)
    await client.shutdown()
    assert stage_b_rows(conn) == []
    assert (await client.get_job(trigger.id)).state is awa.JobState.RUNNING  # type: ignore[union-attr]


async def test_a_completion_superseded_by_a_unique_holder_inserts_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The job's unique key covers only 'completed'; a duplicate completes while it runs, so
    its own completion would collide: it is cancelled as superseded, and its staged
    follow-up is not inserted."""
    release = asyncio.Event()
    unique = {"states": {"completed"}}

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(job.args.item))
        await release.wait()

    await start(client, stage_queue())
    first = await client.insert(StageA(1), queue=QUEUE, unique_opts=unique)
    await wait_for_state(conn, first.id, "running")
    duplicate = await client.insert(StageA(1), queue="parked", unique_opts=unique)
    conn.execute(
        "UPDATE awa.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
        (duplicate.id,),
    )
    release.set()
    final = await wait_for_state(conn, first.id, "cancelled")
    await client.shutdown()
    assert "newer job holds its unique key" in final["errors"][-1]["error"]
    assert stage_b_rows(conn) == []


# §8.3.9: WaitForCallback discards with a warning and a counter -------------------------------


async def test_wait_for_callback_discards_with_a_warning_and_a_counter(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    discarded = Counters.capture(DISCARDED, **{"awa.job.kind": "stage_a"})
    tokens: list[awa.CallbackToken] = []

    @client.task(StageA, queue=QUEUE)
    async def park(job: awa.Job[StageA]) -> awa.WaitForCallback:
        job.enqueue_on_completion(StageB(1))
        job.enqueue_on_completion(StageB(2))
        tokens.append(await job.register_callback())
        return awa.WaitForCallback(tokens[-1])

    caplog.set_level(logging.WARNING, logger="awa.worker")
    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "waiting_external")
    assert discarded.delta() == 2
    warnings = [r for r in caplog.records if "staged follow-up" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert f"job {trigger.id}" in warnings[0].getMessage()

    # Completing the callback later inserts nothing from the discarded buffer.
    await client.complete_external(tokens[0])
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    assert stage_b_rows(conn) == []


async def test_staging_after_waiting_in_the_handler_is_inserted(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """To build a follow-up from a callback payload: wait in the handler, then stage."""

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        token = await job.register_callback()
        payload = await job.wait_for_callback(token)
        job.enqueue_on_completion(StageB(payload["item_id"]))

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    row = await wait_for_state(conn, trigger.id, "waiting_external")
    await client.resume_external(str(row["callback_id"]), {"item_id": 99})
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    assert [r["args"] for r in stage_b_rows(conn)] == [{"item_id": 99}]


# §8.3.10: eager validation; a failed stage fails the attempt ---------------------------------


def _far_run_at() -> dt.datetime:
    # Year 9999 in its own zone, year 10000 in UTC.
    return dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5)))


INVALID: dict[str, tuple[Any, dict[str, Any]]] = {
    "priority_5": (StageB(1), {"priority": 5}),
    "priority_0": (StageB(1), {"priority": 0}),
    "max_attempts_0": (StageB(1), {"max_attempts": 0}),
    "max_attempts_1001": (StageB(1), {"max_attempts": 1001}),
    "kind_201": (StageB(1), {"kind": "k" * 201}),
    "queue_201": (StageB(1), {"queue": "q" * 201}),
    "21_tags": (StageB(1), {"tags": [f"t{n}" for n in range(21)]}),
    "nul_in_args": ({"item_id": "a\x00b"}, {"kind": "stage_b"}),
    "nul_in_tag": (StageB(1), {"tags": ["a\x00"]}),
    "nul_in_queue": (StageB(1), {"queue": "a\x00"}),
    "nul_in_metadata": (StageB(1), {"metadata": {"k": "\x00"}}),
    "run_at_year_10000": (StageB(1), {"run_at": _far_run_at()}),
    "naive_run_at": (StageB(1), {"run_at": dt.datetime(2030, 1, 1)}),
    "unserializable_args": ({"item_id": object()}, {"kind": "stage_b"}),
    "args_not_a_class_or_dict": (42, {}),
    "dict_without_kind": ({"item_id": 1}, {}),
    "nan_in_args": ({"item_id": float("nan")}, {"kind": "stage_b"}),
    "bad_unique_opts": (StageB(1), {"unique_opts": {"nope": True}}),
    "unknown_keyword": (StageB(1), {"queues": "x"}),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_stage_raises_staging_error(name: str) -> None:
    args, kwargs = INVALID[name]
    job = HandlerJob(StageA(1))
    with pytest.raises(awa.StagingError) as raised:
        job.enqueue_on_completion(args, **kwargs)
    assert isinstance(raised.value, awa.TerminalError)
    assert "cannot stage the follow-up" in str(raised.value)
    assert job.staged == ()
    assert job.staging_error == str(raised.value)


async def test_an_uncaught_staging_error_fails_the_job_terminally(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(1), priority=5)

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE, max_attempts=5)
    final = await wait_for_state(conn, trigger.id, "failed")
    await client.shutdown()
    assert final["attempt"] == 1
    [entry] = final["errors"]
    assert entry["terminal"] is True
    assert "awa.errors.StagingError" in entry["error"]
    assert "priority" in entry["error"]


async def test_a_swallowed_staging_error_fails_the_completion_terminally(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The handler catches the StagingError and returns: the attempt fails terminally instead
    of completing without its follow-up, and the valid follow-up staged before is dropped."""
    recorder = Recorder()
    client.on_event_kind("stage_a", recorder)

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(1))
        with contextlib.suppress(awa.StagingError):  # exactly what must not complete
            job.enqueue_on_completion(StageB(2), max_attempts=0)

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE, max_attempts=5)
    final = await wait_for_state(conn, trigger.id, "failed")
    [exhausted] = await recorder.wait(awa.Exhausted, trigger.id)
    await hooks_idle(client)
    await client.shutdown()
    assert final["attempt"] == 1
    assert final["errors"][-1]["terminal"] is True
    assert "could not be staged" in exhausted.error
    assert "max_attempts" in exhausted.error
    assert recorder.of(awa.Completed) == []
    assert stage_b_rows(conn) == []


async def test_a_swallowed_staging_error_before_a_retry_keeps_the_retry(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Only a completion is turned into a failure; a retry the handler asks for stands."""

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> awa.RetryAfter | None:
        if job.attempt == 1:
            with pytest.raises(awa.StagingError):
                job.enqueue_on_completion(StageB(1), priority=9)
            return awa.RetryAfter(0.01)
        return None

    await start(client, stage_queue(), promote_interval=0.02)
    trigger = await client.insert(StageA(1), queue=QUEUE)
    final = await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    assert final["attempt"] == 2


# §8.3.11: limits per attempt ------------------------------------------------------------------


def test_the_seventeenth_follow_up_is_refused() -> None:
    job = HandlerJob(StageA(1))
    for n in range(16):
        job.enqueue_on_completion(StageB(n))
    with pytest.raises(awa.StagingError, match="at most 16 follow-ups"):
        job.enqueue_on_completion(StageB(16))
    assert len(job.staged) == 16
    assert job.staging_error is not None


def test_more_than_64_kib_is_refused() -> None:
    job = HandlerJob(StageA(1))
    big = {"blob": "x" * 40_000}
    first = job.enqueue_on_completion(big, kind="stage_b")
    assert first.size > 40_000
    with pytest.raises(awa.StagingError, match="65536 bytes"):
        job.enqueue_on_completion(big, kind="stage_b")
    assert len(job.staged) == 1
    # Kind, queue, metadata, tags and ordering key count too.
    job2 = HandlerJob(StageA(1))
    padding = "y" * 16_000
    job2.enqueue_on_completion(
        StageB(1), metadata={"m": padding}, tags=[padding], ordering_key=padding
    )
    job2.enqueue_on_completion(StageB(2), metadata={"m": padding})
    with pytest.raises(awa.StagingError, match="MAX_STAGED_BYTES"):
        job2.enqueue_on_completion(StageB(3), tags=[padding])


def test_exactly_64_kib_is_accepted() -> None:
    job = HandlerJob(StageA(1))
    probe = job.enqueue_on_completion({"blob": ""}, kind="stage_b")
    room = awa.MAX_STAGED_BYTES - 2 * probe.size  # what a second item may add to its blob
    job.enqueue_on_completion({"blob": "z" * room}, kind="stage_b")
    assert sum(item.size for item in job.staged) == awa.MAX_STAGED_BYTES
    with pytest.raises(awa.StagingError):
        job.enqueue_on_completion({}, kind="s")
    assert len(job.staged) == 2


async def test_exceeding_the_limit_fails_the_attempt(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        for n in range(17):
            job.enqueue_on_completion(StageB(n))

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    final = await wait_for_state(conn, trigger.id, "failed")
    await client.shutdown()
    assert "MAX_STAGED_FOLLOW_UPS" in final["errors"][-1]["error"]
    assert stage_b_rows(conn) == []


# §8.3.12: staging is sealed when the handler returns -------------------------------------------


async def test_a_task_staging_after_the_handler_returned_is_sealed(
    client: awa.AsyncClient, conn: Conn
) -> None:
    late: list[BaseException | None] = []
    done = asyncio.Event()
    background: set[asyncio.Task[None]] = set()

    async def stage_later(job: awa.Job[StageA]) -> None:
        await asyncio.sleep(0.1)
        try:
            job.enqueue_on_completion(StageB(2))
            late.append(None)
        except awa.StagingError as error:
            late.append(error)
        try:
            job.record_output({"late": True})
        except awa.StagingError as error:
            late.append(error)
        done.set()

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(1))
        task = asyncio.create_task(stage_later(job))  # not awaited
        background.add(task)

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await asyncio.wait_for(done.wait(), 5)
    await client.shutdown()
    assert len(late) == 2
    for error in late:
        assert isinstance(error, awa.StagingError)
        assert "sealed" in str(error)
    assert [r["args"] for r in stage_b_rows(conn)] == [{"item_id": 1}]
    assert (await client.get_job(trigger.id)).output is None  # type: ignore[union-attr]


async def test_a_thread_staging_after_a_def_handler_returned_is_sealed(
    client: awa.AsyncClient, conn: Conn
) -> None:
    outcome: list[BaseException | None] = []
    finished = threading.Event()

    @client.task(StageA, queue=QUEUE)
    def handle(job: awa.Job[StageA]) -> None:
        def later() -> None:
            threading.Event().wait(0.2)
            try:
                job.enqueue_on_completion(StageB(2))
                outcome.append(None)
            except awa.StagingError as error:
                outcome.append(error)
            finished.set()

        threading.Thread(target=later).start()

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await wait_for(finished.is_set)
    await client.shutdown()
    assert isinstance(outcome[0], awa.StagingError)
    assert "sealed" in str(outcome[0])
    assert stage_b_rows(conn) == []


# §8.3.13: a duplicate unique follow-up is skipped and counted ----------------------------------


async def test_a_duplicate_staged_follow_up_is_skipped_and_counted(
    client: awa.AsyncClient, conn: Conn
) -> None:
    duplicates = Counters.capture(COMMITTED, **{"awa.follow_up.result": "duplicate"})
    inserted = Counters.capture(COMMITTED, **{"awa.follow_up.result": "inserted"})
    existing = await client.insert(StageB(7), unique_opts={}, queue="parked")

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(StageB(7), unique_opts={})
        job.enqueue_on_completion(StageB(8), unique_opts={})
        job.enqueue_on_completion(StageB(8), unique_opts={})  # a duplicate within the stage

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    await client.shutdown()
    rows = stage_b_rows(conn)
    assert [(r["id"] == existing.id, r["args"]["item_id"]) for r in rows] == [
        (True, 7),
        (False, 8),
    ]
    assert duplicates.delta() == 2
    assert inserted.delta() == 1


# Deploy order: a follow-up of a kind this worker cannot run waits for one that can -----------


async def test_a_staged_follow_up_of_a_kind_this_worker_cannot_run_waits_for_one_that_can(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        job.enqueue_on_completion(Unhandled(1), queue=QUEUE, max_attempts=5)

    await start(client, stage_queue())
    trigger = await client.insert(StageA(1), queue=QUEUE)
    await wait_for_state(conn, trigger.id, "completed")
    [follow_up] = jobs_of_kind(conn, "unhandled")
    later = await client.insert(StageA(2), queue=QUEUE)  # behind the follow-up in the lane
    await wait_for_state(conn, later.id, "completed")
    row = must_job_row(conn, follow_up["id"])
    assert (row["state"], row["attempt"], row["errors"]) == ("available", 0, [])
    async with second_client(database_url) as newer:  # a later release's worker

        @newer.task(Unhandled, queue=QUEUE)
        async def run(job: awa.Job[Unhandled]) -> None:
            pass

        await start(newer, stage_queue())
        final = await wait_for_state(conn, follow_up["id"], "completed")
    await client.shutdown()
    assert final["attempt"] == 1


# Batched path vs per-job transaction ---------------------------------------------------------


def test_only_a_completion_that_staged_needs_its_own_transaction() -> None:
    finalizer = Finalizer(FollowUpRegistry())
    plain = HandlerJob(StageA(1))
    with_output = HandlerJob(StageA(1))
    with_output.record_output({"n": 1})
    staging = HandlerJob(StageA(1))
    staging.enqueue_on_completion(StageB(1))
    completed = results.Completed(0.1)
    assert not finalizer.needs_own_transaction(plain, completed)
    assert not finalizer.needs_own_transaction(with_output, completed)
    assert finalizer.needs_own_transaction(staging, completed)
    assert not finalizer.needs_own_transaction(staging, results.Retry(error="x"))


async def test_staging_jobs_commit_alone_while_others_stay_batched(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """With a long linger, plain completions share one batched statement (one xmin); the
    job that staged commits in a transaction of its own, with its follow-up."""

    @client.task(StageA, queue=QUEUE)
    async def handle(job: awa.Job[StageA]) -> None:
        if job.args.item == 0:
            job.enqueue_on_completion(StageB(0))

    jobs = await client.insert_many([StageA(n) for n in range(5)], queue=QUEUE)
    await start(client, stage_queue(max_workers=8), completion_linger=0.3)
    await wait_for_all(conn, "completed", 5)
    await client.shutdown()
    [staged] = stage_b_rows(conn)
    xmins = {job.args["item"]: xmin(conn, job.id) for job in jobs}
    assert xmins[0] == xmin(conn, staged["id"])
    assert len({xmins[n] for n in range(1, 5)}) == 1, xmins
    assert xmins[0] != xmins[1]
