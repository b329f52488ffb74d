"""awa.bridge: jobs inserted in the application's own transaction, through every driver.

Each driver opens its own connection to the test database, starts a transaction, inserts
through the bridge and commits or rolls back; a separate psycopg connection then looks at
what is really in the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import subprocess
import sys
import zoneinfo
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import django
import psycopg
import pytest
import sqlalchemy
from django.conf import settings
from django.db import transaction
from django.test.utils import override_settings
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import awa
from awa import bridge
from awa.bridge import insert_job, insert_job_sync

SYNC_DRIVERS = ["psycopg", "sqlalchemy", "sqlalchemy-session", "django"]
ASYNC_DRIVERS = [
    "psycopg",
    "asyncpg",
    "asyncpg-pool",
    "sqlalchemy-asyncpg",
    "sqlalchemy-psycopg",
    "sqlalchemy-session",
]


@dataclasses.dataclass
class SendEmail:
    to: str


def _params(url: str) -> dict[str, str]:
    """The test database's connection parameters (the fixtures give a libpq conninfo)."""
    return {key: str(value) for key, value in conninfo_to_dict(url).items() if value is not None}


def _sqlalchemy_url(url: str, dialect: str) -> sqlalchemy.URL:
    params = _params(url)
    return sqlalchemy.URL.create(
        f"postgresql+{dialect}",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if "port" in params else None,
        database=params.get("dbname"),
    )


def _asyncpg_kwargs(url: str) -> dict[str, Any]:
    params = _params(url)
    names = {"user": "user", "password": "password", "host": "host", "port": "port"}
    return {"database": params["dbname"]} | {
        arg: params[key] for key, arg in names.items() if key in params
    }


@pytest.fixture(scope="session")
def django_connection(session_database: str) -> Iterator[Any]:
    """``django.db.connection``, configured in-process for the test database."""
    params = _params(session_database)
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": params.get("dbname"),
                    "USER": params.get("user", ""),
                    "PASSWORD": params.get("password", ""),
                    "HOST": params.get("host", ""),
                    "PORT": params.get("port", ""),
                }
            },
            USE_TZ=True,
            TIME_ZONE="UTC",
        )
        django.setup()
    from django.db import connection

    assert connection.settings_dict["NAME"] == params.get("dbname")
    yield connection
    connection.close()


SyncTx = Callable[..., contextlib.AbstractContextManager[Any]]
AsyncTx = Callable[..., contextlib.AbstractAsyncContextManager[Any]]


@pytest.fixture(params=SYNC_DRIVERS)
def sync_tx(request: pytest.FixtureRequest, database_url: str) -> SyncTx:
    """``sync_tx(commit=...)``: a driver connection in an open transaction, committed or
    rolled back when the block ends (rolled back if it raises)."""
    driver: str = request.param
    if driver == "django":
        request.getfixturevalue("django_connection")

    @contextlib.contextmanager
    def open_tx(*, commit: bool) -> Iterator[Any]:
        if driver == "psycopg":
            with contextlib.closing(psycopg.connect(database_url)) as conn:
                yield conn
                conn.commit() if commit else conn.rollback()
        elif driver == "django":
            from django.db import connection

            with transaction.atomic():
                yield connection
                transaction.set_rollback(not commit)
        else:
            engine = sqlalchemy.create_engine(_sqlalchemy_url(database_url, "psycopg"))
            try:
                if driver == "sqlalchemy":
                    with engine.connect() as conn:
                        conn.begin()
                        yield conn
                        conn.commit() if commit else conn.rollback()
                else:
                    with Session(engine) as session:
                        yield session
                        session.commit() if commit else session.rollback()
            finally:
                engine.dispose()

    return open_tx


