"""Durable batch operations: preview, submit, carried out by the maintenance leader in
bounded steps (priorities set, jobs moved, running and retryable jobs untouched), progress,
cancellation, list/get/purge, failure, and every validation error of the reference API."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

import awa
from awa.batch import duty as batch_duty
from helpers_worker import queue, start, wait_for, wait_for_state
from jobs_helpers import Conn, must_job_row, set_state


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Other:
    n: int


def clear_operations(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM awa.batch_operations")


@pytest.fixture(autouse=True)
def no_operations(database_url: str) -> Iterator[None]:
    """The session database shares this table between tests: start and end empty."""
    clear_operations(database_url)
    yield
    clear_operations(database_url)


@pytest.fixture
async def leader_conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection to take the leader's steps by hand, one at a time."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scan pages of 4 rows and chunks of 3 jobs, so a few jobs take many steps."""
    monkeypatch.setattr(batch_duty, "SCAN_PAGE", 4)
    monkeypatch.setattr(batch_duty, "CHUNK", 3)


def later() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(days=1)


async def seed(client: awa.AsyncClient, conn: Conn) -> dict[str, list[int]]:
    """Jobs of queue bulk in every state that matters, priority 4."""
    available = [(await client.insert(Report(n), queue="bulk", priority=4)).id for n in range(3)]
    scheduled = [(await client.insert(Report(9), queue="bulk", priority=4, run_at=later())).id]
    running = (await client.insert(Report(10), queue="bulk", priority=4)).id
    set_state(conn, running, "running", attempt=1, heartbeat_at=dt.datetime.now(dt.UTC))
    retryable = (await client.insert(Report(11), queue="bulk", priority=4)).id
    set_state(conn, retryable, "retryable", attempt=1, run_at=later())
    done = (await client.insert(Report(12), queue="bulk", priority=4)).id
    set_state(conn, done, "completed", finalized_at=dt.datetime.now(dt.UTC))
    elsewhere = (await client.insert(Report(13), queue="elsewhere", priority=4)).id
    other_kind = (await client.insert(Other(1), queue="bulk", priority=4)).id
    return {
        "queued": [*available, *scheduled],
        "available": available,
        "scheduled": scheduled,
        "untouched": [running, retryable, done, elsewhere],
        "other_kind": [other_kind],
    }


def priorities(conn: Conn, ids: list[int]) -> list[int]:
    return [must_job_row(conn, job_id)["priority"] for job_id in ids]


async def finished(client: awa.AsyncClient, operation_id: str, timeout: float = 10.0) -> Any:
    async def done() -> Any:
        record = await client.get_batch_operation(operation_id)
        return record if record["state"] in ("completed", "cancelled", "failed") else None

    return await wait_for(done, timeout, message=f"operation {operation_id} never finished")


