"""One hot logical queue spread over several ordinary physical queues.

``PartitionedQueue("orders", 4)`` names the physical queues ``orders``, ``orders__p1``,
``orders__p2`` and ``orders__p3`` (partition 0 keeps the logical name, so jobs inserted
under it before the split are still worked). Producers route each job by key (the same key
always lands on the same queue, and is stored as the job's ``ordering_key``) or round
robin by index; workers run every physical queue (``queue_configs``).

Key routing is the reference package's (awa-pg) to the bit: a producer or worker written
for it and one written for awa send a key to the same physical queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from awa.errors import ValidationError

__all__ = [
    "MAX_PHYSICAL_QUEUES",
    "PHYSICAL_QUEUE_SUFFIX",
    "PartitionedQueue",
    "ordering_key_hash64",
    "partition_for_ordering_key",
    "partition_hash64",
]

PHYSICAL_QUEUE_SUFFIX = "__p"
"""Physical queue ``i`` (from 1) of logical queue ``q`` is ``f"{q}__p{i}"``."""
MAX_PHYSICAL_QUEUES = 32767
"""The reference bounds a partitioned queue by its storage's 16-bit shard numbers."""

_MASK64 = (1 << 64) - 1
_OFFSET = 14695981039346656037  # the FNV-64 offset basis
_PRIME = 1099511628211  # the FNV-64 prime
# Xored into the base hash so that the partition chosen for a key does not correlate with
# the enqueue shard the reference's other storage engine picks from the same base hash.
_PARTITION_DOMAIN = 0x9D4D1B2F53A70C91

Key = bytes | bytearray | memoryview | str


def ordering_key_hash64(key: bytes) -> int:
    """The reference's portable 64-bit hash of ordering-key bytes: from the FNV-64 offset,
    ``h = (h * prime + byte) mod 2**64`` per byte (FNV's constants, but multiply then add,
    so not FNV-1 nor FNV-1a). The reference's SQL producer computes the same."""
    value = _OFFSET
    for byte in key:
        value = (value * _PRIME + byte) & _MASK64
    return value


