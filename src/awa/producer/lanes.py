"""Single inserts of one ``AsyncClient`` outside a transaction, grouped when they crowd.

Each insert outside a transaction is a statement that commits on its own. When several
coroutines insert at once (a web application's request handlers), each would pay a round
trip and a commit. Here a few lanes (pooled connections at a time) serve them: an insert
that finds a lane free runs alone, as before; inserts that arrive while every lane is busy
wait, and the next lane to free up sends all of them as one statement, one round trip and
one commit. A connection that served an insert stays checked out until the event loop's
next turn, so a producer inserting one job after another reuses it without going through
the pool each time; it goes back to the pool as soon as the producer does anything else.

Each caller keeps the outcome of its own insert: its row, or its own ``UniqueConflict``
(the statement skips held unique keys, and only the callers whose keys were held get the
conflict); a statement the database refuses for another reason is retried job by job, so
an error reaches only the caller it belongs to. An insert that returned has committed, as
a single insert does. A database outage reaches every caller of the group, as it would
reach each of them alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import psycopg

from awa.errors import DatabaseError, SchemaNotMigrated
from awa.model import JobRow
from awa.producer.insert import PreparedJob
from awa.producer.statements import (
    insert_one_flow,
    insert_skipping_duplicates_flow,
    unique_conflict,
)
from awa.sql import query
from awa.storage.db import Statement, drive_async, run_async

Connection = psycopg.AsyncConnection[Any]
Acquire = Callable[[], Awaitable[Connection]]
Release = Callable[[Connection], Coroutine[Any, Any, None]]

MAX_GROUP = 1000
"""Inserts sent in one statement at most."""

_Waiting = tuple[PreparedJob, "asyncio.Future[JobRow]"]


class InsertLanes:
    def __init__(self, acquire: Acquire, release: Release, lanes: int) -> None:
        self._acquire = acquire
        self._release = release
        self._lanes = max(1, lanes)
        self._busy = 0
        self._waiting: list[_Waiting] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._kept: Connection | None = None  # the last insert's connection, for the next
        self._giving_back: asyncio.Handle | None = None

    async def insert(self, job: PreparedJob) -> JobRow:
        if self._busy < self._lanes:
            self._busy += 1
            try:
                conn = self._take_kept() or await self._acquire()
                try:
                    row = await drive_async(conn, insert_one_flow(job))
                except BaseException:
                    await self._release(conn)  # the pool checks a connection that failed
                    raise
                self._keep(conn)
                return row
            finally:
                self._free()
        future: asyncio.Future[JobRow] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, future))
        return await future

    async def close(self) -> None:
        """Wait for the groups being sent (their callers are waiting for them), and give
        back the kept connection."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        conn = self._take_kept()
        if conn is not None:
            await self._release(conn)

    def _take_kept(self) -> Connection | None:
        conn, self._kept = self._kept, None
        if self._giving_back is not None:
            self._giving_back.cancel()
            self._giving_back = None
        return conn

    def _keep(self, conn: Connection) -> None:
        """Keep ``conn`` for an insert that starts before the loop's next turn; give it
        back then."""
        if self._kept is not None:
            self._spawn(self._release(conn))
            return
        self._kept = conn
        self._giving_back = asyncio.get_running_loop().call_soon(self._give_back)

    def _give_back(self) -> None:
        self._giving_back = None
        conn = self._take_kept()
        if conn is not None:
            self._spawn(self._release(conn))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name="awa-inserts")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _free(self) -> None:
        """A lane is free: it serves the inserts waiting for one, if any."""
        self._busy -= 1
        if self._waiting and self._busy < self._lanes:
            self._busy += 1
            self._spawn(self._drain())

    def _take(self) -> list[_Waiting]:
        group = [item for item in self._waiting[:MAX_GROUP] if not item[1].done()]
        del self._waiting[:MAX_GROUP]
        return group

    async def _drain(self) -> None:
        group: list[_Waiting] = []
        try:
            while self._waiting:
                group = self._take()
                try:
                    conn = self._take_kept() or await self._acquire()
                    try:
                        while group:
                            await _send(conn, group)
                            group = self._take()
                    finally:
                        await self._release(conn)
                except Exception as error:
                    # No connection, or it broke: this group's callers get the error (as
                    # each would have alone); the next group tries again.
                    _fail(group, error)
                    group = []
        except BaseException:
            _fail(group, DatabaseError("the insert was abandoned: its client is closing"))
            raise
        finally:
            self._free()


def _fail(group: list[_Waiting], error: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(error)


async def _send(conn: psycopg.AsyncConnection[Any], group: list[_Waiting]) -> None:
    """Insert a group; set each caller's row or error."""
    if not group:
        return
    if len(group) == 1:
        await _alone(conn, *group[0])
        return
    jobs = [job for job, _ in group]
    try:
        result = await drive_async(conn, insert_skipping_duplicates_flow(jobs))
    except (DatabaseError, SchemaNotMigrated) as error:
        _fail(group, error)
        return
    except Exception:
        # Refused for one of them (a trigger, a constraint): one by one, so that the error
        # reaches its own caller only.
        for job, future in group:
            await _alone(conn, job, future)
        return
    skipped = {id(job) for job in result.duplicates}
    holders: dict[bytes, int] = {}
    if skipped:
        keys = [job.unique_key for job in result.duplicates if job.unique_key is not None]
        holders = await run_async(conn, _holders_statement(keys))
    rows = iter(result.inserted)
    for job, future in group:
        if id(job) in skipped:
            assert job.unique_key is not None
            outcome: BaseException | JobRow = unique_conflict([job], [job.unique_key], holders)
        else:
            outcome = next(rows)
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


async def _alone(
    conn: psycopg.AsyncConnection[Any], job: PreparedJob, future: asyncio.Future[JobRow]
) -> None:
    try:
        row = await drive_async(conn, insert_one_flow(job))
    except Exception as error:
        if not future.done():
            future.set_exception(error)
        if isinstance(error, DatabaseError):
            raise  # the connection is gone: the rest of the group fails with it
        return
    if not future.done():
        future.set_result(row)


def _holders_statement(keys: list[bytes]) -> Statement[dict[bytes, int]]:
    return Statement(
        query("unique_key_holders"),
        {"keys": keys},
        lambda rows: {bytes(row["unique_key"]): int(row["id"]) for row in rows},
    )
