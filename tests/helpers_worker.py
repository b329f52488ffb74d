"""Helpers for the worker-runtime tests: waiting for database states with a deadline, fast
runtime settings, and reading job rows directly.

Tests never sleep a fixed time to wait for an outcome: they poll the database (or an event)
until a condition holds, and fail with a clear message when the deadline passes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import awa
from jobs_helpers import Conn, job_row, must_job_row

# Per-queue settings that keep the suite fast: a short fallback poll.
FAST_QUEUE: dict[str, Any] = {"poll_interval": 0.05}

# Runtime settings that keep the suite fast: quick promotion, election and heartbeats.
FAST_RUNTIME: dict[str, Any] = {
    "promote_interval": 0.05,
    "leader_election_interval": 0.2,
    "heartbeat_interval": 0.2,
    "heartbeat_staleness": 5.0,
}


def queue(name: str = "default", max_workers: int = 4, **options: Any) -> dict[str, Any]:
    """A ``start()`` dict entry for one queue with fast settings (options override them)."""
    return {name: {"max_workers": max_workers, **FAST_QUEUE, **options}}


async def start(client: awa.AsyncClient, queues: Any = None, **options: Any) -> None:
    """``client.start`` with the fast runtime settings (keyword options override them)."""
    await client.start(queues if queues is not None else queue(), **{**FAST_RUNTIME, **options})


@contextlib.asynccontextmanager
async def second_client(database_url: str) -> AsyncIterator[awa.AsyncClient]:
    """Another AsyncClient (another runtime) on the same database, closed afterwards."""
    async with awa.AsyncClient(database_url) as other:
        yield other


async def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    *,
    interval: float = 0.01,
    message: str | Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy, and return it.

    Raises AssertionError when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(text or f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def wait_for_state(
    conn: Conn, job_id: int, state: str, timeout: float = 5.0
) -> dict[str, Any]:
    """Wait until job ``job_id`` is in ``state``; returns its row."""

    def check() -> dict[str, Any] | None:
        row = job_row(conn, job_id)
        return row if row is not None and row["state"] == state else None

    found: dict[str, Any] = await wait_for(
        check,
        timeout,
        message=lambda: f"job {job_id} never reached {state!r}: {describe(conn, job_id)}",
    )
    return found


async def wait_for_all(conn: Conn, state: str, count: int, timeout: float = 10.0) -> None:
    """Wait until ``count`` jobs are in ``state``."""

    def check() -> bool:
        row = conn.execute("SELECT count(*) FROM awa.jobs WHERE state = %s", (state,)).fetchone()
        return row is not None and row[0] == count

    await wait_for(check, timeout, message=lambda: f"states: {state_counts(conn)}")


def state_counts(conn: Conn) -> dict[str, int]:
    rows = conn.execute("SELECT state::text, count(*) FROM awa.jobs GROUP BY state").fetchall()
    return {str(state): int(count) for state, count in rows}


def describe(conn: Conn, job_id: int) -> str:
    row = job_row(conn, job_id)
    if row is None:
        return "no such row"
    keys = ("state", "attempt", "run_lease", "run_at", "errors")
    return ", ".join(f"{key}={row[key]!r}" for key in keys)


def row(conn: Conn, job_id: int) -> dict[str, Any]:
    return must_job_row(conn, job_id)


def insert_raw(conn: Conn, statement: str, *params: Any) -> int:
    """Run an ``INSERT ... RETURNING id`` written by hand (bypassing awa's validation) and
    return the new job's id."""
    result = conn.execute(statement, params).fetchone()
    assert result is not None
    return int(result[0])


def db_now(conn: Conn) -> dt.datetime:
    result = conn.execute("SELECT clock_timestamp()").fetchone()
    assert result is not None
    value: dt.datetime = result[0]
    return value


def seconds(delta: dt.timedelta) -> float:
    return delta.total_seconds()


def running_rows(conn: Conn) -> list[int]:
    """Ids of jobs left in state running."""
    return [r[0] for r in conn.execute("SELECT id FROM awa.jobs WHERE state = 'running'")]


async def no_longer_in_flight(client: awa.AsyncClient, job_id: int, timeout: float = 5.0) -> None:
    """Wait until the runtime has finalized (or dropped) its attempt of ``job_id``."""
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: job_id not in runtime.inflight, timeout)