def partition_hash64(key: bytes) -> int:
    """The hash that routes a key to a partition: the base hash xor a domain constant,
    mixed by the SplitMix64 finalizer (all arithmetic modulo 2**64)."""
    value = ordering_key_hash64(key) ^ _PARTITION_DOMAIN
    value ^= value >> 30
    value = (value * 0xBF58476D1CE4E5B9) & _MASK64
    value ^= value >> 27
    value = (value * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def partition_for_ordering_key(key: bytes, partitions: int) -> int:
    """The partition, in ``[0, partitions)``, of a key (0 when there is one or none)."""
    if partitions <= 1:
        return 0
    return partition_hash64(key) % partitions


def _key_bytes(key: object) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise ValidationError("ordering_key must be bytes-like or str")


def _index(index: object) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValidationError(f"index must be an integer, got {index!r}")
    if index < 0:
        raise ValidationError("index must be >= 0")
    return index


def _check_logical(logical_queue: object) -> str:
    if not isinstance(logical_queue, str):
        raise ValidationError("partitioned queue logical queue must be a string")
    if not logical_queue:
        raise ValidationError("partitioned queue logical queue must not be empty")
    return logical_queue


def _check_count(count: int) -> None:
    if count <= 0:
        raise ValidationError("partitioned queue partitions must be > 0")
    if count > MAX_PHYSICAL_QUEUES:
        raise ValidationError(
            f"partitioned queue supports at most {MAX_PHYSICAL_QUEUES} physical queues; got {count}"
        )


class PartitionedQueue:
    """A fixed, ordered list of physical queues standing for one logical queue.

    Raises ValidationError for an empty logical name, fewer than one or more than 32767
    physical queues, and (``from_physical_queues``) an empty or repeated name.
    """

    __slots__ = ("_logical", "_physical")

    def __init__(self, logical_queue: str, partitions: int) -> None:
        logical = _check_logical(logical_queue)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise ValidationError(f"partitions must be an integer, got {partitions!r}")
        _check_count(partitions)
        self._logical = logical
        suffixed = (f"{logical}{PHYSICAL_QUEUE_SUFFIX}{index}" for index in range(1, partitions))
        self._physical: tuple[str, ...] = (logical, *suffixed)

    @classmethod
    def from_physical_queues(
        cls, logical_queue: str, physical_queues: Iterable[str]
    ) -> PartitionedQueue:
        """A partitioned queue over queue names you already use, in the order given (the
        order decides which key goes where: keep it stable)."""
        logical = _check_logical(logical_queue)
        if isinstance(physical_queues, str | bytes):
            raise ValidationError("physical_queues must be a list of queue names, not a string")
        names = tuple(physical_queues)
        _check_count(len(names))
        seen: set[str] = set()
        for name in names:
            if not isinstance(name, str):
                raise ValidationError(
                    f"partitioned queue physical queue must be a string, got {name!r}"
                )
            if not name:
                raise ValidationError("partitioned queue physical queue must not be empty")
            if name in seen:
                raise ValidationError(f"partitioned queue physical queue {name!r} is duplicated")
            seen.add(name)
        queue = cls.__new__(cls)
        queue._logical = logical
        queue._physical = names
        return queue

    @property
    def logical_queue(self) -> str:
        """The name the application thinks in."""
        return self._logical

    @property
    def physical_queues(self) -> list[str]:
        """The queues jobs are stored in, which workers must run (a new list each time)."""
        return list(self._physical)

    @property
    def partitions(self) -> int:
        """How many physical queues there are."""
        return len(self._physical)

    def __len__(self) -> int:
        return len(self._physical)

    def __iter__(self) -> Iterator[str]:
        return iter(self._physical)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionedQueue):
            return NotImplemented
        return (self._logical, self._physical) == (other._logical, other._physical)

    def __hash__(self) -> int:
        return hash((self._logical, self._physical))

    def __repr__(self) -> str:
        # The reference's repr: the name in double quotes, as Rust's {:?} prints it.
        name = self._logical.replace("\\", "\\\\").replace('"', '\\"')
        return f'PartitionedQueue(logical_queue="{name}", partitions={len(self._physical)})'

    def queue_for_key(self, key: Key) -> str:
        """The physical queue of ``key`` (bytes, or a str taken as its UTF-8 bytes): always
        the same for the same key and the same list of queues."""
        return self._physical[partition_for_ordering_key(_key_bytes(key), len(self._physical))]

    def queue_for_index(self, index: int) -> str:
        """Round robin: physical queue ``index % partitions``, for producers that need no
        per-key order."""
        return self._physical[_index(index) % len(self._physical)]

    def route_by_key(self, key: Key) -> dict[str, Any]:
        """``{"queue": ..., "ordering_key": key bytes}``: insert options, e.g.
        ``client.insert(args, **orders.route_by_key(customer_id))``."""
        raw = _key_bytes(key)
        queue = self._physical[partition_for_ordering_key(raw, len(self._physical))]
        return {"queue": queue, "ordering_key": raw}

    def route_by_index(self, index: int) -> dict[str, Any]:
        """``{"queue": queue_for_index(index)}``: insert options."""
        return {"queue": self.queue_for_index(index)}

    def queue_configs(
        self,
        max_workers_per_partition: int | None = None,
        *,
        min_workers_per_partition: int | None = None,
        weight: int = 1,
        rate_limit_per_partition: Any = None,
        priority_aging_interval_ms: float | None = None,
        deadline_duration_ms: float | None = None,
        claimers: int | None = None,
        claim_batch_size: int | None = None,
        **queue_options: Any,
    ) -> list[dict[str, Any]]:
        """One queue config per physical queue, for ``client.start(...)``: dicts with
        ``name``, the same settings for each partition.

        Give ``max_workers_per_partition`` (slots of each queue) or
        ``min_workers_per_partition`` (with ``weight``: shares of
        ``start(global_max_workers=N)``). The other arguments are the reference's spellings
        (milliseconds; ``claimers`` is accepted and has no effect); ``queue_options`` are
        any other per-queue options of ``start()`` in awa's own spelling, in seconds
        (``deadline_duration=60``, ``poll_interval``, ``global_max_running``...), copied
        into each config and checked by ``start()``.
        """
        if max_workers_per_partition is not None and min_workers_per_partition is not None:
            raise ValidationError(
                "use max_workers_per_partition or min_workers_per_partition, not both"
            )
        if max_workers_per_partition is None and min_workers_per_partition is None:
            raise ValidationError(
                "queue_configs requires max_workers_per_partition or min_workers_per_partition"
            )
        if max_workers_per_partition is not None:
            _count(max_workers_per_partition, "max_workers_per_partition", minimum=1)
        if min_workers_per_partition is not None:
            _count(min_workers_per_partition, "min_workers_per_partition", minimum=0)
        _count(weight, "weight", minimum=1)
        settings: dict[str, Any] = {}
        for key, value in (("claimers", claimers), ("claim_batch_size", claim_batch_size)):
            if value is not None:
                settings[key] = _count(value, key, minimum=1)
        if rate_limit_per_partition is not None:
            settings["rate_limit"] = rate_limit_per_partition
        for key, millis in (
            ("priority_aging_interval_ms", priority_aging_interval_ms),
            ("deadline_duration_ms", deadline_duration_ms),
        ):
            if millis is not None:
                settings[key] = _millis(millis, key)
        _check_queue_options(queue_options, settings)

        configs = []
        for name in self._physical:
            config: dict[str, Any] = {"name": name}
            if max_workers_per_partition is not None:
                config["max_workers"] = max_workers_per_partition
            else:
                config["min_workers"] = min_workers_per_partition
                config["weight"] = weight
            config.update(settings)
            config.update(queue_options)
            configs.append(config)
        return configs


def _count(value: object, field: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise ValidationError(f"{field} must be {'> 0' if minimum == 1 else '>= 0'}")
    return value


def _millis(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{field} must be a finite number of milliseconds")
    if value < 0:
        raise ValidationError(f"{field} must be >= 0")
    return value


# Set through queue_configs' own arguments (the reference's), never through **queue_options.
_OWN_ARGUMENTS = {
    "name": "the partitions' names",
    "max_workers": "max_workers_per_partition",
    "min_workers": "min_workers_per_partition",
    "weight": "weight",
    "rate_limit": "rate_limit_per_partition",
    "claimers": "claimers",
    "claim_batch_size": "claim_batch_size",
}


def _check_queue_options(queue_options: dict[str, Any], settings: dict[str, Any]) -> None:
    for key in queue_options:
        if key in _OWN_ARGUMENTS:
            raise ValidationError(f"queue_configs: {key} is set by {_OWN_ARGUMENTS[key]}")
    if "deadline_duration" in queue_options and "deadline_duration_ms" in settings:
        raise ValidationError(
            "queue_configs: give deadline_duration (seconds) or deadline_duration_ms, not both"
        )
