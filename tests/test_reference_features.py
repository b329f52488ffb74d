"""The reference package's (awa-pg) dead-letter queue, descriptors, partitioned queues and
batch operations, used as its documentation describes them (python-api.md §2.6, §2.11,
§2.12, §5.9): millisecond options, list-of-dicts queues, rows read as dicts."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

import awa


@dataclasses.dataclass
class ChargeCard:
    order_id: int


@dataclasses.dataclass
class ShipOrder:
    order_id: int


async def wait_until(predicate, timeout=10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_dead_letter_queue(database_url: str) -> None:
    client = awa.AsyncClient(database_url)

    @client.task(ChargeCard, queue="payments")
    async def charge(job):  # type: ignore[no-untyped-def]
        raise awa.TerminalError("card declined")

    job = await client.insert(ChargeCard(order_id=1), queue="payments")
    await client.start(
        [{"name": "payments", "max_workers": 2, "dlq_enabled": True}],
        poll_interval_ms=50,
        leader_election_interval_ms=200,
        heartbeat_interval_ms=200,
    )
    try:
        entry = await wait_until(lambda: client.get_dlq_job(job["id"]))
        assert entry.job["kind"] == "charge_card"
        assert entry.reason == "terminal_error"
        assert await client.get_job(job["id"]) is None  # moved, not copied
        assert await client.dlq_depth(queue="payments") == 1
        assert await client.dlq_depth_by_queue() == [("payments", 1)]
        assert [e.job.id for e in await client.list_dlq(kind="charge_card")] == [job["id"]]
        with pytest.raises(awa.ValidationError, match="allow_all"):
            await client.purge_dlq()
    finally:
        await client.shutdown(timeout_ms=2000)
    revived = await client.retry_from_dlq(job["id"], queue="payments-retry", priority=1)
    assert revived is not None
    assert revived["state"] == "available"
    assert revived["attempt"] == 0
    assert revived["queue"] == "payments-retry"
    assert await client.retry_from_dlq(job["id"]) is None  # not in the DLQ any more
    await client.close()


async def test_descriptors(database_url: str) -> None:
    client = awa.AsyncClient(database_url)

    @client.task(ShipOrder, queue="shipping")
    async def ship(job):  # type: ignore[no-untyped-def]
        return None

    client.queue_descriptor(
        "shipping",
        display_name="Shipping",
        description="Label printing and carrier pickups",
        owner="fulfilment-team",
        docs_url="https://wiki.example.com/shipping",
        tags=["critical"],
        extra={"pager": "fulfilment"},
    )
    client.job_kind_descriptor("ship_order", display_name="Ship an order", owner="fulfilment")
    await client.start([{"name": "shipping", "max_workers": 1}], leader_election_interval_ms=200)
    try:
        with pytest.raises(awa.AwaError, match="before start"):
            client.queue_descriptor("shipping", display_name="late")
        [queue] = await client.list_queue_descriptors(queue="shipping")
        assert queue.display_name == "Shipping"
        assert queue.owner == "fulfilment-team"
        [kind] = await client.list_job_kind_descriptors(kind="ship_order")
        assert kind.display_name == "Ship an order"
    finally:
        await client.shutdown(timeout_ms=2000)
        await client.close()


async def test_partitioned_queue(database_url: str) -> None:
    orders = awa.PartitionedQueue("orders", 4)
    assert orders.physical_queues == ["orders", "orders__p1", "orders__p2", "orders__p3"]
    assert len(orders) == 4
    route = orders.route_by_key("customer-42")
    assert route == orders.route_by_key(b"customer-42")  # str is its UTF-8 bytes
    assert route["queue"] in orders.physical_queues
    client = awa.AsyncClient(database_url)
    placed = await client.insert(ShipOrder(order_id=7), **orders.route_by_key("customer-42"))
    assert placed["queue"] == route["queue"]

    @client.task(ShipOrder, queue="orders")
    async def ship(job):  # type: ignore[no-untyped-def]
        return None

    await client.start(orders.queue_configs(2, deadline_duration_ms=60_000), poll_interval_ms=50)
    try:

        async def done():  # type: ignore[no-untyped-def]
            row = await client.get_job(placed["id"])
            return row["state"] == "completed"

        await wait_until(done)
    finally:
        await client.shutdown(timeout_ms=2000)
        await client.close()


async def test_batch_operations(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    jobs = [await client.insert(ShipOrder(order_id=n), queue="slow-lane") for n in range(5)]
    preview = await client.preview_set_priority(1, filter={"queue": "slow-lane"})
    assert preview["total_matched"] == 5
    with pytest.raises(awa.ValidationError, match="allow_all"):
        await client.set_priority(1)
    operation = await client.set_priority(1, filter={"queue": "slow-lane"}, submitted_by="ops")
    assert operation["op_kind"] == "set_priority"

    @client.task(ShipOrder, queue="elsewhere")
    async def ship(job):  # type: ignore[no-untyped-def]
        return None

    await client.start(
        [{"name": "elsewhere", "max_workers": 1}],
        leader_election_interval_ms=200,
        heartbeat_interval_ms=200,
    )
    try:

        async def finished():  # type: ignore[no-untyped-def]
            record = await client.get_batch_operation(operation["id"])
            return record["state"] == "completed" and record

        await wait_until(finished, timeout=20)
        for job in jobs:
            assert (await client.get_job(job["id"]))["priority"] == 1
        listed = await client.list_batch_operations(state="completed")
        assert [record["id"] for record in listed] == [operation["id"]]
    finally:
        await client.shutdown(timeout_ms=2000)
        await client.close()
