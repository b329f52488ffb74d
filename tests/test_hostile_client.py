"""Hostile input through the clients (``awa.AsyncClient`` and ``awa.Client``): every bad
value of every argument is refused with a ValidationError naming the argument, before
anything reaches the database, and every awa table is left as it was. Then the checks that
need the database: ``depends_on`` naming jobs that do not exist (or the job itself), and
workflows whose steps are missing, cyclic, or inserted twice.

The table ``CLIENT_ROWS`` has one row per argument (helpers_hostile.Row); a new argument
gets its cases by adding a row."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import inspect
import uuid
from typing import Any

import psycopg
import pytest

import awa
from awa.workflows.operations import Step
from helpers_hostile import (
    FLAGS,
    ID_LISTS,
    IDS,
    LEASES,
    LIMITS,
    NAMES,
    ODD_NAMES,
    PRIORITIES,
    SECONDS,
    TEXT,
    Row,
    assert_names,
    cases,
    row,
    snapshot,
)
from jobs_helpers import Conn, count_jobs, maybe_await, set_state

CALLBACK = "00000000-0000-0000-0000-000000000001"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclasses.dataclass
class Note:
    text: str = "x"


CLIENT_ROWS: list[Row] = [
    # Jobs by id.
    row("get_job", "job id", IDS, lambda c, v: c.get_job(v)),
    row("cancel", "job id", IDS, lambda c, v: c.cancel(v)),
    row("retry", "job id", IDS, lambda c, v: c.retry(v)),
    row("wait", "job_id", IDS, lambda c, v: c.wait(v, timeout=0)),
    row("wait.timeout", "timeout", SECONDS, lambda c, v: c.wait(1, timeout=v)),
    row("wait_many", "job_ids", ID_LISTS, lambda c, v: c.wait_many(v, timeout=0)),
    row("wait_many.timeout", "timeout", SECONDS, lambda c, v: c.wait_many([1], timeout=v)),
    # Listing and filtering.
    row("list_jobs.limit", "limit", LIMITS, lambda c, v: c.list_jobs(limit=v)),
    row("list_jobs.kind", "kind", NAMES, lambda c, v: c.list_jobs(kind=v)),
    row("list_jobs.queue", "queue", NAMES, lambda c, v: c.list_jobs(queue=v)),
    row("list_jobs.state", "state", NAMES, lambda c, v: c.list_jobs(state=v), skip=["int"]),
    row("retry_failed.kind", "kind", NAMES, lambda c, v: c.retry_failed(kind=v)),
    row("retry_failed.queue", "queue", NAMES, lambda c, v: c.retry_failed(queue=v)),
    row("discard_failed", "kind", NAMES, lambda c, v: c.discard_failed(v)),
    row("cancel_by_unique_key.kind", "kind", NAMES, lambda c, v: c.cancel_by_unique_key(v)),
    row(
        "cancel_by_unique_key.queue",
        "queue",
        NAMES,
        lambda c, v: c.cancel_by_unique_key("k", queue=v),
    ),
    row(
        "cancel_by_unique_key.period_bucket",
        "period_bucket",
        {**IDS, "below-bigint": -(2**63) - 1},
        lambda c, v: c.cancel_by_unique_key("k", period_bucket=v),
        skip=["zero", "negative"],  # period numbers can be 0 or negative (before 1970)
    ),
    # Queues.
    row("pause_queue", "queue", NAMES, lambda c, v: c.pause_queue(v)),
    row("pause_queue.paused_by", "paused_by", TEXT, lambda c, v: c.pause_queue("q", paused_by=v)),
    row("resume_queue", "queue", NAMES, lambda c, v: c.resume_queue(v)),
    row("drain_queue", "queue", NAMES, lambda c, v: c.drain_queue(v)),
    # Dead-letter queue.
    row("get_dlq_job", "job id", IDS, lambda c, v: c.get_dlq_job(v)),
    row("purge_dlq_job", "job id", IDS, lambda c, v: c.purge_dlq_job(v)),
    row("move_failed_to_dlq", "job id", IDS, lambda c, v: c.move_failed_to_dlq(v, "manual")),
    row("move_failed_to_dlq.reason", "reason", NAMES, lambda c, v: c.move_failed_to_dlq(1, v)),
    row("retry_from_dlq", "job id", IDS, lambda c, v: c.retry_from_dlq(v)),
    row(
        "retry_from_dlq.priority",
        "priority",
        PRIORITIES,
        lambda c, v: c.retry_from_dlq(1, priority=v),
    ),
    row("retry_from_dlq.queue", "queue", NAMES, lambda c, v: c.retry_from_dlq(1, queue=v)),
    row("list_dlq.limit", "limit", LIMITS, lambda c, v: c.list_dlq(limit=v)),
    row("list_dlq.before_id", "before_id", IDS, lambda c, v: c.list_dlq(before_id=v)),
    row("list_dlq.kind", "kind", NAMES, lambda c, v: c.list_dlq(kind=v)),
    # Tags have no length limit of their own (inserts take any), so a long one only matches
    # nothing.
    row(
        "list_dlq.tag",
        "tag",
        NAMES,
        lambda c, v: c.list_dlq(tag=v),
        skip=["empty", "10000-chars"],
    ),
    row("purge_dlq.queue", "queue", NAMES, lambda c, v: c.purge_dlq(queue=v)),
    row("purge_dlq.before_id", "before_id", IDS, lambda c, v: c.purge_dlq(queue="q", before_id=v)),
    row("dlq_depth.queue", "queue", NAMES, lambda c, v: c.dlq_depth(queue=v)),
    row("bulk_retry_from_dlq.kind", "kind", NAMES, lambda c, v: c.bulk_retry_from_dlq(kind=v)),
    row(
        "bulk_move_failed_to_dlq.reason",
        "reason",
        NAMES,
        lambda c, v: c.bulk_move_failed_to_dlq(queue="q", reason=v),
    ),
    # Batch operations.
    row("list_batch_operations", "limit", LIMITS, lambda c, v: c.list_batch_operations(limit=v)),
    row(
        "purge_batch_operations.limit",
        "limit",
        {**LIMITS, "10001": 10_001},
        lambda c, v: c.purge_batch_operations(NOW, limit=v),
        skip=["1001", "5000"],  # a purge takes up to 10,000
    ),
    row(
        "get_batch_operation",
        "batch operation id",
        {"int": 5, "bool": True, "garbage": "nope", "10000-chars": "x" * 10_000},
        lambda c, v: c.get_batch_operation(v),
    ),
    row("preview_set_priority", "priority", PRIORITIES, lambda c, v: c.preview_set_priority(v)),
    row(
        "set_priority.submitted_by",
        "submitted_by",
        TEXT,
        lambda c, v: c.set_priority(1, filter={"queue": "q"}, submitted_by=v),
    ),
    row(
        "set_priority.filter.ids",
        "filter ids",
        {"10001-ids": list(range(1, 10_002)), "beyond-bigint": [2**63], "str": "1,2"},
        lambda c, v: c.set_priority(1, filter={"ids": v}),
    ),
    row("move_queue.queue", "queue", NAMES, lambda c, v: c.move_queue(v, filter={"queue": "q"})),
    # Callbacks.
    row(
        "heartbeat_callback.timeout_seconds",
        "timeout_seconds",
        SECONDS,
        lambda c, v: c.heartbeat_callback(CALLBACK, v),
    ),
    row(
        "complete_external.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: c.complete_external(CALLBACK, run_lease=v),
    ),
    row(
        "fail_external.error",
        "error",
        TEXT,
        lambda c, v: c.fail_external(CALLBACK, v),
        skip=["10000-chars"],  # a long error text is kept as given
    ),
    # Workflows.
    row(
        "get_workflow",
        "workflow id",
        {"int": 5, "garbage": "nope", "nul": "a\x00", "10000-chars": "x" * 10_000},
        lambda c, v: c.get_workflow(v),
    ),
    row(
        "cancel_workflow",
        "workflow id",
        {"int": 5, "garbage": "nope"},
        lambda c, v: c.cancel_workflow(v),
    ),
    row(
        "insert.depends_on",
        "depends_on",
        {**IDS, "10001-ids": list(range(1, 10_002)), "str": "123", "dict": {1: 2}},
        lambda c, v: c.insert(Note(), depends_on=v if not isinstance(v, int | float) else [v]),
    ),
    row(
        "insert_batch.members",
        "insert_batch",
        {"int": 5, "str": "abc", "empty": []},
        lambda c, v: c.insert_batch(v, on_complete=Note()),
    ),
    # Registration and descriptors (checked when declared, before start() stores them).
    row("task.kind", "kind", NAMES, lambda c, v: c.task(Note, kind=v)(_handler), only=["async"]),
    row("task.queue", "queue", NAMES, lambda c, v: c.task(Note, queue=v)(_handler), only=["async"]),
    row(
        "task.priority",
        "priority",
        PRIORITIES,
        lambda c, v: c.task(Note, priority=v)(_handler),
        only=["async"],
    ),
    row(
        "task.max_attempts",
        "max_attempts",
        {**PRIORITIES, "1001": 1001},
        lambda c, v: c.task(Note, max_attempts=v)(_handler),
        skip=["five"],
        only=["async"],
    ),
    row(
        "task.deadline_duration",
        "deadline_duration",
        SECONDS,
        lambda c, v: c.task(Note, deadline_duration=v)(_handler),
        only=["async"],
    ),
    row("on_event_kind", "kind", NAMES, lambda c, v: c.on_event_kind(v, _handler), only=["async"]),
    row(
        "queue_descriptor.queue", "queue", NAMES, lambda c, v: c.queue_descriptor(v), only=["async"]
    ),
    row(
        "queue_descriptor.description",
        "description",
        TEXT,
        lambda c, v: c.queue_descriptor("q", description=v),
        skip=["10000-chars"],  # descriptions may be long; see the next row
        only=["async"],
    ),
    row(
        "queue_descriptor.docs_url",
        "docs_url",
        TEXT,
        lambda c, v: c.queue_descriptor("q", docs_url=v),
        only=["async"],
    ),
    row(
        "job_kind_descriptor.tags",
        "tag",
        TEXT,
        lambda c, v: c.job_kind_descriptor("k", tags=[v]),
        skip=["10000-chars"],
        only=["async"],
    ),
    # Health and shutdown.
    row(
        "health_check.unserved_after",
        "unserved_after",
        SECONDS,
        lambda c, v: c.health_check(unserved_after=v),
    ),
    row(
        "health_check.queues",
        "queues",
        FLAGS,
        lambda c, v: c.health_check(queues=v),
        only=["async"],
    ),
    row("shutdown.timeout", "timeout", SECONDS, lambda c, v: c.shutdown(v), only=["async"]),
    row(
        "shutdown.timeout_ms",
        "timeout_ms",
        SECONDS,
        lambda c, v: c.shutdown(timeout_ms=v),
        only=["async"],
    ),
]


def _handler(job: Any) -> None:
    return None


@pytest.fixture
def seeded(sync_client: awa.Client, conn: Conn) -> dict[str, Any]:
    """Rows a mistaken call could touch: an available job, a failed one, a DLQ entry, a
    paused queue and a pending batch operation."""
    waiting = sync_client.insert(Note("waiting"), queue="q", kind="k")
    failed = sync_client.insert(Note("failed"), queue="q", kind="k")
    set_state(conn, failed.id, "failed")
    parked = sync_client.insert(Note("dead"), queue="q", kind="k")
    set_state(conn, parked.id, "failed")
    assert sync_client.move_failed_to_dlq(parked.id, "seeded") is not None
    sync_client.pause_queue("paused", paused_by="seed")
    sync_client.set_priority(1, filter={"queue": "q"}, submitted_by="seed")
    return {"waiting": waiting, "failed": failed, "dead": parked}


async def call(target: Any, entry: Row, value: Any) -> Any:
    result = entry.call(target, value)
    return await result if inspect.isawaitable(result) else result


@pytest.mark.parametrize(("entry", "value"), list(cases(CLIENT_ROWS)))
async def test_bad_arguments_are_refused_before_the_database(
    client: awa.AsyncClient,
    sync_client: awa.Client,
    conn: Conn,
    seeded: dict[str, Any],
    entry: Row,
    value: Any,
) -> None:
    before = snapshot(conn)
    targets = {"async": client, "sync": sync_client}
    for name, target in targets.items():
        if entry.only and name not in entry.only:
            continue
        with pytest.raises(awa.ValidationError) as caught:
            await call(target, entry, value)
        assert isinstance(caught.value, ValueError)  # DESIGN §4.18
        assert_names(caught.value, entry.field)
    assert snapshot(conn) == before


def test_validation_error_is_a_value_error() -> None:
    assert issubclass(awa.ValidationError, ValueError)
    assert issubclass(awa.ValidationError, awa.AwaError)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": 2**63}, "max_connections"),
        ({"max_connections": "5"}, "max_connections"),
        ({"max_connections": True}, "max_connections"),
        ({"application_name": "a\x00b"}, "application_name"),
        ({"application_name": "x" * 10_000}, "application_name"),
        ({"application_name": 5}, "application_name"),
    ],
)
def test_bad_client_options_are_named(
    database_url: str, options: dict[str, Any], field: str
) -> None:
    for cls in (awa.AsyncClient, awa.Client):
        with pytest.raises(awa.ValidationError) as caught:
            cls(database_url, **options)
        assert_names(caught.value, field)


@pytest.mark.parametrize("name", list(ODD_NAMES.values()), ids=list(ODD_NAMES))
async def test_odd_names_are_data_not_paths(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, seeded: dict[str, Any], name: str
) -> None:
    """A queue named like a path or an injection is a queue like any other: stored byte for
    byte, paused and drained alone; the seeded jobs are untouched."""
    job = await client.insert(Note(), queue=name, kind=name, tags=[name])
    assert (await client.get_job(job.id)).queue == name  # type: ignore[union-attr]
    assert [row.id for row in sync_client.list_jobs(queue=name)] == [job.id]
    await client.pause_queue(name, paused_by=name)
    paused = {stats.queue: stats.paused_by for stats in await client.queue_stats() if stats.paused}
    assert paused == {"paused": "seed", name: name}
    assert sync_client.drain_queue(name) == 1
    waiting = await client.get_job(seeded["waiting"].id)
    assert waiting is not None
    assert waiting.state is awa.JobState.AVAILABLE
    failed = await client.get_job(seeded["failed"].id)
    assert failed is not None
    assert failed.state is awa.JobState.FAILED


# depends_on: ids that name no job (yet) -----------------------------------------------------


async def test_depends_on_a_missing_job_names_it_and_stores_nothing(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    parent = await client.insert(Note("parent"))
    before = snapshot(conn)
    for target in (client, sync_client):
        with pytest.raises(awa.ValidationError) as caught:
            await maybe_await(target.insert(Note(), depends_on=[parent.id, 424242, 99]))
        assert_names(caught.value, "depends_on", "do not exist", "99, 424242")
        assert str(parent.id) + "," not in str(caught.value)
    with pytest.raises(awa.ValidationError, match="424242"):
        await client.insert_many([Note("a"), awa.EnqueueRequest(Note("b"))], depends_on=[424242])
    with pytest.raises(awa.ValidationError, match="424242"):
        async with client.transaction() as tx:
            await tx.insert(Note(), depends_on=[424242])
    assert snapshot(conn) == before


async def test_a_job_cannot_depend_on_itself_or_on_its_own_batch(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """A job's id is known only once it is inserted, so an id given in depends_on must name a
    job that exists before the insert: guessing the next id (the job's own, or a job of the
    same insert_many) is refused as a job that does not exist, and nothing goes in."""
    first = await client.insert(Note("first"))
    next_id = first.id + 1
    before = snapshot(conn)
    with pytest.raises(awa.ValidationError) as caught:
        await client.insert(Note("self"), depends_on=[next_id])
    assert_names(caught.value, "depends_on", str(next_id), "exist before")
    with pytest.raises(awa.ValidationError, match=str(next_id + 1)):
        await client.insert_many(
            [Note("a"), awa.EnqueueRequest(Note("b"))], depends_on=[next_id + 1]
        )
    assert snapshot(conn) == before
    # The ids were never used: the next insert takes one of them and runs as usual.
    later = await client.insert(Note("later"), depends_on=[first.id])
    assert later.state is awa.JobState.BLOCKED


def test_the_bridge_refuses_a_missing_parent_before_inserting(
    database_url: str, conn: Conn
) -> None:
    """Inside the caller's own transaction the check runs before the insert: the caller may
    catch the error and commit, and still no job exists."""
    with psycopg.connect(database_url) as own:
        with pytest.raises(awa.ValidationError, match="424242"):
            awa.bridge.insert_job_sync(own, Note(), depends_on=[424242])
        own.commit()
    assert count_jobs(conn) == 0


# Workflows: missing and cyclic steps, a second insert ---------------------------------------


def _workflow_with(*edges: tuple[int, list[int]]) -> awa.Workflow:
    """Steps 0..n-1, each depending on the step indexes given (built by hand, as a caller
    holding ``awa.Step`` values could)."""
    workflow = awa.Workflow("wf")
    for index, parents in edges:
        assert (
            workflow.add(
                Note(f"s{index}"), depends_on=[Step(workflow.id, p) for p in parents]
            ).index
            == index
        )
    return workflow


@pytest.mark.parametrize(
    ("edges", "fragments"),
    [
        ([(0, [1])], ("step 0 depends on step 1, which does not exist", "0 to 0")),
        ([(0, []), (1, [7])], ("step 1 depends on step 7",)),
        ([(0, []), (1, [-1])], ("step 1 depends on step -1",)),
        ([(0, [0])], ("step 0 depends on itself",)),
        ([(0, [1]), (1, [0])], ("steps 0 -> 1 -> 0", "cycle")),
        ([(0, []), (1, [3]), (2, [1]), (3, [2])], ("steps 1 -> 3 -> 2 -> 1", "cycle")),
    ],
)
async def test_a_workflow_with_missing_or_cyclic_steps_is_refused(
    client: awa.AsyncClient,
    sync_client: awa.Client,
    conn: Conn,
    edges: list[tuple[int, list[int]]],
    fragments: tuple[str, ...],
) -> None:
    before = snapshot(conn)
    for target in (client, sync_client):
        workflow = _workflow_with(*edges)
        with pytest.raises(awa.ValidationError) as caught:
            await maybe_await(target.insert_workflow(workflow))
        assert_names(caught.value, "workflow 'wf'", *fragments)
    assert snapshot(conn) == before


async def test_a_step_handle_that_is_not_a_step_index_is_refused() -> None:
    workflow = awa.Workflow("wf")
    workflow.add(Note())
    for index in (True, "0", 0.0):
        with pytest.raises(awa.ValidationError, match="index"):
            workflow.add(Note(), depends_on=[Step(workflow.id, index)])  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="another workflow"):
        workflow.add(Note(), depends_on=[Step(uuid.uuid4(), 0)])
    with pytest.raises(awa.ValidationError, match="depends_on"):
        workflow.add(Note(), depends_on=5)  # type: ignore[arg-type]
    assert len(workflow) == 1


async def test_a_forward_step_reference_without_a_cycle_is_inserted(
    client: awa.AsyncClient, conn: Conn
) -> None:
    workflow = _workflow_with((0, [1]), (1, []))
    run = await client.insert_workflow(workflow)
    assert [job.state for job in run.jobs] == [awa.JobState.BLOCKED, awa.JobState.AVAILABLE]
    info = await client.get_workflow(run.id)
    assert info.jobs[0].depends_on == [run.jobs[1].id]


async def test_a_workflow_inserts_once(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    workflow = awa.Workflow("once")
    first = workflow.add(Note("a"))
    workflow.add(Note("b"), depends_on=[first])
    run = await client.insert_workflow(workflow)
    before = snapshot(conn)
    for attempt in (
        lambda: client.insert_workflow(workflow),
        lambda: sync_client.insert_workflow(workflow),
        lambda: client.insert_workflow(copy.deepcopy(workflow)),  # a copy has the same id
    ):
        with pytest.raises(awa.ValidationError) as caught:
            await maybe_await(attempt())
        assert_names(caught.value, "workflow 'once'", str(run.id), "inserted already")
    with pytest.raises(awa.ValidationError, match="inserted already"):
        async with client.transaction() as tx:
            await tx.insert_workflow(workflow)
    assert snapshot(conn) == before
    assert count_jobs(conn, "workflow_id = %s", run.id) == 2


async def test_concurrent_inserts_of_one_workflow_store_one_set(
    client: awa.AsyncClient, conn: Conn
) -> None:
    workflow = awa.Workflow("racing")
    for n in range(3):
        workflow.add(Note(str(n)))
    results = await asyncio.gather(
        *(client.insert_workflow(workflow) for _ in range(4)), return_exceptions=True
    )
    runs = [result for result in results if isinstance(result, awa.WorkflowRun)]
    refused = [result for result in results if isinstance(result, awa.ValidationError)]
    assert len(runs) == 1, results
    assert len(refused) == 3, results
    for error in refused:
        assert "racing" in str(error)
    assert count_jobs(conn, "workflow_id = %s", workflow.id) == 3
    assert count_jobs(conn) == 3


async def test_a_workflow_rolled_back_can_be_inserted_again(
    client: awa.AsyncClient, conn: Conn
) -> None:
    workflow = awa.Workflow("retried")
    workflow.add(Note())

    class Rollback(Exception):
        pass

    async def insert_then_roll_back() -> None:
        async with client.transaction() as tx:
            await tx.insert_workflow(workflow)
            raise Rollback

    with pytest.raises(Rollback):
        await insert_then_roll_back()
    assert count_jobs(conn) == 0
    run = await client.insert_workflow(workflow)
    assert count_jobs(conn, "workflow_id = %s", run.id) == 1


async def test_a_workflow_step_depending_on_a_missing_job_stores_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    workflow = awa.Workflow("external")
    workflow.add(Note(), depends_on=[424242])
    with pytest.raises(awa.ValidationError) as caught:
        await client.insert_workflow(workflow)
    assert_names(caught.value, "depends_on", "424242")
    assert count_jobs(conn) == 0


# Waiting: the bounds are the only change; a valid wait still works ---------------------------


async def test_a_zero_timeout_wait_gives_up_at_once(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(Note())
    with pytest.raises(awa.WaitTimeout):
        await asyncio.wait_for(client.wait(job.id, timeout=0), 5)
    assert count_jobs(conn, "watched") == 1  # the wait registered, nothing else changed
