"""Health: can we reach Postgres, is the schema current, who leads maintenance, which workers
run which queues, and how far behind each queue is.

The overall ``status``: ``healthy``; ``degraded`` when everything works but a queue is
unserved (it holds available jobs older than ``unserved_after`` seconds, is not paused, and
no live worker runs it) or a kind is (its jobs on a queue that live workers run have waited
that long, and none of those workers has a handler for it: workers claim only the kinds
they run); ``unhealthy`` when the schema is missing or out of date, no worker
leads maintenance, or this process's worker lost its listener or heartbeat; ``unreachable``
when the database does not answer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, Literal

from awa.model import MappingAccess
from awa.observability.queue_stats import QueueStats, decode_queue_stats
from awa.sql import current_version, query
from awa.storage.db import Flow, Statement
from awa.storage.migrations import schema_version_flow


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The backend holding the maintenance lock."""

    pid: int
    application_name: str
    client_addr: str | None
    since: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker runtime (a row of ``awa.runtimes`` whose heartbeat is fresh)."""

    id: uuid.UUID
    hostname: str
    pid: int
    application_name: str
    version: str
    queues: list[str]
    kinds: list[str] | None
    """The job kinds it has handlers for, the only ones it claims (None: a worker of an
    earlier release, which claims every kind)."""
    concurrency: dict[str, int]
    is_leader: bool
    started_at: dt.datetime
    heartbeat_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class UnservedQueue:
    """A queue whose jobs wait while no live worker runs it."""

    queue: str
    available: int
    oldest_available_age: float


@dataclasses.dataclass(frozen=True, slots=True)
class UnservedKind:
    """A kind whose jobs wait on a queue that live workers run while none of them has a
    handler for it (a rolling deploy half done, a task missing from a worker)."""

    queue: str
    kind: str
    available: int
    oldest_available_age: float


Status = Literal["healthy", "degraded", "unhealthy", "unreachable"]

HEALTH_CHECK_TIMEOUT = 5.0
"""Seconds a health check waits for a pooled connection before reporting the database
unreachable (while the database is down the pool would otherwise hold it for 30 s)."""

DEFAULT_UNSERVED_AFTER = 60.0
"""Seconds the oldest available job of a queue no worker runs may wait before the queue is
reported unserved."""


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeHealth:
    """This process's worker, when it runs."""

    is_leader: bool
    listener_connected: bool
    heartbeat_alive: bool
    in_flight: int
    queues: dict[str, dict[str, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class HealthCheck(MappingAccess):
    """``status`` (see the module docstring) and the findings behind it. ``healthy`` is
    true only when the status is ``healthy``; ``problems`` says what is wrong, one line
    each (unserved queues included)."""

    healthy: bool
    postgres_connected: bool
    schema_version: int | None
    expected_schema_version: int
    leader: LeaderInfo | None
    runtime: RuntimeHealth | None
    queues: list[QueueStats]
    problems: list[str]
    status: Status = "healthy"
    workers: list[WorkerInfo] = dataclasses.field(default_factory=list)
    unserved: list[UnservedQueue] = dataclasses.field(default_factory=list)
    unserved_kinds: list[UnservedKind] = dataclasses.field(default_factory=list)

    # The reference package's fields, beside ours (its ``leader`` and ``queues`` differ in
    # shape: ours are the leader's identity and per-queue statistics; see is_leader).
    @property
    def poll_loop_alive(self) -> bool:
        """This process runs a worker (its claim loops stop only with it)."""
        return self.runtime is not None

    @property
    def heartbeat_alive(self) -> bool:
        return self.runtime is not None and self.runtime.heartbeat_alive

    @property
    def shutting_down(self) -> bool:
        """Always False: a worker that is shutting down no longer reports a runtime."""
        return False

    @property
    def is_leader(self) -> bool:
        """This process leads maintenance (the reference's ``leader``)."""
        return self.runtime is not None and self.runtime.is_leader


def _leader(rows: list[dict[str, Any]]) -> LeaderInfo | None:
    if not rows:
        return None
    row = rows[0]
    return LeaderInfo(row["pid"], row["application_name"], row["client_addr"], row["backend_start"])


def _workers(rows: list[dict[str, Any]]) -> list[WorkerInfo]:
    return [WorkerInfo(**row) for row in rows]


def unserved_queues(
    queues: list[QueueStats], workers: list[WorkerInfo], unserved_after: float
) -> list[UnservedQueue]:
    """Queues with available jobs older than ``unserved_after`` seconds that are not paused
    and that no live worker runs."""
    served = {name for worker in workers for name in worker.queues}
    return [
        UnservedQueue(stats.queue, stats.available, stats.oldest_available_age or 0.0)
        for stats in queues
        if stats.oldest_available_age is not None
        and stats.oldest_available_age > unserved_after
        and not stats.paused
        and stats.queue not in served
    ]


def health_flow(
    runtime: RuntimeHealth | None,
    unserved_after: float = DEFAULT_UNSERVED_AFTER,
    *,
    queues: bool = True,
) -> Flow[HealthCheck]:
    """``queues=False`` leaves out the per-queue counts (and so unserved queues): a probe
    that runs every few seconds should not count a large job table."""
    version = yield from schema_version_flow()
    problems = []
    expected = current_version()
    if version is None:
        problems.append("the awa schema does not exist in this database (run `awa migrate`)")
        return _unhealthy(True, version, runtime, problems)
    if version != expected:
        problems.append(f"schema version is {version}, this package expects {expected}")
        return _unhealthy(True, version, runtime, problems)
    leader = yield Statement(query("leader_holder"), None, _leader)
    stats: list[QueueStats] = []
    kinds: list[UnservedKind] = []
    if queues:
        stats = yield Statement(query("queue_stats"), None, decode_queue_stats)
        kinds = yield Statement(query("unserved_kinds"), {"after": unserved_after}, _kinds)
    workers: list[WorkerInfo] = yield Statement(query("runtimes_live"), None, _workers)
    if leader is None:
        problems.append("no runtime holds the maintenance lock (no worker running?)")
    if runtime is not None:
        if not runtime.listener_connected:
            problems.append("this worker's notification listener is disconnected (polling)")
        if not runtime.heartbeat_alive:
            problems.append("this worker's heartbeat thread is not running")
    unserved = unserved_queues(stats, workers, unserved_after)
    degraded = bool(unserved or kinds)
    status: Status = "unhealthy" if problems else "degraded" if degraded else "healthy"
    problems.extend(
        f"queue {item.queue!r} is unserved: {item.available} available job(s), the oldest "
        f"waiting {item.oldest_available_age:.0f}s, and no live worker runs it"
        for item in unserved
    )
    problems.extend(
        f"kind {item.kind!r} is unserved on queue {item.queue!r}: {item.available} available "
        f"job(s), the oldest waiting {item.oldest_available_age:.0f}s, and no live worker of "
        "the queue has a handler for it"
        for item in kinds
    )
    return HealthCheck(
        status == "healthy",
        True,
        version,
        expected,
        leader,
        runtime,
        stats,
        problems,
        status,
        workers,
        unserved,
        kinds,
    )


def _kinds(rows: list[dict[str, Any]]) -> list[UnservedKind]:
    return [UnservedKind(**row) for row in rows]


def _unhealthy(
    connected: bool, version: int | None, runtime: RuntimeHealth | None, problems: list[str]
) -> HealthCheck:
    status: Status = "unhealthy" if connected else "unreachable"
    return HealthCheck(
        False, connected, version, current_version(), None, runtime, [], problems, status
    )


def schema_missing(runtime: RuntimeHealth | None) -> HealthCheck:
    """The database answers but holds no awa schema."""
    problem = "the awa schema does not exist in this database (run `awa migrate`)"
    return _unhealthy(True, None, runtime, [problem])


def unreachable(error: Exception, runtime: RuntimeHealth | None) -> HealthCheck:
    return _unhealthy(False, None, runtime, [f"database unreachable: {error}"])
