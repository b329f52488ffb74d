"""Single inserts from many coroutines of one client share statements (awa/insert_lanes.py),
and each caller still gets the outcome of its own insert: its row, its UniqueConflict, its
error."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import awa
from jobs_helpers import Conn, job_insert_trigger

CALLERS = 60


@dataclasses.dataclass
class Note:
    n: int


def distinct_created_at(conn: Conn) -> int:
    found = conn.execute("SELECT count(DISTINCT created_at) FROM awa.jobs").fetchone()
    assert found is not None
    return int(found[0])


async def test_concurrent_inserts_share_statements_and_return_their_own_rows(
    client: awa.AsyncClient, conn: Conn
) -> None:
    rows = await asyncio.gather(*(client.insert(Note(n)) for n in range(CALLERS)))
    assert [row.args for row in rows] == [{"n": n} for n in range(CALLERS)]
    assert len({row.id for row in rows}) == CALLERS
    stored = dict(conn.execute("SELECT id, (args->>'n')::int FROM awa.jobs").fetchall())
    assert stored == {row.id: n for n, row in enumerate(rows)}
    # Jobs inserted by one statement share its now(): far fewer statements than inserts.
    assert distinct_created_at(conn) < CALLERS // 2


async def test_one_unique_key_wins_and_each_loser_gets_its_own_conflict(
    client: awa.AsyncClient, conn: Conn
) -> None:
    outcomes = await asyncio.gather(
        *(client.insert(Note(1), unique_opts={"by_args": True}) for _ in range(CALLERS)),
        return_exceptions=True,
    )
    winners = [outcome for outcome in outcomes if isinstance(outcome, awa.JobRow)]
    losers = [outcome for outcome in outcomes if isinstance(outcome, awa.UniqueConflict)]
    assert len(winners) == 1
    assert len(losers) == CALLERS - 1
    assert {conflict.job_id for conflict in losers} == {winners[0].id}
    found = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert found is not None
    assert found[0] == 1


async def test_an_error_reaches_only_its_own_caller(client: awa.AsyncClient, conn: Conn) -> None:
    """The database refuses one job of a group (a trigger raises for it): its caller gets
    the error, every other caller its row."""
    refuse = """
        BEGIN
            IF (NEW.args->>'n')::int = 13 THEN RAISE EXCEPTION 'note 13 refused'; END IF;
            RETURN NEW;
        END"""
    with job_insert_trigger(conn, "awa_test_refuse_13", refuse):
        outcomes = await asyncio.gather(
            *(client.insert(Note(n)) for n in range(CALLERS)), return_exceptions=True
        )
    failed = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, BaseException)]
    assert failed == [13]
    assert "note 13 refused" in str(outcomes[13])
    found = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert found is not None
    assert found[0] == CALLERS - 1


async def test_a_caller_that_gives_up_does_not_disturb_the_others(
    client: awa.AsyncClient, conn: Conn
) -> None:
    tasks = [asyncio.create_task(client.insert(Note(n))) for n in range(CALLERS)]
    await asyncio.sleep(0)
    tasks[-1].cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(outcome, awa.JobRow) for outcome in outcomes[:-1])
    assert isinstance(outcomes[-1], asyncio.CancelledError | awa.JobRow)


async def test_an_unreachable_database_reaches_every_caller() -> None:
    async with awa.AsyncClient(
        "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=1"
    ) as unreachable:
        outcomes = await asyncio.gather(
            *(unreachable.insert(Note(n)) for n in range(5)), return_exceptions=True
        )
    assert all(isinstance(outcome, awa.DatabaseError) for outcome in outcomes)


@pytest.mark.parametrize("max_connections", [1, 2])
async def test_a_small_pool_still_serves_everyone(
    database_url: str, conn: Conn, max_connections: int
) -> None:
    async with awa.AsyncClient(database_url, max_connections=max_connections) as small:
        rows = await asyncio.gather(*(small.insert(Note(n)) for n in range(CALLERS)))
        assert (await small.get_job(rows[0].id)) is not None  # the pool is free again
        for n in range(3):  # one after another: the same connection, then back to the pool
            rows.append(await small.insert(Note(n)))
        async with asyncio.timeout(5):
            assert (await small.get_job(rows[-1].id)) is not None
    assert len({row.id for row in rows}) == CALLERS + 3
