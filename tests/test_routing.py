"""Routing by the task's queue (DESIGN §4.9): an insert, follow-up or staged follow-up that
names no queue goes to the queue its kind's task was registered on in this client, else
``"default"``; an explicit queue always wins."""

from __future__ import annotations

import dataclasses

import pytest

import awa
from awa.testing import AwaTestClient, HandlerJob
from helpers_worker import queue, start, wait_for_state
from jobs_helpers import Conn


@dataclasses.dataclass
class SendEmail:
    to: str


@dataclasses.dataclass
class Charge:
    cents: int


@dataclasses.dataclass
class Unrouted:
    n: int


def register(client: awa.AsyncClient) -> None:
    @client.task(SendEmail, queue="email")
    async def send(job: awa.Job[SendEmail]) -> None:
        pass

    @client.task(Charge, queue="billing")
    async def charge(job: awa.Job[Charge]) -> None:
        pass

    @client.task(None, kind="raw_thing", queue="raw")
    async def raw(job: awa.Job[dict[str, object]]) -> None:
        pass


def queue_of(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT queue FROM awa.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


async def test_insert_goes_to_the_tasks_queue(client: awa.AsyncClient, conn: Conn) -> None:
    register(client)
    email = await client.insert(SendEmail("a@example.com"))
    charge = await client.insert(Charge(5))
    other = await client.insert(Unrouted(1))
    raw = await client.insert({"x": 1}, kind="raw_thing")
    assert (email.queue, charge.queue, other.queue, raw.queue) == (
        "email",
        "billing",
        "default",
        "raw",
    )
    assert [queue_of(conn, job.id) for job in (email, charge, other, raw)] == [
        "email",
        "billing",
        "default",
        "raw",
    ]


async def test_explicit_queue_always_wins(client: awa.AsyncClient) -> None:
    register(client)
    assert (await client.insert(SendEmail("a"), queue="vip")).queue == "vip"
    assert (await client.insert(SendEmail("a"), queue="default")).queue == "default"
    many = await client.insert_many([SendEmail("a"), Charge(1)], queue="batch")
    assert [job.queue for job in many] == ["batch", "batch"]


async def test_batches_route_each_kind(client: awa.AsyncClient, conn: Conn) -> None:
    register(client)
    items = [
        SendEmail("a"),
        Charge(1),
        Unrouted(2),
        awa.EnqueueRequest(Charge(3)).priority(1),
        awa.EnqueueRequest(SendEmail("b")).queue("vip"),
    ]
    expected = ["email", "billing", "default", "billing", "vip"]
    inserted = await client.insert_many(items)
    assert [job.queue for job in inserted] == expected
    copied = await client.insert_many_copy(items)
    assert [job.queue for job in copied] == expected
    assert [queue_of(conn, job.id) for job in copied] == expected


async def test_transactions_route_by_task(client: awa.AsyncClient, conn: Conn) -> None:
    register(client)
    async with client.transaction() as tx:
        one = await tx.insert(SendEmail("a"))
        many = await tx.insert_many([Charge(1), Unrouted(2)])
    assert [queue_of(conn, job.id) for job in (one, *many)] == ["email", "billing", "default"]


async def test_unique_by_queue_uses_the_routed_queue(client: awa.AsyncClient) -> None:
    register(client)
    await client.insert(SendEmail("a"), unique_opts={"by_queue": True})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), queue="email", unique_opts={"by_queue": True})
    # Another queue is another key.
    await client.insert(SendEmail("a"), queue="other", unique_opts={"by_queue": True})


async def test_enqueue_request_with_opts_routes_unless_it_names_a_queue(
    client: awa.AsyncClient,
) -> None:
    register(client)
    routed = awa.EnqueueRequest(Charge(1)).queue("vip").with_opts(awa.InsertOpts(priority=1))
    explicit = awa.EnqueueRequest(Charge(1)).with_opts(awa.InsertOpts(queue="vip"))
    rows = await client.insert_many([routed, explicit])
    assert [(job.queue, job.priority) for job in rows] == [("billing", 1), ("vip", 2)]


def test_blocking_client_has_no_tasks_and_uses_default(sync_client: awa.Client) -> None:
    assert sync_client.insert(SendEmail("a")).queue == "default"


async def test_follow_ups_and_staged_follow_ups_are_routed(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @dataclasses.dataclass
    class Signup:
        user_id: int

    register(client)

    @client.task(Signup, queue="signups")
    async def signup(job: awa.Job[Signup]) -> None:
        job.enqueue_on_completion(Charge(job.args.user_id))
        job.enqueue_on_completion(Unrouted(job.args.user_id))
        job.enqueue_on_completion(SendEmail("staged"), queue="vip")

    client.on_completed_enqueue(Signup, lambda args, job: SendEmail(f"u{args.user_id}"))
    client.on_completed_enqueue_with(
        Signup, lambda args, job: awa.EnqueueRequest(Charge(args.user_id)).priority(1)
    )

    await start(client, queue("signups"))
    try:
        trigger = await client.insert(Signup(7))
        assert trigger.queue == "signups"
        await wait_for_state(conn, trigger.id, "completed")
    finally:
        await client.shutdown()
    rows = conn.execute(
        "SELECT kind, queue, priority FROM awa.jobs WHERE id <> %s ORDER BY id", (trigger.id,)
    ).fetchall()
    assert rows == [
        ("send_email", "email", 2),
        ("charge", "billing", 1),
        ("charge", "billing", 2),
        ("unrouted", "default", 2),
        ("send_email", "vip", 2),
    ]


async def test_test_client_and_handler_job_route_like_the_worker(
    client: awa.AsyncClient,
) -> None:
    @dataclasses.dataclass
    class Order:
        n: int

    register(client)

    async def handle(job: awa.Job[Order]) -> None:
        job.enqueue_on_completion(SendEmail("x"))

    client.task(Order, queue="orders")(handle)
    await client.insert(Order(1))
    result = await AwaTestClient(client).work_one(Order)
    assert result.is_completed()
    assert [job.queue for job in await client.list_jobs(kind="send_email")] == ["email"]

    unit = HandlerJob(Order(2), client=client)
    await unit.run(handle)
    assert [staged.queue for staged in unit.staged] == ["email"]
    assert [staged.queue for staged in (await _staged_without_client(handle))] == ["default"]


async def _staged_without_client(handler: object) -> tuple[awa.StagedFollowUp, ...]:
    @dataclasses.dataclass
    class Order:
        n: int

    job = HandlerJob(Order(3))
    await job.run(handler)  # type: ignore[arg-type]
    return job.staged