@pytest.fixture(params=ASYNC_DRIVERS)
def async_tx(request: pytest.FixtureRequest, database_url: str) -> AsyncTx:
    """The asyncio twin of ``sync_tx``."""
    driver: str = request.param

    @contextlib.asynccontextmanager
    async def open_tx(*, commit: bool) -> AsyncIterator[Any]:
        if driver == "psycopg":
            aconn = await psycopg.AsyncConnection.connect(database_url)
            try:
                yield aconn
                await (aconn.commit() if commit else aconn.rollback())
            finally:
                await aconn.close()
        elif driver.startswith("asyncpg"):
            async with contextlib.AsyncExitStack() as stack:
                if driver == "asyncpg-pool":
                    pool = await asyncpg.create_pool(**_asyncpg_kwargs(database_url))
                    stack.push_async_callback(pool.close)
                    pg: Any = await stack.enter_async_context(pool.acquire())
                else:
                    pg = await asyncpg.connect(**_asyncpg_kwargs(database_url))
                    stack.push_async_callback(pg.close)
                tx = pg.transaction()
                await tx.start()
                yield pg
                await (tx.commit() if commit else tx.rollback())
        else:
            dialect = "psycopg" if driver == "sqlalchemy-psycopg" else "asyncpg"
            engine = create_async_engine(_sqlalchemy_url(database_url, dialect))
            try:
                if driver == "sqlalchemy-session":
                    async with AsyncSession(engine) as session:
                        yield session
                        await (session.commit() if commit else session.rollback())
                else:
                    async with engine.connect() as sa_conn:
                        await sa_conn.begin()
                        yield sa_conn
                        await (sa_conn.commit() if commit else sa_conn.rollback())
            finally:
                await engine.dispose()

    return open_tx


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert row is not None
    return int(row[0])


# Options that touch every kind of column the insert writes (jsonb, text[], bytea,
# interval, timestamptz), so the rows read back through each driver can be compared whole.
def _options() -> dict[str, Any]:
    return {
        "queue": "mail",
        "priority": 1,
        "max_attempts": 3,
        "run_at": dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        "tags": ["signup", "welcome"],
        "metadata": {"tenant": 7, "note": "100% : ::jsonb"},
        "ordering_key": "user-1",
        "deadline_duration": 90.5,
        "unique_opts": {"by_queue": True},
    }


def _check_options(job: awa.JobRow, options: dict[str, Any]) -> None:
    assert job.kind == "send_email"
    assert job.args == {"to": "a@example.com"}
    assert job.queue == "mail"
    assert job.priority == 1
    assert job.max_attempts == 3
    assert job.state is awa.JobState.SCHEDULED
    assert job.run_at == options["run_at"]
    assert job.tags == ["signup", "welcome"]
    assert job.metadata == {"tenant": 7, "note": "100% : ::jsonb"}
    assert job.ordering_key == b"user-1"
    assert job.deadline_duration == dt.timedelta(seconds=90.5)
    assert isinstance(job.unique_key, bytes)
    assert job.errors == []
    assert isinstance(job.created_at, dt.datetime)
    assert job.created_at.utcoffset() is not None


# --- Blocking drivers ---------------------------------------------------------------------


def test_sync_commit_makes_the_job_exist(sync_tx: SyncTx, conn: psycopg.Connection[Any]) -> None:
    with sync_tx(commit=True) as driver_conn:
        job = insert_job_sync(driver_conn, SendEmail("a@example.com"))
        assert job.state is awa.JobState.AVAILABLE
    assert awa.admin.get_job(conn, job.id) == job


def test_sync_rollback_means_it_never_existed(
    sync_tx: SyncTx, conn: psycopg.Connection[Any]
) -> None:
    with sync_tx(commit=False) as driver_conn:
        job = insert_job_sync(driver_conn, SendEmail("a@example.com"))
    assert awa.admin.get_job(conn, job.id) is None
    assert _count(conn) == 0


def test_sync_options_and_types_match_psycopg(
    sync_tx: SyncTx, conn: psycopg.Connection[Any]
) -> None:
    options = _options()
    with sync_tx(commit=True) as driver_conn:
        job = insert_job_sync(driver_conn, SendEmail("a@example.com"), **options)
    _check_options(job, options)
    assert awa.admin.get_job(conn, job.id) == job


def test_sync_unique_conflict_names_the_holder(
    sync_tx: SyncTx, conn: psycopg.Connection[Any]
) -> None:
    with sync_tx(commit=True) as driver_conn:
        first = insert_job_sync(driver_conn, SendEmail("a@example.com"), unique_opts={})
        with pytest.raises(awa.UniqueConflict) as caught:
            insert_job_sync(driver_conn, SendEmail("a@example.com"), unique_opts={})
        assert caught.value.job_id == first.id
        assert str(first.id) in str(caught.value)
        # The conflict raised no database error: the caller's transaction goes on.
        other = insert_job_sync(driver_conn, SendEmail("b@example.com"), unique_opts={})
    with sync_tx(commit=False) as driver_conn:
        with pytest.raises(awa.UniqueConflict) as caught:
            insert_job_sync(driver_conn, SendEmail("b@example.com"), unique_opts={})
        assert caught.value.job_id == other.id
    assert _count(conn) == 2