async def test_preview_counts_queued_jobs_and_samples_them(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await seed(client, conn)
    preview = await client.preview_set_priority(1, filter={"queue": "bulk", "kind": "report"})
    assert preview["total_matched"] == 4
    assert [row["id"] for row in preview["sample"]] == jobs["queued"]
    first = preview["sample"][0]
    assert (first["kind"], first["queue"], first["state"], first["priority"]) == (
        "report",
        "bulk",
        "available",
        4,
    )
    assert first["args"] == {"n": 0}
    assert isinstance(first["created_at"], str)
    assert first["created_at"].endswith("Z")
    # Preview changes nothing.
    assert priorities(conn, jobs["queued"]) == [4, 4, 4, 4]

    by_state = await client.preview_move_queue(
        "dest", priority=2, filter={"queue": "bulk", "state": "scheduled"}
    )
    assert [row["id"] for row in by_state["sample"]] == jobs["scheduled"]
    by_ids = await client.preview_batch_operation(
        "set_priority",
        spec={"priority": 1},
        filter={"ids": [*jobs["untouched"][:3], jobs["queued"][0]]},
    )
    assert by_ids["total_matched"] == 1
    assert (await client.preview_set_priority(1))["total_matched"] == 6  # no filter: all queued


async def test_preview_sample_is_bounded_and_filters_combine(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    ids = [(await client.insert(Report(n), queue="many", tags=["x"])).id for n in range(12)]
    await client.insert(Report(99), queue="many", tags=["y"])
    preview = sync_client.preview_set_priority(3, filter={"queue": "many", "tag": "x"})
    assert preview["total_matched"] == 12
    assert [row["id"] for row in preview["sample"]] == ids[:10]

    row = must_job_row(conn, ids[5])
    created = row["created_at"]
    window = {"created_at_gte": created, "created_at_lt": created + dt.timedelta(microseconds=1)}
    assert sync_client.preview_set_priority(3, filter=window)["total_matched"] == 1
    as_text = {key: value.isoformat() for key, value in window.items()}
    assert sync_client.preview_set_priority(3, filter=as_text)["total_matched"] == 1
    assert sync_client.preview_set_priority(3, filter={"tag": "y"})["total_matched"] == 1
    assert sync_client.preview_set_priority(3, filter={"ids": []})["total_matched"] == 0


async def test_set_priority_is_carried_out_by_the_leader(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await seed(client, conn)
    operation = await client.set_priority(
        1, filter={"queue": "bulk", "kind": "report"}, submitted_by="ops@example.com"
    )
    assert uuid.UUID(operation["id"])
    assert (operation["op_kind"], operation["state"]) == ("set_priority", "pending")
    assert operation["spec"] == {"op_kind": "set_priority", "priority": 1}
    assert operation["filter"]["queue"] == "bulk"
    assert operation["filter"]["ids"] is None
    assert operation["submitted_by"] == "ops@example.com"
    assert (operation["processed"], operation["skipped"], operation["errored"]) == (0, 0, 0)
    assert operation["total_matched"] is None
    assert operation["started_at"] is None
    assert operation["submitted_at"].endswith("Z")

    @client.task(Other, queue="unrelated")
    async def handle(job: awa.Job[Other]) -> None:
        return None

    await start(client, queue("unrelated"))  # its leader carries the operation out
    done = await finished(client, operation["id"])
    assert done["state"] == "completed"
    assert (done["total_matched"], done["processed"], done["skipped"]) == (4, 4, 0)
    assert done["started_at"] is not None
    assert done["finalized_at"] is not None
    assert done["runner_instance"] is not None
    assert done["retention_until"] is not None
    assert done["cursor"]["after_job_id"] == done["cursor"]["max_job_id"]

    assert priorities(conn, jobs["queued"]) == [1, 1, 1, 1]
    assert must_job_row(conn, jobs["queued"][0])["metadata"] == {"_awa_original_priority": 4}
    assert [must_job_row(conn, i)["state"] for i in jobs["scheduled"]] == ["scheduled"]
    # Running, retryable, finished jobs, other queues and other kinds keep their priority.
    assert priorities(conn, jobs["untouched"] + jobs["other_kind"]) == [4, 4, 4, 4, 4]


async def test_move_queue_moves_queued_jobs_to_a_queue_that_runs_them(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await seed(client, conn)
    operation = await client.move_queue(
        "dest", priority=2, filter={"queue": "bulk", "kind": "report"}
    )
    assert operation["spec"] == {"op_kind": "move_queue", "queue": "dest", "priority": 2}

    @client.task(Report, queue="dest")
    async def handle(job: awa.Job[Report]) -> None:
        return None

    await start(client, queue("dest"))
    done = await finished(client, operation["id"])
    assert (done["state"], done["processed"]) == ("completed", 4)
    for job_id in jobs["available"]:
        row = await wait_for_state(conn, job_id, "completed")
        assert (row["queue"], row["priority"]) == ("dest", 2)
        assert row["metadata"] == {"_awa_original_priority": 4, "_awa_original_queue": "bulk"}
    scheduled = must_job_row(conn, jobs["scheduled"][0])
    assert (scheduled["queue"], scheduled["state"]) == ("dest", "scheduled")
    for job_id in jobs["untouched"]:
        assert must_job_row(conn, job_id)["queue"] in ("bulk", "elsewhere")
    assert must_job_row(conn, jobs["untouched"][0])["state"] == "running"


async def test_progress_step_by_step(
    client: awa.AsyncClient,
    conn: Conn,
    leader_conn: psycopg.AsyncConnection[Any],
    small_steps: None,
) -> None:
    ids = [(await client.insert(Report(n), queue="steps", priority=4)).id for n in range(7)]
    set_state(conn, ids[3], "running")  # claimed before the scan: not in the snapshot
    operation = await client.set_priority(3, filter={"queue": "steps"})
    after = (await client.insert(Report(8), queue="steps", priority=4)).id  # after submission
    seen = []

    async def take_step() -> Any:
        assert await batch_duty.step(leader_conn)
        record = await client.get_batch_operation(operation["id"])
        seen.append((record["state"], record["total_matched"], record["processed"]))
        return record

    await take_step()  # started, first page of 4 rows scanned (3 match)
    await take_step()  # second page: 3 rows, shorter than a page: the scan is over
    set_state(conn, ids[6], "running")  # claimed after the scan: skipped when its turn comes
    await take_step()  # first chunk of 3
    await take_step()  # last chunk (3 items, 1 skipped)
    record = await take_step()  # nothing left: completed
    assert seen == [
        ("scanning", 3, 0),
        ("running", 6, 0),
        ("running", 6, 3),
        ("running", 6, 5),
        ("completed", 6, 5),
    ]
    assert (record["skipped"], record["errored"]) == (1, 0)
    assert priorities(conn, ids) == [3, 3, 3, 4, 3, 3, 4]
    assert priorities(conn, [after]) == [4]
    assert not await batch_duty.step(leader_conn)  # nothing to do


async def test_cancel_stops_at_the_next_step(
    client: awa.AsyncClient,
    conn: Conn,
    leader_conn: psycopg.AsyncConnection[Any],
    small_steps: None,
) -> None:
    ids = [(await client.insert(Report(n), queue="stop", priority=4)).id for n in range(8)]
    operation = await client.set_priority(1, filter={"queue": "stop"})
    for _ in range(4):  # start and scan (3 pages), then one chunk
        await batch_duty.step(leader_conn)
    assert (await client.get_batch_operation(operation["id"]))["processed"] == 3
    cancelling = await client.cancel_batch_operation(operation["id"])
    assert cancelling["state"] == "cancelling"
    await batch_duty.step(leader_conn)
    cancelled = await client.get_batch_operation(operation["id"])
    assert cancelled["state"] == "cancelled"
    assert cancelled["finalized_at"] is not None
    assert (cancelled["total_matched"], cancelled["processed"], cancelled["skipped"]) == (8, 3, 5)
    assert priorities(conn, ids) == [1, 1, 1, 4, 4, 4, 4, 4]  # what it changed stays changed
    with pytest.raises(awa.ValidationError, match=r"batch operation cannot be cancelled: "):
        await client.cancel_batch_operation(operation["id"])


async def test_cancel_before_it_starts_and_through_a_running_leader(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    job = await client.insert(Report(1), queue="never", priority=4)
    operation = sync_client.set_priority(1, filter={"queue": "never"})
    assert sync_client.cancel_batch_operation(operation["id"])["state"] == "cancelling"

    @client.task(Other, queue="unrelated")
    async def handle(job: awa.Job[Other]) -> None:
        return None

    await start(client, queue("unrelated"))
    done = await finished(client, operation["id"])
    assert (done["state"], done["processed"]) == ("cancelled", 0)
    assert priorities(conn, [job.id]) == [4]


async def test_list_get_and_purge(
    client: awa.AsyncClient, sync_client: awa.Client, leader_conn: psycopg.AsyncConnection[Any]
) -> None:
    first = await client.set_priority(2, filter={"queue": "a"})
    second = await client.move_queue("b", filter={"queue": "a"})
    third = await client.set_priority(3, filter={"queue": "c"})
    listed = await client.list_batch_operations()
    assert [row["id"] for row in listed] == [third["id"], second["id"], first["id"]]
    assert [row["id"] for row in await client.list_batch_operations(limit=2)] == [
        third["id"],
        second["id"],
    ]
    assert len(sync_client.list_batch_operations(limit=1)) == 1
    assert len(sync_client.list_batch_operations(limit=1000)) == 3  # limits run 1..1000
    await client.cancel_batch_operation(third["id"])
    assert [r["id"] for r in sync_client.list_batch_operations(state="cancelling")] == [third["id"]]
    assert (await client.get_batch_operation(uuid.UUID(first["id"])))["id"] == first["id"]
    assert sync_client.get_batch_operation(second["id"])["op_kind"] == "move_queue"

    while await batch_duty.step(leader_conn):  # finish all three
        pass
    states = {row["id"]: row["state"] for row in await client.list_batch_operations()}
    assert states == {first["id"]: "completed", second["id"]: "completed", third["id"]: "cancelled"}
    pending = await client.set_priority(1, filter={"queue": "z"})  # unfinished: never purged
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    assert await client.purge_batch_operations(soon - dt.timedelta(days=1)) == 0
    assert await client.purge_batch_operations(soon, limit=2) == 2
    assert sync_client.purge_batch_operations(soon) == 1
    assert [row["id"] for row in await client.list_batch_operations()] == [pending["id"]]
    with pytest.raises(awa.ValidationError, match=f"batch operation not found: {first['id']}"):
        await client.get_batch_operation(first["id"])


async def test_admin_functions_and_retention_of_finished_records(
    client: awa.AsyncClient, conn: Conn, leader_conn: psycopg.AsyncConnection[Any]
) -> None:
    await client.insert(Report(1), queue="adm", priority=4)
    operation = awa.admin.submit_batch_operation(
        conn, "set_priority", spec={"priority": 2}, filter={"queue": "adm"}
    )
    assert awa.admin.get_batch_operation(conn, operation["id"])["state"] == "pending"
    while await batch_duty.step(leader_conn):
        pass
    assert awa.admin.list_batch_operations(conn)[0]["state"] == "completed"
    # A finished record past its retention is deleted by the leader when idle.
    conn.execute("UPDATE awa.batch_operations SET retention_until = now() - interval '1 second'")
    assert not await batch_duty.step(leader_conn)
    assert awa.admin.list_batch_operations(conn) == []


async def test_a_step_the_database_refuses_fails_the_operation(
    client: awa.AsyncClient, conn: Conn, leader_conn: psycopg.AsyncConnection[Any]
) -> None:
    job = await client.insert(Report(1), queue="bad", priority=4)
    operation = await client.set_priority(1, filter={"queue": "bad"})
    # A spec no client would submit (priority out of the jobs' range), written by hand.
    conn.execute(
        'UPDATE awa.batch_operations SET spec = \'{"op_kind": "set_priority", "priority": 9}\''
    )
    while await batch_duty.step(leader_conn):
        pass
    failed = await client.get_batch_operation(operation["id"])
    assert failed["state"] == "failed"
    assert failed["finalized_at"] is not None
    assert (failed["processed"], failed["errored"]) == (0, 1)
    assert "jobs_priority_range" in (failed["last_error"] or "")
    assert priorities(conn, [job.id]) == [4]


async def test_allow_all_matches_every_queued_job(client: awa.AsyncClient, conn: Conn) -> None:
    jobs = await seed(client, conn)
    with pytest.raises(awa.ValidationError, match="requires a filter or allow_all=true"):
        await client.set_priority(1)
    with pytest.raises(awa.ValidationError, match="requires a filter or allow_all=true"):
        await client.move_queue("x", filter={"kind": None})
    operation = await client.set_priority(1, allow_all=True)
    assert all(value is None for value in operation["filter"].values())

    @client.task(Other, queue="unrelated")
    async def handle(job: awa.Job[Other]) -> None:
        return None

    await start(client, queue("unrelated"))
    done = await finished(client, operation["id"])
    assert done["processed"] == 6  # the queued jobs of every queue and kind
    assert priorities(conn, jobs["untouched"]) == [4, 4, 4, 1]  # "elsewhere" is queued too


SPEC_ERRORS: list[tuple[Any, Any, type[Exception], str]] = [
    ("reprioritize", {"priority": 1}, awa.ValidationError, "unknown batch operation kind: "),
    ("set_priority", [("priority", 1)], TypeError, "batch operation spec must be a dict"),
    ("set_priority", {}, ValueError, "batch operation spec missing 'priority'"),
    ("move_queue", {"priority": 1}, ValueError, "batch operation spec missing 'queue'"),
    ("set_priority", {"priority": 0}, awa.ValidationError, "priority must be between 1 and 4"),
    ("set_priority", {"priority": 5}, awa.ValidationError, "priority must be between 1 and 4"),
    ("set_priority", {"priority": "1"}, TypeError, "priority must be an int"),
    ("move_queue", {"queue": ""}, awa.ValidationError, "destination queue must be 1 to 200"),
    ("move_queue", {"queue": "q" * 201}, awa.ValidationError, "destination queue must be 1 to"),
    ("move_queue", {"queue": 7}, TypeError, "queue must be a str"),
    ("move_queue", {"queue": "q", "priority": 9}, awa.ValidationError, "between 1 and 4"),
]

FILTER_ERRORS: list[tuple[Any, type[Exception], str]] = [
    (["queue", "bulk"], TypeError, "batch operation filter must be a dict or None"),
    ({"queu": "bulk"}, awa.ValidationError, "unknown batch operation filter key(s) ['queu']"),
    ({"state": "running"}, awa.ValidationError, "only supports available or scheduled state"),
    ({"state": "retryable"}, awa.ValidationError, "only supports available or scheduled state"),
    ({"state": "sleeping"}, awa.ValidationError, "unknown job state 'sleeping'"),
    ({"kind": 3}, TypeError, "filter kind must be a str"),
    ({"queue": ""}, awa.ValidationError, "queue must not be empty"),
    ({"ids": "1,2"}, TypeError, "filter ids must be a list of ints"),
    ({"ids": [1, "2"]}, TypeError, "filter ids must be ints"),
    ({"ids": [2**63]}, awa.ValidationError, "filter ids must be job ids"),
    ({"created_at_gte": "yesterday"}, ValueError, "invalid RFC3339 timestamp"),
    ({"created_at_lt": 1700000000}, TypeError, "must be a datetime or an RFC 3339 string"),
    ({"created_at_lt": dt.datetime(2026, 1, 1)}, awa.ValidationError, "must be timezone-aware"),
]


@pytest.mark.parametrize(("op_kind", "spec", "error", "message"), SPEC_ERRORS)
async def test_spec_errors(
    client: awa.AsyncClient,
    sync_client: awa.Client,
    op_kind: Any,
    spec: Any,
    error: type[Exception],
    message: str,
) -> None:
    for call in (client.preview_batch_operation, client.submit_batch_operation):
        with pytest.raises(error, match=re.escape(message)):
            await call(op_kind, spec=spec, filter={"queue": "q"})
    with pytest.raises(error, match=re.escape(message)):
        sync_client.submit_batch_operation(op_kind, spec=spec, filter={"queue": "q"})
    assert await client.list_batch_operations() == []


@pytest.mark.parametrize(("filter_", "error", "message"), FILTER_ERRORS)
async def test_filter_errors(
    client: awa.AsyncClient, filter_: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        await client.preview_set_priority(1, filter=filter_)
    with pytest.raises(error, match=re.escape(message)):
        await client.move_queue("dest", filter=filter_, allow_all=True)
    assert await client.list_batch_operations() == []


async def test_id_state_limit_and_purge_errors(
    client: awa.AsyncClient, sync_client: awa.Client
) -> None:
    for call in (client.get_batch_operation, client.cancel_batch_operation):
        with pytest.raises(ValueError, match="invalid batch operation id: "):
            await call("not-a-uuid")
        with pytest.raises(TypeError, match="batch operation id must be a str"):
            await call(42)  # type: ignore[arg-type]
    unknown = str(uuid.uuid4())
    with pytest.raises(awa.ValidationError, match=f"batch operation not found: {unknown}"):
        sync_client.cancel_batch_operation(unknown)
    with pytest.raises(awa.ValidationError, match="unknown batch operation state: done"):
        await client.list_batch_operations(state="done")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit must be an int"):
        await client.list_batch_operations(limit="10")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="before must be timezone-aware"):
        await client.purge_batch_operations(dt.datetime(2026, 1, 1))
    with pytest.raises(TypeError, match="before must be a datetime"):
        sync_client.purge_batch_operations("2026-01-01")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="submitted_by must be a str"):
        await client.set_priority(1, filter={"queue": "q"}, submitted_by=5)  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="submitted_by is 201 characters long; the limit"):
        await client.set_priority(1, filter={"queue": "q"}, submitted_by="x" * 201)
