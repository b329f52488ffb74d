"""Helpers for the producer and admin tests: reading rows directly, forcing states with SQL,
running the same call through every client flavour, and collecting notifications."""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

import awa
from awa.worker.lanes import parse_ready

Conn = psycopg.Connection[Any]

# Every way a producer can insert: the two clients, and a transaction of each.
INSERT_PATHS = ("async", "sync", "async_tx", "sync_tx")


async def maybe_await(value: Any) -> Any:
    """The value, awaited if it is awaitable (sync and async APIs behind one call)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def insert_via(
    path: str, client: awa.AsyncClient, sync_client: awa.Client, args: Any, **kwargs: Any
) -> awa.JobRow:
    """Insert one job through the named path (see INSERT_PATHS)."""
    return await _call_via(path, client, sync_client, "insert", args, **kwargs)


async def insert_many_via(
    path: str, client: awa.AsyncClient, sync_client: awa.Client, jobs: Any, **kwargs: Any
) -> list[awa.JobRow]:
    """Insert a batch through the named path (see INSERT_PATHS)."""
    return await _call_via(path, client, sync_client, "insert_many", jobs, **kwargs)


async def _call_via(
    path: str,
    client: awa.AsyncClient,
    sync_client: awa.Client,
    method: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    if path == "async":
        return await getattr(client, method)(*args, **kwargs)
    if path == "sync":
        return getattr(sync_client, method)(*args, **kwargs)
    if path == "async_tx":
        async with client.transaction() as tx:
            return await getattr(tx, method)(*args, **kwargs)
    if path == "sync_tx":
        with sync_client.transaction() as stx:
            return getattr(stx, method)(*args, **kwargs)
    raise AssertionError(f"unknown insert path {path!r}")


def count_jobs(conn: Conn, where: str = "true", *params: Any) -> int:
    """How many rows of awa.jobs match a SQL condition."""
    query = sql.SQL("SELECT count(*) FROM awa.jobs WHERE {}").format(sql.SQL(where))
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def job_row(conn: Conn, job_id: int) -> dict[str, Any] | None:
    """The raw row of one job, read with plain SQL (not through awa)."""
    with conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute("SELECT * FROM awa.jobs WHERE id = %s", (job_id,))
        return cursor.fetchone()


def must_job_row(conn: Conn, job_id: int) -> dict[str, Any]:
    row = job_row(conn, job_id)
    assert row is not None, f"job {job_id} is not in awa.jobs"
    return row


def job_rows(conn: Conn) -> list[dict[str, Any]]:
    """Every row of awa.jobs, oldest first."""
    with conn.cursor(row_factory=dict_row) as cursor:
        cursor.execute("SELECT * FROM awa.jobs ORDER BY id")
        return cursor.fetchall()


def set_state(conn: Conn, job_id: int, state: str, **columns: Any) -> None:
    """Force a job into a state (and set other columns) with a plain UPDATE."""
    assignments = [sql.SQL("state = {}::awa.job_state").format(sql.Literal(state))]
    assignments += [
        sql.SQL("{} = {}").format(sql.Identifier(name), sql.Literal(value))
        for name, value in columns.items()
    ]
    query = sql.SQL("UPDATE awa.jobs SET {} WHERE id = {}").format(
        sql.SQL(", ").join(assignments), sql.Literal(job_id)
    )
    assert conn.execute(query).rowcount == 1


@contextlib.contextmanager
def listening(url: str, *channels: str) -> Iterator[Conn]:
    """An autocommit connection LISTENing on the given channels."""
    with psycopg.connect(url, autocommit=True) as listener:
        for channel in channels:
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        yield listener


def notifications_so_far(listener: Conn, sender: Conn, channel: str) -> list[psycopg.Notify]:
    """Every notification delivered to ``listener`` up to now, on any channel it listens to.

    Sends a marker on ``channel`` from ``sender`` and reads until it arrives: notifications
    are delivered in commit order, so everything committed before the call has arrived by
    then, and no fixed wait is needed to prove that something was *not* sent.
    """
    marker = f"marker-{uuid.uuid4().hex}"
    sender.execute("SELECT pg_notify(%s, %s)", (channel, marker))
    received: list[psycopg.Notify] = []
    for notify in listener.notifies(timeout=10):
        if notify.channel == channel and notify.payload == marker:
            return received
        received.append(notify)
    raise AssertionError(f"the marker notification on {channel!r} never arrived")


def payloads(notifies: list[psycopg.Notify], channel: str) -> list[str]:
    return [notify.payload for notify in notifies if notify.channel == channel]


def ready_queues(notifies: list[psycopg.Notify]) -> list[str]:
    """The queues of the ``awa_ready`` notifications (each names one lane of a queue)."""
    queues = []
    for payload in payloads(notifies, "awa_ready"):
        parsed = parse_ready(payload)
        assert parsed is not None, f"malformed awa_ready payload {payload!r}"
        queues.append(parsed[0])
    return queues


@contextlib.contextmanager
def job_insert_trigger(conn: Conn, name: str, body: str, when: str = "true") -> Iterator[None]:
    """A BEFORE INSERT row trigger running the plpgsql ``body`` on every table a job is
    inserted into (awa.jobs is a view over them), dropped at the end."""
    conn.execute(
        sql.SQL("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}").format(
            sql.Identifier(name), sql.Literal(body)
        )
    )
    tables = ("active_jobs", "held_jobs")
    for table in tables:
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW WHEN ({}) EXECUTE FUNCTION {}()"
            ).format(
                sql.Identifier(name),
                sql.Identifier("awa", table),
                sql.SQL(when),  # type: ignore[arg-type]
                sql.Identifier(name),
            )
        )
    try:
        yield
    finally:
        for table in tables:
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(name), sql.Identifier("awa", table)
                )
            )
        conn.execute(sql.SQL("DROP FUNCTION {}()").format(sql.Identifier(name)))


def writer_xid(conn: Conn, job_id: int) -> str:
    """The transaction that wrote the job's row as it is now (its home's xmin)."""
    found = conn.execute(
        "SELECT xmin::text FROM awa.active_jobs WHERE id = %(id)s"
        " UNION ALL SELECT xmin::text FROM awa.held_jobs WHERE id = %(id)s"
        " UNION ALL SELECT xmin::text FROM awa.done_jobs WHERE id = %(id)s",
        {"id": job_id},
    ).fetchone()
    assert found is not None, f"no job {job_id}"
    return str(found[0])