def test_sync_validation_fails_before_sql(sync_tx: SyncTx, conn: psycopg.Connection[Any]) -> None:
    with sync_tx(commit=True) as driver_conn:
        with pytest.raises(awa.ValidationError, match="priority"):
            insert_job_sync(driver_conn, SendEmail("a@example.com"), priority=5)
        with pytest.raises(TypeError, match="insert_job_sync"):
            insert_job_sync(driver_conn, SendEmail("a@example.com"), prio=1)  # type: ignore[call-arg]
        # Nothing reached the database, so the transaction is still healthy.
        insert_job_sync(driver_conn, SendEmail("a@example.com"))
    assert _count(conn) == 1


def test_sync_connection_in_insert_job_points_to_insert_job_sync(sync_tx: SyncTx) -> None:
    # A sync test (Django refuses to open a transaction inside an event loop), so the
    # coroutine runs on a loop of its own.
    with sync_tx(commit=False) as driver_conn, pytest.raises(TypeError, match=r"_sync\(\)"):
        asyncio.run(insert_job(driver_conn, SendEmail("a@example.com")))


def test_django_rollback_by_exception(
    django_connection: Any, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    class Boom(Exception):
        pass

    def insert_then_fail() -> None:
        with transaction.atomic():
            insert_job_sync(django_connection, SendEmail("a@example.com"))
            raise Boom

    with pytest.raises(Boom):
        insert_then_fail()
    assert _count(conn) == 0


def test_django_without_time_zone_support(
    django_connection: Any, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    # Without USE_TZ Django returns naive local timestamps; the bridge makes them aware.
    django_connection.close()
    try:
        with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"), transaction.atomic():
            job = insert_job_sync(django_connection, SendEmail("a@example.com"), **_options())
    finally:
        django_connection.close()
    assert job.created_at.tzinfo == zoneinfo.ZoneInfo("Europe/Paris")
    assert awa.admin.get_job(conn, job.id) == job


def test_sync_depth_limits_of_the_given_client_apply(
    sync_tx: SyncTx, sync_client: awa.Client, conn: psycopg.Connection[Any]
) -> None:
    """With ``client=``, the client's depth limits are read (a statement without parameters,
    on the caller's driver) and enforced."""
    sync_client.set_queue_depth_limit("bridge-limited", 1, policy="reject")
    with sync_tx(commit=True) as driver_conn:
        insert_job_sync(
            driver_conn, SendEmail("a@example.com"), queue="bridge-limited", client=sync_client
        )
        with pytest.raises(awa.QueueOverLimit):
            insert_job_sync(
                driver_conn, SendEmail("b@example.com"), queue="bridge-limited", client=sync_client
            )
    assert _count(conn) == 1


# --- asyncio drivers ----------------------------------------------------------------------


async def test_async_depth_limits_of_the_given_client_apply(
    async_tx: AsyncTx, client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    await client.set_queue_depth_limit("bridge-limited", 1, policy="reject")
    await client.insert(SendEmail("a@example.com"), queue="bridge-limited")
    async with async_tx(commit=False) as driver_conn:
        with pytest.raises(awa.QueueOverLimit):
            await insert_job(
                driver_conn, SendEmail("b@example.com"), queue="bridge-limited", client=client
            )
    assert _count(conn) == 1


async def test_async_commit_makes_the_job_exist(
    async_tx: AsyncTx, conn: psycopg.Connection[Any]
) -> None:
    async with async_tx(commit=True) as driver_conn:
        job = await insert_job(driver_conn, SendEmail("a@example.com"))
        assert job.state is awa.JobState.AVAILABLE
    assert awa.admin.get_job(conn, job.id) == job


async def test_async_rollback_means_it_never_existed(
    async_tx: AsyncTx, conn: psycopg.Connection[Any]
) -> None:
    async with async_tx(commit=False) as driver_conn:
        job = await insert_job(driver_conn, SendEmail("a@example.com"))
    assert awa.admin.get_job(conn, job.id) is None
    assert _count(conn) == 0


async def test_async_options_and_types_match_psycopg(
    async_tx: AsyncTx, conn: psycopg.Connection[Any]
) -> None:
    options = _options()
    async with async_tx(commit=True) as driver_conn:
        job = await insert_job(driver_conn, SendEmail("a@example.com"), **options)
    _check_options(job, options)
    assert awa.admin.get_job(conn, job.id) == job


async def test_async_unique_conflict_names_the_holder(
    async_tx: AsyncTx, conn: psycopg.Connection[Any]
) -> None:
    async with async_tx(commit=True) as driver_conn:
        first = await insert_job(driver_conn, SendEmail("a@example.com"), unique_opts={})
        with pytest.raises(awa.UniqueConflict) as caught:
            await insert_job(driver_conn, SendEmail("a@example.com"), unique_opts={})
        assert caught.value.job_id == first.id
        other = await insert_job(driver_conn, SendEmail("b@example.com"), unique_opts={})
    async with async_tx(commit=False) as driver_conn:
        with pytest.raises(awa.UniqueConflict) as caught:
            await insert_job(driver_conn, SendEmail("b@example.com"), unique_opts={})
        assert caught.value.job_id == other.id
    assert _count(conn) == 2


async def test_async_validation_fails_before_sql(
    async_tx: AsyncTx, conn: psycopg.Connection[Any]
) -> None:
    async with async_tx(commit=True) as driver_conn:
        with pytest.raises(awa.ValidationError, match="priority"):
            await insert_job(driver_conn, SendEmail("a@example.com"), priority=5)
        with pytest.raises(TypeError, match="insert_job"):
            await insert_job(driver_conn, SendEmail("a@example.com"), prio=1)  # type: ignore[call-arg]
        await insert_job(driver_conn, SendEmail("a@example.com"))
    assert _count(conn) == 1


async def test_async_connection_in_insert_job_sync_points_to_insert_job(
    async_tx: AsyncTx,
) -> None:
    async with async_tx(commit=False) as driver_conn:
        with pytest.raises(TypeError, match=r"await awa\.bridge\.insert_job\(\)"):
            insert_job_sync(driver_conn, SendEmail("a@example.com"))


# --- Anything else ------------------------------------------------------------------------


# The reference package's words.
UNSUPPORTED = (
    r"^Unsupported connection type: \w+ \(module=[\w.]+\)\. "
    r"Supported drivers: asyncpg, psycopg3, SQLAlchemy, and Django"
)


async def test_unsupported_objects_list_the_drivers(database_url: str) -> None:
    engine = sqlalchemy.create_engine(_sqlalchemy_url(database_url, "psycopg"))
    try:
        for thing in (object(), engine, "postgresql://"):
            with pytest.raises(TypeError, match=UNSUPPORTED):
                insert_job_sync(thing, SendEmail("a@example.com"))
            with pytest.raises(TypeError, match=UNSUPPORTED):
                await insert_job(thing, SendEmail("a@example.com"))
    finally:
        engine.dispose()


def test_non_postgres_sqlalchemy_is_refused() -> None:
    engine = sqlalchemy.create_engine("sqlite://")
    try:
        with engine.connect() as sqlite, pytest.raises(TypeError, match="PostgreSQL"):
            insert_job_sync(sqlite, SendEmail("a@example.com"))
    finally:
        engine.dispose()


def test_placeholder_conversion() -> None:
    sql = "SELECT %(a)s::jsonb, '1:2', 5 %% 2, %(b)s, %(a)s -- note: x"
    assert bridge._convert(sql, "asyncpg") == (
        "SELECT $1::jsonb, '1:2', 5 % 2, $2, $1 -- note: x",
        ("a", "b"),
    )
    assert bridge._convert(sql, "sqlalchemy")[0] == (
        "SELECT :a\\:\\:jsonb, '1\\:2', 5 % 2, :b, :a -- note\\: x"
    )
    with pytest.raises(ValueError, match="placeholder"):
        bridge._convert("SELECT %s", "asyncpg")


def test_importing_the_bridge_imports_no_driver() -> None:
    code = (
        "import sys, awa.bridge; "
        "print(sorted(m for m in ('asyncpg', 'sqlalchemy', 'django') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"
