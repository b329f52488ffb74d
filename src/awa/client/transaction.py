"""Transactions on a client's pool: jobs inserted here exist exactly when the work commits.

``async with client.transaction() as tx`` commits when the block ends normally and rolls back
when it raises; ``tx = await client.transaction()`` gives the same object for explicit
``commit()`` / ``rollback()``. Committing after a statement failed rolls back and raises
AwaError, so a commit that returns really committed. Statements take psycopg placeholders
(``%s``, or ``%(name)s`` with one mapping argument) or Postgres' ``$1, $2`` (as the
reference package's do), and return rows as dicts; their SQL errors are psycopg's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Self, Unpack, cast

import psycopg
from psycopg.rows import dict_row

from awa.errors import AwaError, DatabaseError
from awa.model import JobRow
from awa.observability.tracing import describe_insert, producing
from awa.producer.backpressure import guarded
from awa.producer.insert import (
    DEFAULT_RULES,
    InsertKwargs,
    InsertRules,
    PreparedJob,
    prepare_job,
    prepare_many,
    split_kwargs,
)
from awa.producer.placeholders import translate
from awa.producer.statements import insert_call
from awa.storage.db import (
    Call,
    drive_async,
    drive_sync,
    run_call_async,
    run_call_sync,
    translate_errors,
)
from awa.workflows.operations import BatchRun, Workflow, WorkflowRun, batch_workflow

Params = Sequence[Any] | Mapping[str, Any]


def _statement(query: str, args: tuple[Any, ...]) -> tuple[str, Params | None]:
    """The statement and parameters for psycopg; ``$1``-style placeholders (the reference
    package's) are translated, psycopg's ``%s`` / ``%(name)s`` pass as they are."""
    if not args:
        # No parameters: the text is sent as is, so a literal % needs no escaping and
        # several statements separated by semicolons may run in one call.
        return query, None
    if len(args) == 1 and isinstance(args[0], Mapping):
        return query, cast(Mapping[str, Any], args[0])
    return translate(query, args)


@contextlib.contextmanager
def _own_statement_errors() -> Iterator[None]:
    """Errors of the caller's own statements stay psycopg's: an unknown column or a duplicate
    key in the caller's table is not a missing awa schema or a job UniqueConflict. Only a
    lost connection becomes DatabaseError, as everywhere else."""
    try:
        yield
    except psycopg.OperationalError as error:
        raise DatabaseError(f"database unavailable: {error}") from error


def _insert(jobs: Sequence[PreparedJob], rules: InsertRules) -> Call[list[JobRow]]:
    return guarded(rules, insert_call(jobs), [job.queue for job in jobs])


async def insert_prepared_async(
    conn: psycopg.AsyncConnection[Any], jobs: Sequence[PreparedJob], rules: InsertRules
) -> list[JobRow]:
    """Insert prepared jobs on a connection (see ``insert_call``), checked against the
    depth limits of ``rules``."""
    return await run_call_async(conn, _insert(jobs, rules))


def insert_prepared_sync(
    conn: psycopg.Connection[Any], jobs: Sequence[PreparedJob], rules: InsertRules
) -> list[JobRow]:
    """Insert prepared jobs on a blocking connection (see ``insert_prepared_async``)."""
    return run_call_sync(conn, _insert(jobs, rules))


class _Finished(AwaError):
    pass


def _finished() -> AwaError:
    return _Finished("the transaction was already committed or rolled back")


def _not_begun() -> AwaError:
    return AwaError(
        "the transaction has not begun: use `async with client.transaction() as tx` "
        "or `tx = await client.transaction()`"
    )


def _failed(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a statement failed in the open transaction (Postgres then refuses to commit,
    and COMMIT silently rolls back)."""
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR


def _rolled_back_instead() -> AwaError:
    return AwaError(
        "a statement in this transaction failed, so it was rolled back instead of committed"
    )


class Transaction:
    """An open transaction on one pooled connection (asyncio)."""

    def __init__(
        self,
        acquire: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        release: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]],
        rules: InsertRules = DEFAULT_RULES,
    ) -> None:
        self._acquire = acquire
        self._release = release
        self._rules = rules
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._block: AbstractAsyncContextManager[psycopg.AsyncTransaction] | None = None
        self._done = False

    async def _begin(self) -> Self:
        if self._conn is None:
            conn = await self._acquire()
            try:
                block = conn.transaction()
                with translate_errors():
                    await block.__aenter__()
            except BaseException:
                await self._release(conn)
                raise
            self._conn, self._block = conn, block
        return self

    def __await__(self) -> Generator[Any, None, Self]:
        return self._begin().__await__()

    async def __aenter__(self) -> Self:
        return await self._begin()

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._done:
            return
        if exc_type is None:
            await self.commit()
        else:
            await self.rollback()

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        """The underlying psycopg connection, for statements beyond this API."""
        if self._done:
            raise _finished()
        if self._conn is None:
            raise _not_begun()
        return self._conn

    async def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        """Insert one job in this transaction (see ``AsyncClient.insert``)."""
        kind, opts = split_kwargs("insert", kwargs)
        with producing() as span:
            job = prepare_job(args, kind=kind, opts=opts, rules=self._rules)
            describe_insert(span, [job])
            return (await insert_prepared_async(self.connection, [job], self._rules))[0]

    async def insert_many(
        self, jobs: Iterable[Any], **kwargs: Unpack[InsertKwargs]
    ) -> list[JobRow]:
        """Insert several jobs in this transaction (see ``AsyncClient.insert_many``)."""
        kind, opts = split_kwargs("insert_many", kwargs)
        with producing() as span:
            prepared = prepare_many(jobs, kind=kind, opts=opts, rules=self._rules)
            describe_insert(span, prepared)
            return await insert_prepared_async(self.connection, prepared, self._rules)

    async def insert_workflow(self, workflow: Workflow) -> WorkflowRun:
        """Insert a workflow's jobs in this transaction (see ``AsyncClient.insert_workflow``)."""
        async with self.connection.transaction():  # a savepoint: all of it or nothing
            return await drive_async(self.connection, workflow.flow(self._rules))

    async def insert_batch(
        self, members: Iterable[Any], *, on_complete: Any, **options: Any
    ) -> BatchRun:
        """Insert a batch in this transaction (see ``AsyncClient.insert_batch``)."""
        workflow, fan_in = batch_workflow(members, on_complete, options)
        run = await self.insert_workflow(workflow)
        return BatchRun(run.id, run.jobs[: fan_in.index], run[fan_in])

    async def execute(self, query: str, *params: Any) -> int:
        """Run a statement; returns the number of rows it affected."""
        with _own_statement_errors():
            cursor = await self.connection.execute(*_statement(query, params))
        return cursor.rowcount

    async def fetch_all(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with _own_statement_errors():
            async with self.connection.cursor(row_factory=dict_row) as cursor:
                await cursor.execute(*_statement(query, params))
                return await cursor.fetchall()

    async def fetch_optional(self, query: str, *params: Any) -> dict[str, Any] | None:
        rows = await self.fetch_all(query, *params)
        return rows[0] if rows else None

    async def fetch_one(self, query: str, *params: Any) -> dict[str, Any]:
        """The first row; raises AwaError when the query returns none."""
        row = await self.fetch_optional(query, *params)
        if row is None:
            raise AwaError("fetch_one(): the query returned no rows")
        return row

    async def commit(self) -> None:
        await self._finish(None)

    async def rollback(self) -> None:
        await self._finish(psycopg.Rollback())

    async def _finish(self, rollback: psycopg.Rollback | None) -> None:
        if self._done:
            raise _finished()
        if self._conn is None or self._block is None:
            raise _not_begun()
        self._done = True
        conn, block = self._conn, self._block
        failed = rollback is None and _failed(conn)
        if failed:
            rollback = psycopg.Rollback()
        try:
            with translate_errors():
                if rollback is None:
                    await block.__aexit__(None, None, None)
                else:
                    await block.__aexit__(type(rollback), rollback, None)
        finally:
            await self._release(conn)
        if failed:
            raise _rolled_back_instead()


class SyncTransaction:
    """An open transaction on one pooled connection (blocking)."""

    def __init__(
        self,
        acquire: Callable[[], psycopg.Connection[Any]],
        release: Callable[[psycopg.Connection[Any]], None],
        rules: InsertRules = DEFAULT_RULES,
    ) -> None:
        self._rules = rules
        conn = acquire()
        try:
            block = conn.transaction()
            with translate_errors():
                block.__enter__()
        except BaseException:
            release(conn)
            raise
        self._conn = conn
        self._block = block
        self._release = release
        self._done = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._done:
            raise _finished()
        return self._conn

    def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        kind, opts = split_kwargs("insert", kwargs)
        with producing() as span:
            job = prepare_job(args, kind=kind, opts=opts, rules=self._rules)
            describe_insert(span, [job])
            return insert_prepared_sync(self.connection, [job], self._rules)[0]

    def insert_many(self, jobs: Iterable[Any], **kwargs: Unpack[InsertKwargs]) -> list[JobRow]:
        kind, opts = split_kwargs("insert_many", kwargs)
        with producing() as span:
            prepared = prepare_many(jobs, kind=kind, opts=opts, rules=self._rules)
            describe_insert(span, prepared)
            return insert_prepared_sync(self.connection, prepared, self._rules)

    def insert_workflow(self, workflow: Workflow) -> WorkflowRun:
        with self.connection.transaction():
            return drive_sync(self.connection, workflow.flow(self._rules))

    def insert_batch(self, members: Iterable[Any], *, on_complete: Any, **options: Any) -> BatchRun:
        workflow, fan_in = batch_workflow(members, on_complete, options)
        run = self.insert_workflow(workflow)
        return BatchRun(run.id, run.jobs[: fan_in.index], run[fan_in])

    def execute(self, query: str, *params: Any) -> int:
        with _own_statement_errors():
            cursor = self.connection.execute(*_statement(query, params))
        return cursor.rowcount

    def fetch_all(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with _own_statement_errors(), self.connection.cursor(row_factory=dict_row) as cursor:
            cursor.execute(*_statement(query, params))
            return cursor.fetchall()

    def fetch_optional(self, query: str, *params: Any) -> dict[str, Any] | None:
        rows = self.fetch_all(query, *params)
        return rows[0] if rows else None

    def fetch_one(self, query: str, *params: Any) -> dict[str, Any]:
        row = self.fetch_optional(query, *params)
        if row is None:
            raise AwaError("fetch_one(): the query returned no rows")
        return row

    def commit(self) -> None:
        self._finish(None)

    def rollback(self) -> None:
        self._finish(psycopg.Rollback())

    def _finish(self, rollback: psycopg.Rollback | None) -> None:
        if self._done:
            raise _finished()
        self._done = True
        failed = rollback is None and _failed(self._conn)
        if failed:
            rollback = psycopg.Rollback()
        try:
            with translate_errors():
                if rollback is None:
                    self._block.__exit__(None, None, None)
                else:
                    self._block.__exit__(type(rollback), rollback, None)
        finally:
            self._release(self._conn)
        if failed:
            raise _rolled_back_instead()
