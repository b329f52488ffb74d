"""``awa.producer.partitioned.PartitionedQueue``: one logical queue over several physical ones.

Contract (the reference package's ``PartitionedQueue``): physical names ``q``, ``q__p1``...;
keys routed by the reference's own hash, so awa and awa-pg producers send a key to the same
queue; round robin by index; ``route_by_*`` give insert options; ``queue_configs`` gives
``start()`` one config per physical queue; bad input raises ``awa.ValidationError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import awa
from awa.producer.partitioned import (
    PartitionedQueue,
    ordering_key_hash64,
    partition_for_ordering_key,
    partition_hash64,
)
from helpers_worker import FAST_RUNTIME, wait_for_all
from jobs_helpers import Conn

# Naming --------------------------------------------------------------------------------------


def test_default_names() -> None:
    orders = PartitionedQueue("customer-updates", 4)
    assert orders.logical_queue == "customer-updates"
    assert orders.partitions == 4
    assert len(orders) == 4
    assert orders.physical_queues == [
        "customer-updates",
        "customer-updates__p1",
        "customer-updates__p2",
        "customer-updates__p3",
    ]
    assert list(orders) == orders.physical_queues
    assert repr(orders) == 'PartitionedQueue(logical_queue="customer-updates", partitions=4)'
    single = PartitionedQueue("email", 1)
    assert single.physical_queues == ["email"]
    assert single.queue_for_key("anything") == "email"
    assert single.queue_for_index(42) == "email"
    # A copy each time: the queue cannot be changed through it.
    orders.physical_queues.append("nope")
    assert len(orders) == 4
    assert orders == PartitionedQueue("customer-updates", 4)
    assert orders != PartitionedQueue("customer-updates", 3)


def test_from_physical_queues_keeps_the_order_given() -> None:
    email = PartitionedQueue.from_physical_queues(
        "email", ["email-fast", "email-bulk", "email-slow"]
    )
    assert email.logical_queue == "email"
    assert email.partitions == 3
    assert email.physical_queues == ["email-fast", "email-bulk", "email-slow"]
    assert email.queue_for_index(0) == "email-fast"
    assert email.queue_for_index(4) == "email-bulk"
    assert PartitionedQueue.from_physical_queues("email", iter(["a", "b"])).partitions == 2
    # The same names route as the default naming does: routing depends only on positions.
    named = PartitionedQueue.from_physical_queues("orders", ["o0", "o1", "o2", "o3"])
    default = PartitionedQueue("orders", 4)
    for key in ("customer-1", "customer-42", "order-7", ""):
        position = default.physical_queues.index(default.queue_for_key(key))
        assert named.queue_for_key(key) == f"o{position}"


# Key routing: the reference's hash, to the bit ------------------------------------------------
#
# Expected values come from the reference's Rust code itself: ordering_key_hash64
# (awa-model/src/queue_storage.rs), partition_hash64 and partition_for_ordering_key
# (awa-model/src/partitioned_queue.rs) were copied into a scratch file, compiled with rustc
# 1.95 and run on these keys; the base hashes were also recomputed by the reference's SQL
# producer (the loop of awa.insert_job_compat, migration v018) on PostgreSQL 15, which
# agreed. Worked through by hand for the empty key:
#   base  = the FNV-64 offset 14695981039346656037 (no byte to fold in)
#   x0    = base ^ 0x9d4d1b2f53a70c91             = 0x56bf87cbd7852fb4
#   x1    = x0 ^ (x0 >> 30)                        = 0x56bf87ca8d7b309b
#   x2    = x1 * 0xbf58476d1ce4e5b9 mod 2**64      = 0xdef77bf6ae8cc703
#   x3    = x2 ^ (x2 >> 27)                        = 0xdef77bed7063b9d6
#   x4    = x3 * 0x94d049bb133111eb mod 2**64      = 0xb2ea36a03ed8cd72
#   h     = x4 ^ (x4 >> 31)                        = 0xb2ea36a15b0ca032 = 12892176949946654770
#   h % 4 = 2, so with 4 partitions the empty key goes to physical queue 2 ("orders__p2").

HASHES: list[tuple[bytes, int, int]] = [
    # key, ordering_key_hash64, partition_hash64
    (b"", 14695981039346656037, 12892176949946654770),
    (b"customer-42", 695220319317454988, 2415934538594125323),
    (b"customer-1", 3941431770969791803, 1220848219415206867),
    (b"order-7", 12460906398626632831, 5246969042653738012),
    ("ü".encode(), 590898472587934722, 7105582287575297355),
    (b"\x00\xff", 590684067820433644, 10885717959844649232),
]

PARTITIONS: list[tuple[bytes | str, dict[int, int]]] = [
    # key, {partitions: partition}
    (b"", {2: 0, 3: 1, 4: 2, 8: 2, 16: 2}),
    (b"customer-42", {2: 1, 3: 0, 4: 3, 8: 3, 16: 11}),
    ("customer-1", {2: 1, 3: 1, 4: 3, 8: 3, 16: 3}),
    ("customer-2", {2: 1, 3: 0, 4: 3, 8: 3, 16: 3}),
    ("customer-3", {2: 1, 3: 0, 4: 1, 8: 1, 16: 1}),
    ("order-7", {2: 0, 3: 1, 4: 0, 8: 4, 16: 12}),
    ("ü", {2: 1, 3: 0, 4: 3, 8: 3, 16: 11}),
    (b"\x00\xff", {2: 0, 3: 0, 4: 0, 8: 0, 16: 0}),
    ("tenant:acme", {2: 0, 3: 2, 4: 0, 8: 0, 16: 0}),
]


@pytest.mark.parametrize(("key", "base", "mixed"), HASHES)
def test_hashes_match_the_reference(key: bytes, base: int, mixed: int) -> None:
    assert ordering_key_hash64(key) == base
    assert partition_hash64(key) == mixed


@pytest.mark.parametrize(("key", "expected"), PARTITIONS)
def test_keys_land_where_the_reference_sends_them(
    key: bytes | str, expected: dict[int, int]
) -> None:
    raw = key.encode() if isinstance(key, str) else key
    for partitions, partition in expected.items():
        assert partition_for_ordering_key(raw, partitions) == partition
        queue = PartitionedQueue("orders", partitions)
        name = "orders" if partition == 0 else f"orders__p{partition}"
        assert queue.queue_for_key(key) == name
        assert queue.route_by_key(key) == {"queue": name, "ordering_key": raw}


def test_key_forms() -> None:
    orders = PartitionedQueue("orders", 8)
    # A str is its UTF-8 bytes; bytearray and memoryview are bytes.
    assert orders.queue_for_key("customer-42") == orders.queue_for_key(b"customer-42")
    assert orders.queue_for_key(bytearray(b"order-7")) == "orders__p4"
    assert orders.route_by_key(memoryview(b"order-7")) == {
        "queue": "orders__p4",
        "ordering_key": b"order-7",
    }
    assert partition_for_ordering_key(b"anything", 1) == 0
    assert partition_for_ordering_key(b"anything", 0) == 0
    # Every partition receives keys (the mixing spreads sequential keys).
    hit = {orders.queue_for_key(f"customer-{index}") for index in range(200)}
    assert hit == set(orders.physical_queues)


def test_index_routing_is_round_robin() -> None:
    email = PartitionedQueue("email", 4)
    assert [email.queue_for_index(index) for index in range(6)] == [
        "email",
        "email__p1",
        "email__p2",
        "email__p3",
        "email",
        "email__p1",
    ]
    assert email.route_by_index(5) == {"queue": "email__p1"}
    assert email.queue_for_index(2**70 + 3) == "email__p3"


# Validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PartitionedQueue("", 4), "logical queue must not be empty"),
        (lambda: PartitionedQueue("email", 0), "partitions must be > 0"),
        (lambda: PartitionedQueue("email", -1), "partitions must be > 0"),
        (lambda: PartitionedQueue("email", 32768), "at most 32767 physical queues; got 32768"),
        (lambda: PartitionedQueue("email", 2.0), "partitions must be an integer"),
        (lambda: PartitionedQueue("email", True), "partitions must be an integer"),
        (lambda: PartitionedQueue(None, 2), "logical queue must be a string"),
        (lambda: PartitionedQueue.from_physical_queues("email", []), "partitions must be > 0"),
        (
            lambda: PartitionedQueue.from_physical_queues("", ["a"]),
            "logical queue must not be empty",
        ),
        (
            lambda: PartitionedQueue.from_physical_queues("email", ["email-a", ""]),
            "physical queue must not be empty",
        ),
        (
            lambda: PartitionedQueue.from_physical_queues("email", ["email-a", "email-a"]),
            "'email-a' is duplicated",
        ),
        (
            lambda: PartitionedQueue.from_physical_queues("email", "email"),
            "not a string",
        ),
        (
            lambda: PartitionedQueue.from_physical_queues("email", ["a", 1]),
            "physical queue must be a string",
        ),
        (
            lambda: PartitionedQueue.from_physical_queues("e", [f"e{i}" for i in range(32768)]),
            "at most 32767 physical queues; got 32768",
        ),
    ],
)
def test_construction_errors(build: Any, message: str) -> None:
    with pytest.raises(awa.ValidationError, match=message):
        build()


def test_routing_errors() -> None:
    email = PartitionedQueue("email", 2)
    for bad_key in (object(), 42, None, ["a"]):
        with pytest.raises(awa.ValidationError, match="ordering_key must be bytes-like or str"):
            email.queue_for_key(bad_key)  # type: ignore[arg-type]
        with pytest.raises(awa.ValidationError, match="ordering_key must be bytes-like or str"):
            email.route_by_key(bad_key)  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="index must be >= 0"):
        email.queue_for_index(-1)
    with pytest.raises(awa.ValidationError, match="index must be >= 0"):
        email.route_by_index(-1)
    with pytest.raises(awa.ValidationError, match="index must be an integer"):
        email.queue_for_index(1.0)  # type: ignore[arg-type]


# queue_configs -------------------------------------------------------------------------------


def test_queue_configs_hard_reserved() -> None:
    email = PartitionedQueue("email", 2)
    assert email.queue_configs(
        max_workers_per_partition=8,
        rate_limit_per_partition=(100.0, 200),
        claimers=2,
        claim_batch_size=64,
        deadline_duration_ms=60_000,
        priority_aging_interval_ms=30_000,
    ) == [
        {
            "name": "email",
            "max_workers": 8,
            "rate_limit": (100.0, 200),
            "claimers": 2,
            "claim_batch_size": 64,
            "deadline_duration_ms": 60_000,
            "priority_aging_interval_ms": 30_000,
        },
        {
            "name": "email__p1",
            "max_workers": 8,
            "rate_limit": (100.0, 200),
            "claimers": 2,
            "claim_batch_size": 64,
            "deadline_duration_ms": 60_000,
            "priority_aging_interval_ms": 30_000,
        },
    ]
    # Positional, as the reference allows, and awa's own per-queue options in seconds.
    assert email.queue_configs(3, deadline_duration=45, poll_interval=0.1) == [
        {"name": "email", "max_workers": 3, "deadline_duration": 45, "poll_interval": 0.1},
        {"name": "email__p1", "max_workers": 3, "deadline_duration": 45, "poll_interval": 0.1},
    ]


def test_queue_configs_weighted() -> None:
    email = PartitionedQueue("email", 2)
    assert email.queue_configs(min_workers_per_partition=0, weight=3) == [
        {"name": "email", "min_workers": 0, "weight": 3},
        {"name": "email__p1", "min_workers": 0, "weight": 3},
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "requires max_workers_per_partition or min_workers_per_partition"),
        (
            {"max_workers_per_partition": 1, "min_workers_per_partition": 1},
            "not both",
        ),
        ({"max_workers_per_partition": 0}, "max_workers_per_partition must be > 0"),
        ({"min_workers_per_partition": -1}, "min_workers_per_partition must be >= 0"),
        ({"min_workers_per_partition": 0, "weight": 0}, "weight must be > 0"),
        ({"max_workers_per_partition": 1, "claimers": 0}, "claimers must be > 0"),
        ({"max_workers_per_partition": 1, "claim_batch_size": 0}, "claim_batch_size must be > 0"),
        ({"max_workers_per_partition": 1.5}, "max_workers_per_partition must be an integer"),
        ({"max_workers_per_partition": 1, "deadline_duration_ms": -1}, "must be >= 0"),
        ({"max_workers_per_partition": 1, "max_workers": 2}, "set by max_workers_per_partition"),
        ({"max_workers_per_partition": 1, "name": "x"}, "name is set by"),
        (
            {"max_workers_per_partition": 1, "deadline_duration": 1, "deadline_duration_ms": 1},
            "not both",
        ),
    ],
)
def test_queue_configs_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(awa.ValidationError, match=message):
        PartitionedQueue("email", 2).queue_configs(**options)


# Producers and workers on a real database -----------------------------------------------------


@dataclasses.dataclass
class CustomerUpdate:
    customer: str


async def test_routed_jobs_run_on_queue_configs(client: awa.AsyncClient, conn: Conn) -> None:
    """Jobs inserted with route_by_key/route_by_index land on the physical queues (with the
    key as their ordering_key); a worker started on queue_configs works them all, with the
    reference's millisecond settings applied."""
    updates = PartitionedQueue("customer-updates", 3)
    seen: list[tuple[str, str]] = []

    @client.task(CustomerUpdate, queue="customer-updates")
    async def apply(job: awa.Job[CustomerUpdate]) -> None:
        seen.append((job.queue, job.args.customer))

    keys = [f"customer-{index}" for index in range(12)]
    for key in keys:
        await client.insert(CustomerUpdate(key), **updates.route_by_key(key))
    for index in range(3):
        await client.insert(CustomerUpdate(f"bulk-{index}"), **updates.route_by_index(index))
    stored = conn.execute(
        "SELECT args->>'customer', queue, ordering_key FROM awa.jobs ORDER BY id"
    ).fetchall()
    for customer, queue, ordering_key in stored[: len(keys)]:
        assert queue == updates.queue_for_key(customer)
        assert bytes(ordering_key) == customer.encode()
    assert [queue for _, queue, _ in stored[len(keys) :]] == updates.physical_queues

    configs = updates.queue_configs(
        2, deadline_duration_ms=60_000, priority_aging_interval_ms=30_000, claimers=2
    )
    await client.start(configs, **FAST_RUNTIME)
    try:
        await wait_for_all(conn, "completed", len(keys) + 3)
        runtime = client.runtime
        assert runtime is not None
        assert [config.name for config in runtime.queues] == updates.physical_queues
        assert {config.deadline_duration for config in runtime.queues} == {60.0}
        assert {config.max_workers for config in runtime.queues} == {2}
        assert runtime.config.priority_aging_interval == 30.0
    finally:
        await client.shutdown(5)
    assert {queue for queue, _ in seen} == set(updates.physical_queues)
    assert sorted(customer for queue, customer in seen if customer in keys) == sorted(keys)


async def test_weighted_queue_configs_run(client: awa.AsyncClient, conn: Conn) -> None:
    """The weighted form shares start(global_max_workers=N) between the partitions."""
    updates = PartitionedQueue("customer-updates", 2)

    @client.task(CustomerUpdate, queue="customer-updates")
    async def apply(job: awa.Job[CustomerUpdate]) -> None:
        return None

    for index in range(6):
        await client.insert(CustomerUpdate(str(index)), **updates.route_by_key(str(index)))
    configs = updates.queue_configs(min_workers_per_partition=1, weight=2, deadline_duration=30)
    await client.start(configs, global_max_workers=4, **FAST_RUNTIME)
    try:
        await wait_for_all(conn, "completed", 6)
        runtime = client.runtime
        assert runtime is not None
        assert {(config.min_workers, config.weight) for config in runtime.queues} == {(1, 2)}
        assert {config.deadline_duration for config in runtime.queues} == {30.0}
    finally:
        await client.shutdown(5)
