"""Insert jobs inside the application's own transaction, on the connection it already holds.

``await insert_job(conn, args, **opts)`` takes a psycopg ``AsyncConnection``, an asyncpg
connection (or pool connection) or a SQLAlchemy ``AsyncConnection`` / ``AsyncSession``;
``insert_job_sync(conn, args, **opts)`` takes a psycopg ``Connection``, a SQLAlchemy
``Connection`` / ``Session`` or a Django connection. The job is written by the statement awa
always uses, inside whatever transaction the connection has open: it exists if the caller
commits and never did if the caller rolls back. awa neither commits nor rolls back here.

asyncpg connections are expected to use asyncpg's default ``jsonb`` codec (text in, text out).
Database errors surface as the driver's own exceptions, so the caller's framework sees them.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import sys
import zoneinfo
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar, Unpack

import psycopg

from awa.errors import ValidationError
from awa.model import InsertOpts, JobRow
from awa.producer.backpressure import guarded_flow
from awa.producer.dependencies import dependencies_flow
from awa.producer.insert import (
    DEFAULT_RULES,
    InsertKwargs,
    InsertRules,
    PreparedJob,
    prepare_job,
    split_kwargs,
)
from awa.producer.statements import insert_flow
from awa.storage.db import CopyStatement, Flow, Notifications, Statement, run_async, run_sync

if TYPE_CHECKING:
    import asyncpg
    import django.db.backends.base.base
    import sqlalchemy.engine
    import sqlalchemy.ext.asyncio
    import sqlalchemy.orm

    AsyncConnectionLike: TypeAlias = (
        psycopg.AsyncConnection[Any]
        | asyncpg.Connection
        | sqlalchemy.ext.asyncio.AsyncConnection
        | sqlalchemy.ext.asyncio.AsyncSession
    )
    SyncConnectionLike: TypeAlias = (
        psycopg.Connection[Any]
        | sqlalchemy.engine.Connection
        | sqlalchemy.orm.Session
        | django.db.backends.base.base.BaseDatabaseWrapper
    )

__all__ = ["HasInsertRules", "insert_job", "insert_job_sync"]

R = TypeVar("R")
Rows = list[dict[str, Any]]

SUPPORTED = (
    "insert_job(): psycopg AsyncConnection, asyncpg Connection, SQLAlchemy AsyncConnection "
    "or AsyncSession; insert_job_sync(): psycopg Connection, SQLAlchemy Connection or "
    "Session, Django connection"
)

# Type oids of json and jsonb: drivers that hand these back as text get them decoded here.
_JSON_OIDS = frozenset({114, 3802})
_TOKEN = re.compile(r"%\((\w+)\)s|%%|%|:")


class HasInsertRules(Protocol):
    """A client whose task routes and defaults an insert follows (``AsyncClient``)."""

    @property
    def insert_rules(self) -> InsertRules: ...


def _rules(client: HasInsertRules | None) -> InsertRules:
    return client.insert_rules if client is not None else DEFAULT_RULES


async def insert_job(
    conn: AsyncConnectionLike,
    args: Any,
    *,
    client: HasInsertRules | None = None,
    **kwargs: Unpack[InsertKwargs],
) -> JobRow:
    """Insert one job in the transaction open on ``conn`` (options as ``AsyncClient.insert``).

    ``client``: an ``AsyncClient`` whose task routes and per-task defaults apply (without
    one, a job without ``queue=`` goes to ``"default"``). Raises ``ValidationError`` before
    any SQL runs and ``UniqueConflict`` (naming the holder's id) when a unique key is taken.
    """
    run = statement_runner_async(conn, "insert_job")
    kind, opts = split_kwargs("insert_job", kwargs)
    prepared = _prepare(args, kind, opts, client)
    return (await _drive_async(run, _insert_with_dependencies(prepared, _rules(client))))[0]


def insert_job_sync(
    conn: SyncConnectionLike,
    args: Any,
    *,
    client: HasInsertRules | None = None,
    **kwargs: Unpack[InsertKwargs],
) -> JobRow:
    """Blocking twin of :func:`insert_job` for psycopg, SQLAlchemy and Django connections."""
    run = statement_runner_sync(conn, "insert_job_sync")
    kind, opts = split_kwargs("insert_job_sync", kwargs)
    prepared = _prepare(args, kind, opts, client)
    return _drive_sync(run, _insert_with_dependencies(prepared, _rules(client)))[0]


_NUL = " contains a NUL byte, which Postgres cannot store"  # awa's checks' words


def _prepare(
    args: Any, kind: str | None, opts: InsertOpts, client: HasInsertRules | None
) -> PreparedJob:
    """``prepare_job``, with a NUL byte reported in the reference bridge's words."""
    try:
        return prepare_job(args, kind=kind, opts=opts, rules=_rules(client))
    except ValidationError as error:
        message = str(error)
        if not message.endswith(_NUL):
            raise
        where = message.removesuffix(_NUL)
        subject = next((part for part in ("args", "metadata") if where.startswith(part)), None)
        if subject is None:  # a text column: kind, queue, a tag, ...
            subject, stored = where, "Postgres cannot store them"
        else:
            stored = "Postgres JSONB does not support them"
        raise ValidationError(
            f"Job {subject} must not contain null bytes (\\u0000): {stored} (a NUL byte in {where})"
        ) from None


def _insert_with_dependencies(job: PreparedJob, rules: InsertRules) -> Flow[list[JobRow]]:
    """The insert (checked against the client's depth limits), and the job's dependency
    edges (in the caller's transaction)."""
    rows = yield from guarded_flow(rules, insert_flow([job]), [job.queue])
    return (yield from dependencies_flow(rows, [job]))


# --- Driving a flow through any driver ----------------------------------------------------


Step = Statement[Any] | CopyStatement | Notifications


def _drive_sync(run: Callable[[Step], Any], flow: Flow[R]) -> R:
    """Drive ``flow`` with a runner of ``statement_runner_sync``."""
    result: Any = None
    try:
        while True:
            result = run(flow.send(result))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _drive_async(run: Callable[[Step], Awaitable[Any]], flow: Flow[R]) -> R:
    """Drive ``flow`` with a runner of ``statement_runner_async``."""
    result: Any = None
    try:
        while True:
            result = await run(flow.send(result))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _shaped(step: Statement[Any], rows: Rows) -> list[Any]:
    """The rows as the statement decodes them: dicts (every runner's shape), or tuples of
    their values (in column order) when it asks for tuples."""
    return [tuple(row.values()) for row in rows] if step.tuples else list(rows)


def _no_copy(step: Statement[Any] | CopyStatement | Notifications) -> Statement[Any]:
    if not isinstance(step, Statement):  # insert_flow never copies or listens; guard it
        raise TypeError("awa.bridge runs statements only (no COPY, no notifications)")
    return step


def _named(step: Statement[Any]) -> Mapping[str, Any]:
    if step.params is None:  # a statement without parameters (the depth limits' read)
        return {}
    if not isinstance(step.params, Mapping):
        raise TypeError("awa.bridge runs statements with named parameters only")
    return step.params


@functools.cache
def _convert(sql: str, style: Literal["asyncpg", "sqlalchemy"]) -> tuple[str, tuple[str, ...]]:
    """psycopg ``%(name)s`` SQL in asyncpg's ``$n`` or SQLAlchemy ``text()``'s ``:name`` style,
    with the parameter names in ``$n`` order."""
    names: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name, token = match.group(1), match.group(0)
        if name is not None:
            if style == "sqlalchemy":
                return ":" + name
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"
        if token == "%%":
            return "%"
        if token == ":":
            # text() would read ":word" (in a literal, a comment, a "::" cast next to a
            # bind) as a parameter; "\:" is its escape for a literal colon.
            return "\\:" if style == "sqlalchemy" else ":"
        raise ValueError(f"awa.bridge: unsupported placeholder {token!r} in {sql!r}")

    return _TOKEN.sub(replace, sql), tuple(names)


def _decode_rows(
    description: Sequence[Sequence[Any]] | None,
    values: Sequence[Sequence[Any]],
    naive_tz: dt.tzinfo | None = None,
) -> Rows:
    """Rows as dicts with the Python types psycopg gives: JSON decoded, and (for Django
    without time zone support) naive timestamps put back in the session's zone."""
    if not description:
        return []
    names = [str(column[0]) for column in description]
    json_columns = {i for i, column in enumerate(description) if column[1] in _JSON_OIDS}
    rows = []
    for value in values:
        row = list(value)
        for i, item in enumerate(row):
            if isinstance(item, str) and i in json_columns:
                row[i] = json.loads(item)
            elif naive_tz is not None and isinstance(item, dt.datetime) and item.tzinfo is None:
                # The session's TimeZone is naive_tz, so the wall time is in that zone.
                row[i] = item.replace(tzinfo=naive_tz)
        rows.append(dict(zip(names, row, strict=True)))
    return rows


# --- Driver detection ---------------------------------------------------------------------


def _class(module: str, name: str) -> type | None:
    """A driver class, if its module was imported: an object of a class never imported
    cannot be passed in, so this never imports a driver."""
    loaded = sys.modules.get(module)
    found = getattr(loaded, name, None) if loaded is not None else None
    return found if isinstance(found, type) else None


def _is(conn: object, *classes: tuple[str, str]) -> bool:
    return any(
        cls is not None and isinstance(conn, cls)
        for cls in (_class(module, name) for module, name in classes)
    )


_ASYNCPG = (("asyncpg", "Connection"),)
_SA_ASYNC = (("sqlalchemy.ext.asyncio", "AsyncConnection"),)
_SA_ASYNC_SESSION = (
    ("sqlalchemy.ext.asyncio", "AsyncSession"),
    ("sqlalchemy.ext.asyncio", "async_scoped_session"),
)
_SA_SYNC = (("sqlalchemy.engine", "Connection"),)
_SA_SESSION = (("sqlalchemy.orm", "Session"), ("sqlalchemy.orm", "scoped_session"))
_DJANGO = (
    ("django.db.backends.base.base", "BaseDatabaseWrapper"),
    # django.db.connection is a proxy to the default connection, not a wrapper itself.
    ("django.utils.connection", "ConnectionProxy"),
)


def _is_async(conn: object) -> bool:
    return isinstance(conn, psycopg.AsyncConnection) or _is(
        conn, *_ASYNCPG, *_SA_ASYNC, *_SA_ASYNC_SESSION
    )


def _is_sync(conn: object) -> bool:
    return isinstance(conn, psycopg.Connection) or _is(conn, *_SA_SYNC, *_SA_SESSION, *_DJANGO)


def _unsupported(conn: object, function: str) -> TypeError:
    """The reference package's words for a connection the function cannot use."""
    name = f"{type(conn).__module__}.{type(conn).__qualname__}"
    if function.startswith("job."):
        return TypeError(
            "job.complete_in() takes an async connection (psycopg AsyncConnection, asyncpg, "
            "SQLAlchemy AsyncConnection or AsyncSession) and job.complete_in_sync() a blocking "
            "one (psycopg Connection, SQLAlchemy Connection or Session, Django connection); "
            f"{function}() got: {name}"
        )
    if function == "insert_job" and _is_sync(conn):
        return TypeError(
            "insert_job() requires an async connection. For sync psycopg3/SQLAlchemy/Django "
            f"connections, use insert_job_sync(). Got: {name}"
        )
    if function == "insert_job_sync" and _is_async(conn):
        return TypeError(
            "insert_job_sync() requires a sync psycopg3/SQLAlchemy/Django connection. For "
            f"async connections, use insert_job() (await awa.bridge.insert_job()). Got: {name}"
        )
    return TypeError(
        f"Unsupported connection type: {type(conn).__qualname__} "
        f"(module={type(conn).__module__}). Supported drivers: asyncpg, psycopg3, "
        f"SQLAlchemy, and Django ({SUPPORTED})."
    )


def _check_postgres(conn: object, name: str) -> None:
    if name != "postgresql":
        raise TypeError(f"awa.bridge needs a PostgreSQL connection, not {name} ({conn!r})")


def _async_runner(conn: object, function: str) -> Callable[[Statement[Any]], Awaitable[Rows]]:
    if isinstance(conn, psycopg.AsyncConnection):
        return functools.partial(_run_psycopg_async, conn)
    if _is(conn, *_ASYNCPG):
        return functools.partial(_run_asyncpg, conn)
    if _is(conn, *_SA_ASYNC, *_SA_ASYNC_SESSION):
        return functools.partial(_run_sqlalchemy_async, conn)
    raise _unsupported(conn, function)


def _sync_runner(conn: object, function: str) -> Callable[[Statement[Any]], Rows]:
    if isinstance(conn, psycopg.Connection):
        return functools.partial(_run_psycopg, conn)
    if _is(conn, *_SA_SYNC, *_SA_SESSION):
        return functools.partial(_run_sqlalchemy, conn)
    if _is(conn, *_DJANGO):
        _check_postgres(conn, conn.vendor)  # type: ignore[attr-defined]
        return functools.partial(_run_django, conn)
    raise _unsupported(conn, function)


def outside_transaction(conn: object) -> bool:
    """Whether ``conn`` commits each statement on its own (autocommit with no transaction
    open), as far as its driver tells: psycopg, asyncpg and Django do; False otherwise
    (SQLAlchemy begins a transaction with the first statement)."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        return bool(conn.autocommit) and idle
    if _is(conn, *_ASYNCPG):
        return not conn.is_in_transaction()  # type: ignore[attr-defined]
    if _is(conn, *_DJANGO):
        return bool(conn.get_autocommit()) and not conn.in_atomic_block  # type: ignore[attr-defined]
    return False


def statement_runner_async(conn: object, function: str) -> Callable[[Step], Awaitable[Any]]:
    """Run one statement, decoded, on any async connection this module supports (for work
    driven step by step elsewhere, such as a completion in the caller's transaction).
    ``function``: the public function it serves, named when ``conn`` is not supported."""
    run = _async_runner(conn, function)

    async def runner(step: Step) -> Any:
        statement = _no_copy(step)
        return statement.decode(_shaped(statement, await run(statement)))

    return runner


def statement_runner_sync(conn: object, function: str) -> Callable[[Step], Any]:
    """Blocking twin of :func:`statement_runner_async` (psycopg, SQLAlchemy, Django)."""
    run = _sync_runner(conn, function)

    def runner(step: Step) -> Any:
        statement = _no_copy(step)
        return statement.decode(_shaped(statement, run(statement)))

    return runner


# --- One statement on each driver ---------------------------------------------------------


def _undecoded(step: Statement[Any]) -> Statement[Rows]:
    return Statement(step.sql, step.params, lambda rows: rows)


async def _run_psycopg_async(conn: psycopg.AsyncConnection[Any], step: Statement[Any]) -> Rows:
    return await run_async(conn, _undecoded(step))


def _run_psycopg(conn: psycopg.Connection[Any], step: Statement[Any]) -> Rows:
    return run_sync(conn, _undecoded(step))


async def _run_asyncpg(conn: Any, step: Statement[Any]) -> Rows:
    sql, names = _convert(step.sql, "asyncpg")
    params = _named(step)
    # A prepared statement tells the column types, so jsonb text is decoded and nothing
    # about the caller's connection (its codecs) has to change.
    prepared = await conn.prepare(sql)
    records = await prepared.fetch(*(params[name] for name in names))
    columns = [(attr.name, attr.type.oid) for attr in prepared.get_attributes()]
    return _decode_rows(columns, [tuple(record) for record in records])


def _sqlalchemy_args(step: Statement[Any]) -> tuple[Any, dict[str, Any]]:
    from sqlalchemy import text

    return text(_convert(step.sql, "sqlalchemy")[0]), dict(_named(step))


def _sqlalchemy_rows(result: Any) -> Rows:
    cursor = result.cursor
    return _decode_rows(cursor.description if cursor is not None else None, result.all())


async def _run_sqlalchemy_async(conn: Any, step: Statement[Any]) -> Rows:
    if _is(conn, *_SA_ASYNC_SESSION):
        conn = await conn.connection()  # the session's connection, in its transaction
    _check_postgres(conn, conn.dialect.name)
    return _sqlalchemy_rows(await conn.execute(*_sqlalchemy_args(step)))


def _run_sqlalchemy(conn: Any, step: Statement[Any]) -> Rows:
    if _is(conn, *_SA_SESSION):
        conn = conn.connection()
    _check_postgres(conn, conn.dialect.name)
    return _sqlalchemy_rows(conn.execute(*_sqlalchemy_args(step)))


def _run_django(conn: Any, step: Statement[Any]) -> Rows:
    # Django passes pyformat SQL to its psycopg cursor unchanged. Without USE_TZ it returns
    # naive timestamps in the session zone (a DST fold hour resolves to its first instance).
    naive_tz = None
    if conn.timezone is None and conn.timezone_name:
        naive_tz = zoneinfo.ZoneInfo(conn.timezone_name)
    with conn.cursor() as cursor:
        cursor.execute(step.sql, _named(step))
        values = cursor.fetchall() if cursor.description is not None else []
        return _decode_rows(cursor.description, values, naive_tz)
