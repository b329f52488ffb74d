"""Health: can we reach Postgres, is the schema current, who leads maintenance, and how far
behind each queue is."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any

from awa import admin
from awa.admin import QueueStats
from awa.db import Flow, Statement
from awa.migrations import schema_version_flow
from awa.sql import current_version, query

if TYPE_CHECKING:
    from awa.worker.runtime import Runtime


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderInfo:
    """The backend holding the maintenance lock."""

    pid: int
    application_name: str
    client_addr: str | None
    since: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeHealth:
    """This process's worker, when it runs."""

    is_leader: bool
    listener_connected: bool
    heartbeat_alive: bool
    in_flight: int
    queues: dict[str, dict[str, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class HealthCheck:
    """``healthy`` is true when the database answers with the expected schema, some
    runtime holds the maintenance lock, and this process's worker (if any) is listening and
    heartbeating."""

    healthy: bool
    postgres_connected: bool
    schema_version: int | None
    expected_schema_version: int
    leader: LeaderInfo | None
    runtime: RuntimeHealth | None
    queues: list[QueueStats]
    problems: list[str]


def _leader(rows: list[dict[str, Any]]) -> LeaderInfo | None:
    if not rows:
        return None
    row = rows[0]
    return LeaderInfo(row["pid"], row["application_name"], row["client_addr"], row["backend_start"])


def runtime_health(runtime: Runtime | None) -> RuntimeHealth | None:
    if runtime is None:
        return None
    return RuntimeHealth(
        is_leader=runtime.is_leader,
        listener_connected=runtime.listener_connected,
        heartbeat_alive=runtime.heartbeat_alive,
        in_flight=len(runtime.inflight),
        queues=runtime.stats(),
    )


def health_flow(runtime: RuntimeHealth | None) -> Flow[HealthCheck]:
    version = yield from schema_version_flow()
    problems = []
    expected = current_version()
    if version is None:
        problems.append("the awa schema does not exist in this database (run `awa migrate`)")
        return HealthCheck(False, True, version, expected, None, runtime, [], problems)
    if version != expected:
        problems.append(f"schema version is {version}, this package expects {expected}")
        return HealthCheck(False, True, version, expected, None, runtime, [], problems)
    leader = yield Statement(query("leader_holder"), None, _leader)
    queues: list[QueueStats] = yield Statement(query("queue_stats"), None, admin.decode_queue_stats)
    if leader is None:
        problems.append("no runtime holds the maintenance lock (no worker running?)")
    if runtime is not None:
        if not runtime.listener_connected:
            problems.append("this worker's notification listener is disconnected (polling)")
        if not runtime.heartbeat_alive:
            problems.append("this worker's heartbeat thread is not running")
    return HealthCheck(not problems, True, version, expected, leader, runtime, queues, problems)


def schema_missing(runtime: RuntimeHealth | None) -> HealthCheck:
    """The database answers but holds no awa schema."""
    problem = "the awa schema does not exist in this database (run `awa migrate`)"
    return HealthCheck(False, True, None, current_version(), None, runtime, [], [problem])


def unreachable(error: Exception, runtime: RuntimeHealth | None) -> HealthCheck:
    return HealthCheck(
        False, False, None, current_version(), None, runtime, [], [f"database unreachable: {error}"]
    )
