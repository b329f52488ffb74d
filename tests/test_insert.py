"""Inserting jobs: args types, every option, batches and COPY, checked against the rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pydantic
import pytest

import awa
from awa.core.kinds import decode_args
from jobs_helpers import Conn, count_jobs, job_rows, must_job_row


@dataclasses.dataclass
class Address:
    city: str


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hello"


@dataclasses.dataclass
class ShipOrder:
    order_id: uuid.UUID
    due: dt.datetime
    address: Address


class ChargeCard(pydantic.BaseModel):
    amount_cents: int
    currency: str = "EUR"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def test_dataclass_args(client: awa.AsyncClient, conn: Conn) -> None:
    order_id = uuid.uuid4()
    due = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)
    job = await client.insert(ShipOrder(order_id, due, Address("Oslo")))
    row = must_job_row(conn, job.id)
    assert row["kind"] == "ship_order"
    assert row["args"] == {
        "order_id": str(order_id),
        "due": "2030-05-01T12:00:00Z",
        "address": {"city": "Oslo"},
    }
    assert job.args == row["args"]
    decoded = decode_args(ShipOrder, row["args"])
    assert decoded == ShipOrder(order_id, due, Address("Oslo"))


async def test_pydantic_args(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(ChargeCard(amount_cents=500))
    row = must_job_row(conn, job.id)
    assert (row["kind"], row["args"]) == ("charge_card", {"amount_cents": 500, "currency": "EUR"})


async def test_dict_args_need_a_kind(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert({"to": "a@b.c", "n": [1, 2]}, kind="raw_email")
    row = must_job_row(conn, job.id)
    assert (row["kind"], row["args"]) == ("raw_email", {"to": "a@b.c", "n": [1, 2]})
    with pytest.raises(awa.ValidationError, match="kind"):
        await client.insert({"to": "a@b.c"})
    assert count_jobs(conn) == 1


async def test_explicit_kind_overrides_the_derived_one(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(SendEmail("x"), kind="email.v2")
    assert must_job_row(conn, job.id)["kind"] == "email.v2"


async def test_defaults(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(SendEmail("a"))
    row = must_job_row(conn, job.id)
    expected = {
        "queue": "default",
        "state": "available",
        "priority": 2,
        "attempt": 0,
        "max_attempts": 25,
        "run_lease": 0,
        "tags": [],
        "metadata": {},
        "errors": [],
        "unique_key": None,
        "unique_states": None,
        "ordering_key": None,
        "deadline_duration": None,
        "finalized_at": None,
    }
    assert {name: row[name] for name in expected} == expected
    assert row["run_at"] == row["created_at"]
    assert await client.get_job(job.id) == job


@pytest.mark.parametrize(
    ("kwargs", "column", "stored"),
    [
        ({"queue": "mail"}, "queue", "mail"),
        ({"priority": 1}, "priority", 1),
        ({"priority": 4}, "priority", 4),
        ({"max_attempts": 1}, "max_attempts", 1),
        ({"max_attempts": 1000}, "max_attempts", 1000),
        ({"tags": ["billing", "vip"]}, "tags", ["billing", "vip"]),
        ({"tags": ("t",)}, "tags", ["t"]),
        (
            {"metadata": {"trace": {"id": "abc"}, "n": 1}},
            "metadata",
            {"trace": {"id": "abc"}, "n": 1},
        ),
        ({"ordering_key": "account-7"}, "ordering_key", b"account-7"),
        ({"ordering_key": b"\x00\xffkey"}, "ordering_key", b"\x00\xffkey"),
        ({"deadline_duration": 30}, "deadline_duration", dt.timedelta(seconds=30)),
        ({"deadline_duration": 1.5}, "deadline_duration", dt.timedelta(seconds=1.5)),
        (
            {"deadline_duration": dt.timedelta(minutes=2)},
            "deadline_duration",
            dt.timedelta(minutes=2),
        ),
        ({"deadline_duration": 0}, "deadline_duration", dt.timedelta(0)),
    ],
    ids=lambda value: repr(value)[:40],
)
async def test_option_round_trips(
    client: awa.AsyncClient, conn: Conn, kwargs: dict[str, Any], column: str, stored: Any
) -> None:
    job = await client.insert(SendEmail("a"), **kwargs)
    assert must_job_row(conn, job.id)[column] == stored
    assert getattr(job, column) == stored
    assert await client.get_job(job.id) == job


async def test_run_at_future_schedules_and_past_is_available(
    client: awa.AsyncClient, conn: Conn
) -> None:
    future = (now() + dt.timedelta(hours=1)).astimezone(dt.timezone(dt.timedelta(hours=5)))
    past = now() - dt.timedelta(days=3)
    scheduled = await client.insert(SendEmail("a"), run_at=future)
    available = await client.insert(SendEmail("b"), run_at=past)
    for job, state, run_at in ((scheduled, "scheduled", future), (available, "available", past)):
        row = must_job_row(conn, job.id)
        assert (row["state"], row["run_at"]) == (state, run_at)
        assert (job.state, job.run_at) == (awa.JobState(state), run_at)


async def test_run_at_iso_string(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(SendEmail("a"), run_at="2100-01-02T03:04:05+02:00")  # type: ignore[arg-type]
    row = must_job_row(conn, job.id)
    assert row["state"] == "scheduled"
    assert row["run_at"] == dt.datetime(2100, 1, 2, 1, 4, 5, tzinfo=dt.UTC)


def test_sync_client_round_trips_options(sync_client: awa.Client, conn: Conn) -> None:
    job = sync_client.insert(
        {"x": 1},
        kind="sync_kind",
        queue="q",
        priority=3,
        max_attempts=5,
        tags=["a"],
        metadata={"m": True},
        ordering_key="k",
        deadline_duration=dt.timedelta(seconds=9),
        run_at=now() + dt.timedelta(minutes=5),
    )
    row = must_job_row(conn, job.id)
    assert (row["kind"], row["queue"], row["priority"], row["max_attempts"]) == (
        "sync_kind",
        "q",
        3,
        5,
    )
    assert (row["tags"], row["metadata"], row["ordering_key"]) == (["a"], {"m": True}, b"k")
    assert (row["state"], row["deadline_duration"]) == ("scheduled", dt.timedelta(seconds=9))
    assert sync_client.get_job(job.id) == job


async def test_insert_many_returns_rows_in_order(client: awa.AsyncClient, conn: Conn) -> None:
    jobs = await client.insert_many([SendEmail(f"user{i}") for i in range(5)], queue="bulk")
    assert [job.args["to"] for job in jobs] == [f"user{i}" for i in range(5)]
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    rows = job_rows(conn)
    assert [row["id"] for row in rows] == [job.id for job in jobs]
    assert {row["queue"] for row in rows} == {"bulk"}


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_insert_many_is_atomic_on_invalid_item(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, method: str
) -> None:
    items: list[Any] = [
        SendEmail("a"),
        SendEmail("b"),
        awa.EnqueueRequest(SendEmail("c")).priority(9),
    ]
    with pytest.raises(awa.ValidationError, match=r"job 2: priority") as caught:
        await getattr(client, method)(items)
    assert "between 1 and 4" in str(caught.value)
    with pytest.raises(awa.ValidationError, match=r"job 1: kind"):
        getattr(sync_client, method)([SendEmail("a"), {"no": "kind"}])
    assert count_jobs(conn) == 0


async def test_insert_many_items_override_shared_options(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await client.insert_many(
        [
            SendEmail("plain"),
            awa.EnqueueRequest(SendEmail("vip")).queue("vip").priority(1).tags(["gold"]),
            awa.EnqueueRequest({"raw": True}, kind="raw_kind"),
            awa.EnqueueRequest(SendEmail("replaced")).with_opts(awa.InsertOpts(max_attempts=3)),
        ],
        queue="bulk",
        priority=3,
        tags=["shared"],
    )
    rows = {row["id"]: row for row in job_rows(conn)}
    got = [
        (
            rows[job.id]["kind"],
            rows[job.id]["queue"],
            rows[job.id]["priority"],
            rows[job.id]["tags"],
        )
        for job in jobs
    ]
    assert got == [
        ("send_email", "bulk", 3, ["shared"]),
        ("send_email", "vip", 1, ["gold"]),
        ("raw_kind", "bulk", 3, ["shared"]),
        ("send_email", "default", 2, []),
    ]
    assert rows[jobs[3].id]["max_attempts"] == 3


async def test_empty_batches(client: awa.AsyncClient, conn: Conn) -> None:
    assert await client.insert_many([]) == []
    assert await client.insert_many_copy([]) == []
    assert count_jobs(conn) == 0


async def test_insert_many_copy_matches_what_get_job_reads(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await client.insert_many_copy(
        [SendEmail(f"user{i}", subject="ünïcode ✓") for i in range(1000)],
        queue="copy",
        tags=["bulk"],
        metadata={"batch": 1},
    )
    assert len(jobs) == 1000
    assert count_jobs(conn, "queue = 'copy' AND state = 'available'") == 1000
    assert len({job.id for job in jobs}) == 1000
    for job in jobs:
        assert await client.get_job(job.id) == job
    assert jobs[0].args == {"to": "user0", "subject": "ünïcode ✓"}


async def test_insert_many_copy_every_option(client: awa.AsyncClient, conn: Conn) -> None:
    future = now() + dt.timedelta(hours=2)
    jobs = await client.insert_many_copy(
        [
            awa.EnqueueRequest(SendEmail("later")).run_at(future).ordering_key(b"\x01o"),
            awa.EnqueueRequest(SendEmail("past")).run_at(now() - dt.timedelta(hours=1)),
            awa.EnqueueRequest(ChargeCard(amount_cents=1)).priority(4).max_attempts(2),
            awa.EnqueueRequest({"d": 1}, kind="dict_kind").deadline_duration(0).tags(["t"]),
        ],
        metadata={"k": "v"},
    )
    assert [job.state for job in jobs] == [
        awa.JobState.SCHEDULED,
        awa.JobState.AVAILABLE,
        awa.JobState.AVAILABLE,
        awa.JobState.AVAILABLE,
    ]
    for job in jobs:
        assert await client.get_job(job.id) == job
    row = must_job_row(conn, jobs[3].id)
    assert (row["deadline_duration"], row["tags"], row["metadata"]) == (
        dt.timedelta(0),
        ["t"],
        {"k": "v"},
    )


def test_sync_insert_many_copy(sync_client: awa.Client, conn: Conn) -> None:
    jobs = sync_client.insert_many_copy([{"i": i} for i in range(50)], kind="sync_copy")
    assert [job.args["i"] for job in jobs] == list(range(50))
    assert [sync_client.get_job(job.id) for job in jobs] == jobs
    assert count_jobs(conn, "kind = 'sync_copy'") == 50


async def test_insert_many_copy_text_escaping_round_trips(client: awa.AsyncClient) -> None:
    tags = ['quote"d', "back\\slash", "com,ma", "{braces}", " pad ", "NULL", "", "tab\there"]
    args = {"s": 'x\\y\t"z"\n\r', "copy_null": "\\N", "u": "\u2028\x01ü✓"}
    jobs = await client.insert_many_copy(
        [
            awa.EnqueueRequest(args, kind="escapes")
            .tags(tags)
            .ordering_key(b"\\x00\x00\n\t")
            .metadata({"m": "\\N\n"}),
            awa.EnqueueRequest(SendEmail("x")).run_at(
                dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=3)))
            ),
        ]
    )
    for job in jobs:
        assert await client.get_job(job.id) == job
    assert jobs[0].tags == tags
    assert jobs[0].args == args


@pytest.mark.parametrize(
    "deadline",
    [
        0,
        0.000001,
        1e-7,
        1.5,
        123456789.123456,
        dt.timedelta(days=3, microseconds=7),
        dt.timedelta(microseconds=1),
    ],
    ids=repr,
)
async def test_deadline_duration_same_on_insert_and_copy(
    client: awa.AsyncClient, deadline: float | dt.timedelta
) -> None:
    inserted = await client.insert(SendEmail("a"), deadline_duration=deadline)
    (copied,) = await client.insert_many_copy([SendEmail("b")], deadline_duration=deadline)
    assert await client.get_job(copied.id) == copied
    assert copied.deadline_duration == inserted.deadline_duration
    assert (await client.get_job(inserted.id)) == inserted


async def test_insert_many_takes_any_iterable_but_not_a_mapping(
    client: awa.AsyncClient, conn: Conn
) -> None:
    jobs = await client.insert_many(SendEmail(f"g{i}") for i in range(3))
    assert [job.args["to"] for job in jobs] == ["g0", "g1", "g2"]
    with pytest.raises(awa.ValidationError, match="list of jobs"):
        await client.insert_many({"to": "x"}, kind="k")
    assert count_jobs(conn) == 3


async def test_large_batches_span_several_statements_atomically(
    client: awa.AsyncClient, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(awa.producer.statements, "INSERT_CHUNK", 3)
    jobs = await client.insert_many([SendEmail(str(i)) for i in range(10)], queue="chunks")
    assert [job.args["to"] for job in jobs] == [str(i) for i in range(10)]
    assert [row["id"] for row in job_rows(conn)] == [job.id for job in jobs]


@pytest.mark.parametrize("run_at_offset", [None, dt.timedelta(hours=1), -dt.timedelta(hours=1)])
async def test_single_and_batch_inserts_store_the_same_row(
    client: awa.AsyncClient, conn: Conn, run_at_offset: dt.timedelta | None
) -> None:
    # One job takes a single-row statement; batches take the JSON recordset one. Both must
    # store the same row for the same job and options.
    run_at = dt.datetime.now(dt.UTC) + run_at_offset if run_at_offset is not None else None
    options: dict[str, Any] = {
        "queue": "mail",
        "priority": 3,
        "max_attempts": 7,
        "tags": ["a", 'quote"and\\slash'],
        "metadata": {"tenant": 7, "nested": {"x": [1, 2]}},
        "run_at": run_at,
        "ordering_key": b"\x00\x01",
        "deadline_duration": 12.5,
    }
    single = await client.insert(SendEmail("a@example.com", "é\tnewline\n"), **options)
    batch = await client.insert_many(
        [SendEmail("a@example.com", "é\tnewline\n"), SendEmail("b@example.com")], **options
    )
    stored_single = must_job_row(conn, single.id)
    stored_batch = must_job_row(conn, batch[0].id)
    differing = {"id", "created_at", "run_at"}
    assert {k: v for k, v in stored_single.items() if k not in differing} == {
        k: v for k, v in stored_batch.items() if k not in differing
    }
    if run_at is not None:
        assert stored_single["run_at"] == stored_batch["run_at"] == run_at
    assert stored_single["state"] == (
        "scheduled" if run_at_offset and run_at_offset > dt.timedelta(0) else "available"
    )
    assert single.args == batch[0].args == {"to": "a@example.com", "subject": "é\tnewline\n"}
