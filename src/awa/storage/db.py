"""Connections: where the database is, connection pools, running statements, error mapping."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, ParamSpec, TypeVar, overload

import orjson
import psycopg
import psycopg_pool
from psycopg import pq
from psycopg.adapt import AdaptersMap
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import set_json_loads

from awa.errors import DatabaseError, SchemaNotMigrated, UniqueConflict, ValidationError

R = TypeVar("R")
P = ParamSpec("P")

DEFAULT_APPLICATION_NAME = "awa"
_PG_ENV = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def resolve_database_url(url: str | None = None) -> str:
    """The connection string to use: ``url``, else ``DATABASE_URL``, else the libpq ``PG*``
    variables, else the embedded server (started on first use)."""
    if url:
        return check_database_url(url)
    env_url = os.environ.get("DATABASE_URL")
    if env_url:
        try:
            return check_database_url(env_url)
        except ValidationError as error:
            raise ValidationError(f"DATABASE_URL: {error}") from None
    if any(os.environ.get(name) for name in _PG_ENV):
        return ""  # libpq reads the PG* variables itself
    from awa.storage.embedded import embedded_database_url

    return embedded_database_url()


_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
POSTGRES_SCHEMES = ("postgresql", "postgres")
ACCEPTED_FORMS = (
    "postgresql://..., postgres://..., or a libpq key=value conninfo string "
    "such as 'host=localhost dbname=app'"
)


def check_database_url(url: str) -> str:
    """Return ``url`` if libpq can use it, else raise ``ValidationError`` saying which forms
    are accepted. An empty string passes (libpq then reads the ``PG*`` variables).

    Catches the URL of another database (``mysql://``, ``sqlite://``, SQLAlchemy's
    ``postgresql+psycopg://``) before a connection attempt fails with libpq's puzzling
    ``missing "=" after ...``. The message never repeats the URL (it may hold a password).
    """
    if not url.strip():
        return url
    match = _URL_SCHEME.match(url.strip())
    if match and match.group(1).lower() in POSTGRES_SCHEMES:
        if match.group(1) not in POSTGRES_SCHEMES:  # libpq reads the scheme case-sensitively
            raise ValidationError(
                f"the database URL starts with {match.group(1)}://; libpq needs the scheme in "
                "lower case: postgresql:// or postgres://"
            )
    elif match:
        raise ValidationError(
            f"the database URL starts with {match.group(1)}://, which is not a PostgreSQL "
            f"URL; use {ACCEPTED_FORMS}"
        )
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as error:
        # libpq quotes the token it choked on: leave it out when that may be the password.
        detail = "" if mask_password(url) != url else f" ({' '.join(str(error).split())})"
        if match:
            raise ValidationError(
                f"the database URL is not a valid PostgreSQL URL{detail}"
            ) from None
        raise ValidationError(
            f"the database URL is neither a PostgreSQL URL nor a valid key=value connection "
            f"string{detail}; use {ACCEPTED_FORMS}"
        ) from None
    return url


MASK = "***"
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&#]*)")


def mask_password(url: str) -> str:
    """The connection string with any password shown as ``***``: in a URL's user info
    (``postgresql://user:***@host/db``), in its query (``?password=***``), or in a key=value
    conninfo string (``password=***``). Everything else is left exactly as written."""
    match = _URL_SCHEME.match(url.strip())
    if not match:
        return _CONNINFO_PASSWORD.sub(lambda m: m.group(1) + MASK, url)
    scheme_end = url.index("://") + 3
    authority_end = len(url)
    for separator in "/?#":
        position = url.find(separator, scheme_end)
        if position != -1:
            authority_end = min(authority_end, position)
    authority = url[scheme_end:authority_end]
    userinfo, at, hosts = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        authority = f"{user}:{MASK}@{hosts}"
    rest = _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, url[authority_end:])
    return url[:scheme_end] + authority + rest


# Adapters for awa's own connections: JSON decoded with orjson (several times faster than
# the standard library on the claim path). Users' connections keep psycopg's defaults.
ADAPTERS = AdaptersMap(psycopg.adapters)
set_json_loads(orjson.loads, ADAPTERS)


def connection_kwargs(application_name: str) -> dict[str, Any]:
    return {"autocommit": True, "application_name": application_name, "context": ADAPTERS}


PoolT = TypeVar(
    "PoolT",
    psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]],
    psycopg_pool.ConnectionPool[psycopg.Connection[Any]],
)


def new_pool(pool_class: type[PoolT], url: str, *, max_size: int, application_name: str) -> PoolT:
    """A client's pool (``psycopg_pool.AsyncConnectionPool`` or ``ConnectionPool``) of awa's
    connections, not opened yet."""
    kwargs = connection_kwargs(application_name)
    return pool_class(url, min_size=1, max_size=max_size, kwargs=kwargs, open=False, name="awa")


CONNECT_TIMEOUT = 10


def redact(url: str) -> str:
    """The connection string without its password, for messages."""
    if not url:
        return "(from the PG* environment variables)"
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable connection string)"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **params)


def _unreachable(url: str, error: psycopg.Error) -> DatabaseError:
    safe = redact(url)
    detail = " ".join(str(error).split())
    return DatabaseError(f"cannot connect to the database {safe}: {detail}")


def check_connection(url: str) -> None:
    """Fail fast, with the reason, when the database cannot be reached (a pool would retry
    quietly for its whole timeout). Blocking: asyncio callers run it in a thread."""
    try:
        conn = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.Error as error:
        raise _unreachable(url, error) from error
    conn.close()


_SCHEMA_ERRORS = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
    psycopg.errors.UndefinedColumn,
)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise driver errors as awa errors with a message that says what to do."""
    try:
        yield
    except _SCHEMA_ERRORS as error:
        raise SchemaNotMigrated(
            f"the awa schema is missing or out of date ({error.diag.message_primary}); "
            "run `awa migrate` or `await client.migrate()`"
        ) from error
    except psycopg.errors.UniqueViolation as error:
        constraint = error.diag.constraint_name or "unknown"
        raise UniqueConflict(
            f"unique constraint {constraint} rejected the change: {error.diag.message_primary}",
            job_id=None,
            constraint=constraint,
        ) from error
    except psycopg.errors.ForeignKeyViolation as error:
        # Raised by awa.add_dependencies for a depends_on naming a job that does not exist.
        raise ValidationError(str(error.diag.message_primary)) from error
    except psycopg.errors.CheckViolation as error:
        raise ValidationError(
            f"the database rejected a value ({error.diag.constraint_name}): "
            f"{error.diag.message_primary}"
        ) from error
    except psycopg_pool.PoolTimeout as error:
        raise DatabaseError(f"no database connection available: {error}") from error
    except psycopg.OperationalError as error:
        raise DatabaseError(f"database unavailable: {error}") from error


@dataclass(frozen=True, slots=True)
class Statement(Generic[R]):
    """One SQL statement and how to turn its rows (as dicts, or as tuples when ``tuples``
    is set: cheaper for many rows) into a result."""

    sql: LiteralString
    params: Mapping[str, Any] | Sequence[Any] | None
    decode: Callable[[list[Any]], R]
    tuples: bool = False


@dataclass(frozen=True, slots=True)
class CopyStatement:
    """A ``COPY ... FROM STDIN`` and the rows to send; the step's result is None."""

    sql: LiteralString
    rows: Iterable[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Notifications:
    """A step of a flow run in ``Listening``: wait up to ``timeout`` seconds (None: no
    limit) for a notification; the step's result is the payloads received (maybe none)."""

    timeout: float | None


# A multi-step database conversation written once, without I/O: the generator yields
# Statements (and CopyStatements, Notifications), receives each decoded result, and returns
# the outcome. drive_async / drive_sync run it on an asyncio or a blocking connection.
Flow = Generator["Statement[Any] | CopyStatement | Notifications", Any, R]


@dataclass(frozen=True, slots=True)
class Autocommit(Generic[R]):
    """A flow whose statements commit one by one (no transaction around them)."""

    flow: Flow[R]


@dataclass(frozen=True, slots=True)
class Listening(Generic[R]):
    """A flow run while the connection listens on ``channel`` (its statements commit one by
    one, so notifications arrive); the listening ends with the flow."""

    channel: LiteralString
    flow: Flow[R]


# What a connection runs for a client method or an Operation: one statement (committed
# alone), a flow (in a transaction, or a savepoint of the caller's), or one of the above.
Call = Statement[R] | Flow[R] | Autocommit[R] | Listening[R]


def _has_rows(cursor: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]) -> bool:
    """Whether the statement returned rows (``cursor.description`` would tell too, but it
    builds a list of column objects at every access, a measurable cost per insert)."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


async def run_async(conn: psycopg.AsyncConnection[Any], statement: Statement[R]) -> R:
    factory: Any = tuple_row if statement.tuples else dict_row
    with translate_errors():
        async with conn.cursor(row_factory=factory) as cursor:
            await cursor.execute(statement.sql, statement.params)
            rows = await cursor.fetchall() if _has_rows(cursor) else []
    return statement.decode(rows)


def run_sync(conn: psycopg.Connection[Any], statement: Statement[R]) -> R:
    factory: Any = tuple_row if statement.tuples else dict_row
    with translate_errors(), conn.cursor(row_factory=factory) as cursor:
        cursor.execute(statement.sql, statement.params)
        rows = cursor.fetchall() if _has_rows(cursor) else []
    return statement.decode(rows)


async def drive_async(conn: psycopg.AsyncConnection[Any], flow: Flow[R]) -> R:
    result: Any = None
    try:
        while True:
            step = flow.send(result)
            if isinstance(step, CopyStatement):
                with translate_errors():
                    async with conn.cursor() as cursor, cursor.copy(step.sql) as copy:
                        for row in step.rows:
                            await copy.write_row(row)
                result = None
            elif isinstance(step, Notifications):
                with translate_errors():
                    notices = conn.notifies(timeout=step.timeout, stop_after=1)
                    result = [notice.payload async for notice in notices]
            else:
                result = await run_async(conn, step)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def drive_sync(conn: psycopg.Connection[Any], flow: Flow[R]) -> R:
    result: Any = None
    try:
        while True:
            step = flow.send(result)
            if isinstance(step, CopyStatement):
                with translate_errors(), conn.cursor() as cursor, cursor.copy(step.sql) as copy:
                    for row in step.rows:
                        copy.write_row(row)
                result = None
            elif isinstance(step, Notifications):
                with translate_errors():
                    notices = conn.notifies(timeout=step.timeout, stop_after=1)
                    result = [notice.payload for notice in notices]
            else:
                result = run_sync(conn, step)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


class Operation(Generic[P, R]):
    """A database operation that runs on a blocking or an asyncio psycopg connection.

    On an ``AsyncConnection`` the call returns a coroutine; on a ``Connection`` it blocks and
    returns the result.
    """

    def __init__(self, build: Callable[P, Call[R]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__

    @overload
    def __call__(
        self, conn: psycopg.AsyncConnection[Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R]: ...

    @overload
    def __call__(
        self, conn: psycopg.Connection[Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    def __call__(
        self,
        conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Coroutine[Any, Any, R] | R:
        if isinstance(conn, psycopg.AsyncConnection):
            return run_call_async(conn, self.build(*args, **kwargs))
        if isinstance(conn, psycopg.Connection):
            return run_call_sync(conn, self.build(*args, **kwargs))
        raise TypeError(
            f"{self.__name__}() needs a psycopg Connection or AsyncConnection, "
            f"not {type(conn).__name__}"
        )


def operation(build: Callable[P, Call[R]]) -> Operation[P, R]:
    """Decorator: turn a builder of a statement, or of a multi-statement flow (run in a
    transaction, or a savepoint of the caller's), into an Operation."""
    return Operation(build)


async def run_call_async(conn: psycopg.AsyncConnection[Any], call: Call[R]) -> R:
    """Run a call on an asyncio connection (see ``Call``)."""
    if isinstance(call, Statement):
        return await run_async(conn, call)
    if isinstance(call, Autocommit):
        return await drive_async(conn, call.flow)
    if isinstance(call, Listening):
        await conn.execute(f"LISTEN {call.channel}")
        try:
            return await drive_async(conn, call.flow)
        finally:
            with contextlib.suppress(psycopg.Error):
                await conn.execute(f"UNLISTEN {call.channel}")
    async with conn.transaction():
        return await drive_async(conn, call)


def run_call_sync(conn: psycopg.Connection[Any], call: Call[R]) -> R:
    """Run a call on a blocking connection (see ``Call``)."""
    if isinstance(call, Statement):
        return run_sync(conn, call)
    if isinstance(call, Autocommit):
        return drive_sync(conn, call.flow)
    if isinstance(call, Listening):
        conn.execute(f"LISTEN {call.channel}")
        try:
            return drive_sync(conn, call.flow)
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute(f"UNLISTEN {call.channel}")
    with conn.transaction():
        return drive_sync(conn, call)
