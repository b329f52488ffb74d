"""Transactions: commit means the job exists, rollback means it never did."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import psycopg
import pytest

import awa
from jobs_helpers import Conn, count_jobs, job_row, maybe_await


@dataclasses.dataclass
class Invoice:
    number: int


class Boom(Exception):
    pass


async def begin(flavour: str, client: awa.AsyncClient, sync_client: awa.Client) -> Any:
    """An open transaction of either flavour (drive it with maybe_await)."""
    if flavour == "async":
        return await client.transaction()
    return sync_client.transaction()


FLAVOURS = ("async", "sync")


async def test_async_block_commits(client: awa.AsyncClient, conn: Conn) -> None:
    async with client.transaction() as tx:
        job = await tx.insert(Invoice(1))
        more = await tx.insert_many([Invoice(2), Invoice(3)])
        assert count_jobs(conn) == 0, "visible before commit"
    assert count_jobs(conn) == 3
    assert await client.get_job(job.id) == job
    assert [await client.get_job(j.id) for j in more] == more


async def test_async_block_rolls_back_when_it_raises(client: awa.AsyncClient, conn: Conn) -> None:
    inserted: list[awa.JobRow] = []

    async def insert_then_fail() -> None:
        async with client.transaction() as tx:
            inserted.append(await tx.insert(Invoice(1)))
            raise Boom

    with pytest.raises(Boom):
        await insert_then_fail()
    (job,) = inserted
    assert job_row(conn, job.id) is None
    assert await client.get_job(job.id) is None
    later = await client.insert(Invoice(2))
    assert later.id != job.id
    assert count_jobs(conn) == 1


def test_sync_block_commits_and_rolls_back(sync_client: awa.Client, conn: Conn) -> None:
    with sync_client.transaction() as tx:
        kept = tx.insert(Invoice(1))
        assert count_jobs(conn) == 0
    inserted: list[awa.JobRow] = []

    def insert_then_fail() -> None:
        with sync_client.transaction() as tx:
            inserted.append(tx.insert(Invoice(2)))
            raise Boom

    with pytest.raises(Boom):
        insert_then_fail()
    (dropped,) = inserted
    assert job_row(conn, kept.id) is not None
    assert job_row(conn, dropped.id) is None
    assert sync_client.get_job(dropped.id) is None


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("ending", ["commit", "rollback"])
async def test_explicit_commit_and_rollback(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str, ending: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    job = await maybe_await(tx.insert(Invoice(1)))
    assert count_jobs(conn) == 0
    await maybe_await(getattr(tx, ending)())
    assert (job_row(conn, job.id) is not None) == (ending == "commit")


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_use_after_the_end_raises(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    await maybe_await(tx.commit())
    calls = [
        lambda: tx.insert(Invoice(1)),
        lambda: tx.insert_many([Invoice(1)]),
        lambda: tx.execute("SELECT 1"),
        lambda: tx.fetch_all("SELECT 1"),
        lambda: tx.commit(),
        lambda: tx.rollback(),
    ]
    for call in calls:
        with pytest.raises(awa.AwaError, match="already committed or rolled back"):
            await maybe_await(call())
    with pytest.raises(awa.AwaError):
        _ = tx.connection
    assert count_jobs(conn) == 0


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_statements_with_positional_and_named_params(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    job = await maybe_await(tx.insert(Invoice(1), queue="billing"))
    updated = await maybe_await(
        tx.execute("UPDATE awa.jobs SET priority = %s WHERE id = %s", 1, job.id)
    )
    assert updated == 1
    one = await maybe_await(tx.fetch_one("SELECT id, priority FROM awa.jobs WHERE id = %s", job.id))
    assert one == {"id": job.id, "priority": 1}
    named = await maybe_await(
        tx.fetch_one(
            "SELECT queue, %(a)s::int + %(b)s::int AS total FROM awa.jobs WHERE id = %(id)s",
            {"a": 2, "b": 3, "id": job.id},
        )
    )
    assert named == {"queue": "billing", "total": 5}
    assert await maybe_await(tx.fetch_optional("SELECT 1 AS x WHERE %s", False)) is None
    assert await maybe_await(tx.fetch_optional("SELECT 1 AS x WHERE %s", True)) == {"x": 1}
    rows = await maybe_await(tx.fetch_all("SELECT g AS n FROM generate_series(1, %s) AS g", 3))
    assert rows == [{"n": 1}, {"n": 2}, {"n": 3}]
    with pytest.raises(awa.AwaError, match="no rows"):
        await maybe_await(tx.fetch_one("SELECT 1 WHERE false"))
    assert count_jobs(conn) == 0
    await maybe_await(tx.commit())
    assert conn.execute("SELECT priority FROM awa.jobs").fetchall() == [(1,)]


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_statements_without_params_are_taken_literally(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    row = await maybe_await(tx.fetch_one("SELECT '100%' AS pct"))
    assert row == {"pct": "100%"}
    await maybe_await(
        tx.execute(
            "CREATE TEMP TABLE notes (body text) ON COMMIT DROP; INSERT INTO notes VALUES ('50%')"
        )
    )
    assert await maybe_await(tx.fetch_all("SELECT body FROM notes")) == [{"body": "50%"}]
    await maybe_await(tx.rollback())


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_own_sql_errors_are_not_reported_as_a_missing_schema(
    client: awa.AsyncClient, sync_client: awa.Client, flavour: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    with pytest.raises(psycopg.errors.UndefinedColumn):
        await maybe_await(tx.execute("SELECT no_such_column FROM awa.jobs"))
    await maybe_await(tx.rollback())
    tx = await begin(flavour, client, sync_client)
    with pytest.raises(psycopg.errors.UndefinedTable):
        await maybe_await(tx.fetch_all("SELECT * FROM no_such_table"))
    await maybe_await(tx.rollback())


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_commit_of_a_failed_transaction_raises(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str
) -> None:
    tx = await begin(flavour, client, sync_client)
    job = await maybe_await(tx.insert(Invoice(1)))
    with pytest.raises(psycopg.errors.DivisionByZero):
        await maybe_await(tx.execute("SELECT 1 / 0"))
    with pytest.raises(awa.AwaError, match="rolled back"):
        await maybe_await(tx.commit())
    assert job_row(conn, job.id) is None
    # The connection went back to the pool in a usable state.
    assert (await maybe_await(_insert(flavour, client, sync_client))).id != job.id
    assert count_jobs(conn) == 1


async def _insert(flavour: str, client: awa.AsyncClient, sync_client: awa.Client) -> Any:
    if flavour == "async":
        return await client.insert(Invoice(2))
    return sync_client.insert(Invoice(2))


async def test_block_that_swallowed_a_failed_statement_raises_on_exit(
    client: awa.AsyncClient, conn: Conn
) -> None:

    async def swallow_a_failure() -> None:
        async with client.transaction() as tx:
            await tx.insert(Invoice(1))
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                await tx.execute("SELECT 1 / 0")

    with pytest.raises(awa.AwaError, match="rolled back"):
        await swallow_a_failure()
    assert count_jobs(conn) == 0


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_jobs_and_own_rows_share_the_transaction(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, flavour: str
) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS public.orders (id int PRIMARY KEY)")
    conn.execute("DELETE FROM public.orders")
    for ending, number in (("rollback", 1), ("commit", 2)):
        tx = await begin(flavour, client, sync_client)
        await maybe_await(tx.execute("INSERT INTO public.orders VALUES (%s)", number))
        await maybe_await(tx.insert(Invoice(number)))
        await maybe_await(getattr(tx, ending)())
    assert conn.execute("SELECT id FROM public.orders").fetchall() == [(2,)]
    assert conn.execute("SELECT args->>'number' FROM awa.jobs").fetchall() == [("2",)]


async def test_connection_property_is_the_transaction(client: awa.AsyncClient, conn: Conn) -> None:
    async with client.transaction() as tx:
        await tx.insert(Invoice(1))
        cursor = await tx.connection.execute("SELECT count(*) FROM awa.jobs")
        assert await cursor.fetchone() == (1,)
    assert count_jobs(conn) == 1


async def test_transaction_used_without_await_says_so(client: awa.AsyncClient, conn: Conn) -> None:
    tx = client.transaction()
    with pytest.raises(awa.AwaError, match="has not begun"):
        await tx.insert(Invoice(1))
    with pytest.raises(awa.AwaError, match="has not begun"):
        await tx.commit()
    async with tx:
        await tx.insert(Invoice(2))
    assert count_jobs(conn) == 1
