"""Unique jobs: the key, conflicts, what the key covers, which states hold it, and races."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import threading
from typing import Any

import pytest

import awa
from awa.core.kinds import dump_json
from awa.model import DEFAULT_UNIQUE_STATES
from awa.producer.insert import UNIQUE_INDEX, unique_key
from jobs_helpers import (
    INSERT_PATHS,
    Conn,
    count_jobs,
    insert_via,
    job_rows,
    must_job_row,
    set_state,
)


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hi"


def canonical(args: Any) -> str:
    return dump_json(args, "args", sort_keys=True)


# semantics.md §2.5, verified against the reference implementation.
GOLDEN = [
    (None, None, None, "bee8bfbcd9d48e51f79059a523039018"),
    ("default", None, None, "5f8918febb66adef42a3b4da3a9465c8"),
    (None, {"to": "a@b.com"}, None, "ef8febabb370bd83c515cf9f8e9c3600"),
    ("email", {"to": "a@b.com", "subject": "hi"}, None, "9f1dddee423110b9587b52095b79c51e"),
    (None, None, 1000, "d3676a6ea8e39ca25f82b37fc977060d"),
    (None, {}, None, "1d6de1bf7576ff6c6aeffbf5d6285619"),
    ("", None, None, "69060ceed16f2ed7dbe6f50384bbb850"),
    (None, {"emoji": "🎉", "cjk": "日本語"}, None, "05144169b7f851d24945084d2a65f559"),
    (None, {"nested": {"deep": [1, 2, 3]}}, None, "9d9a940abb6a88eb3f75741ab9bc39f6"),
    (
        None,
        {"f": 1.5, "big": 12345678901234, "neg": -3, "t": True, "n": None, "s": 'a"b\\c\n\x01/'},
        None,
        "d04459d19f67891bcaeb0fa90538dd31",
    ),
]


@pytest.mark.parametrize(("queue", "args", "bucket", "expected"), GOLDEN)
def test_unique_key_golden_vectors(
    queue: str | None, args: Any, bucket: int | None, expected: str
) -> None:
    args_json = canonical(args) if args is not None else None
    assert unique_key("send_email", queue, args_json, bucket).hex() == expected


async def test_stored_key_and_mask(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(SendEmail("a@b.com", "hi"), queue="email", unique_opts={})
    by_queue = await client.insert(
        SendEmail("a@b.com", "hi"), queue="email", unique_opts={"by_queue": True}
    )
    row = must_job_row(conn, job.id)
    args_json = canonical({"to": "a@b.com", "subject": "hi"})
    assert row["unique_key"] == unique_key("send_email", None, args_json, None)
    assert row["unique_states"] == 0b0001_1111
    assert must_job_row(conn, by_queue.id)["unique_key"].hex() == "9f1dddee423110b9587b52095b79c51e"
    assert job.unique_key == row["unique_key"]


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_duplicate_raises_naming_the_holder(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, path: str
) -> None:
    first = await client.insert(SendEmail("a"), unique_opts={})
    with pytest.raises(awa.UniqueConflict) as caught:
        await insert_via(
            path, client, sync_client, SendEmail("a"), unique_opts=awa.UniqueOpts(), queue="q"
        )
    assert caught.value.job_id == first.id
    assert caught.value.constraint == UNIQUE_INDEX
    assert str(first.id) in str(caught.value)
    assert count_jobs(conn) == 1
    # Same args without unique_opts are not deduplicated.
    await client.insert(SendEmail("a"))
    assert count_jobs(conn) == 2


async def test_by_queue(client: awa.AsyncClient, conn: Conn) -> None:
    opts = {"by_queue": True}
    await client.insert(SendEmail("a"), queue="q1", unique_opts=opts)
    await client.insert(SendEmail("a"), queue="q2", unique_opts=opts)
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), queue="q1", unique_opts=opts)
    assert count_jobs(conn) == 2


async def test_default_key_ignores_the_queue(client: awa.AsyncClient, conn: Conn) -> None:
    await client.insert(SendEmail("a"), queue="q1", unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), queue="q2", unique_opts={})
    assert count_jobs(conn) == 1


async def test_by_args_false_collapses_different_args(client: awa.AsyncClient, conn: Conn) -> None:
    first = await client.insert(SendEmail("a"), unique_opts={"by_args": False})
    with pytest.raises(awa.UniqueConflict) as caught:
        await client.insert(SendEmail("b"), unique_opts={"by_args": False})
    assert caught.value.job_id == first.id
    # Different args with by_args (the default) are different jobs.
    await client.insert(SendEmail("b"), unique_opts={})
    await client.insert(SendEmail("c"), unique_opts={})
    assert must_job_row(conn, first.id)["unique_key"] == unique_key("send_email", None, None, None)
    assert count_jobs(conn) == 3


async def test_args_key_order_does_not_matter(client: awa.AsyncClient, conn: Conn) -> None:
    await client.insert({"a": 1, "b": 2}, kind="k", unique_opts={})
    with pytest.raises(awa.UniqueConflict):
        await client.insert({"b": 2, "a": 1}, kind="k", unique_opts={})
    assert count_jobs(conn) == 1


async def test_by_period(client: awa.AsyncClient, conn: Conn) -> None:
    hour = 3600
    start = (int(dt.datetime.now(dt.UTC).timestamp()) // hour + 5) * hour
    at = [dt.datetime.fromtimestamp(start + offset, dt.UTC) for offset in (60, 3000, hour + 60)]
    opts = {"by_period": hour}
    first = await client.insert(SendEmail("a"), run_at=at[0], unique_opts=opts)
    with pytest.raises(awa.UniqueConflict) as caught:
        await client.insert(SendEmail("a"), run_at=at[1], unique_opts=opts)
    assert caught.value.job_id == first.id
    next_period = await client.insert(
        SendEmail("a"), run_at=at[2], unique_opts={"by_period": dt.timedelta(hours=1)}
    )
    assert must_job_row(conn, first.id)["unique_key"] == unique_key(
        "send_email", None, canonical({"to": "a", "subject": "hi"}), start // hour
    )
    assert next_period.unique_key != first.unique_key
    assert count_jobs(conn) == 2


async def test_by_period_without_run_at_uses_now(client: awa.AsyncClient, conn: Conn) -> None:
    day = dt.timedelta(days=1)
    await client.insert(SendEmail("a"), unique_opts={"by_period": day})
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), unique_opts={"by_period": day})
    assert count_jobs(conn) == 1


@pytest.mark.parametrize(
    ("state", "holds"),
    [
        ("scheduled", True),
        ("available", True),
        ("running", True),
        ("completed", True),
        ("retryable", True),
        ("failed", False),
        ("cancelled", False),
        ("waiting_external", False),
    ],
)
async def test_default_states_hold_the_key(
    client: awa.AsyncClient, conn: Conn, state: str, holds: bool
) -> None:
    assert (awa.JobState(state) in DEFAULT_UNIQUE_STATES) == holds
    first = await client.insert(SendEmail("a"), unique_opts={})
    set_state(conn, first.id, state)
    if holds:
        with pytest.raises(awa.UniqueConflict):
            await client.insert(SendEmail("a"), unique_opts={})
        assert count_jobs(conn) == 1
    else:
        await client.insert(SendEmail("a"), unique_opts={})
        assert count_jobs(conn) == 2


async def test_cancel_frees_the_key(client: awa.AsyncClient, conn: Conn) -> None:
    first = await client.insert(SendEmail("a"), unique_opts={})
    assert await client.cancel(first.id) is not None
    second = await client.insert(SendEmail("a"), unique_opts={})
    assert [row["state"] for row in job_rows(conn)] == ["cancelled", "available"]
    assert second.unique_key == first.unique_key


async def test_mask_excluding_completed(client: awa.AsyncClient, conn: Conn) -> None:
    states = DEFAULT_UNIQUE_STATES - {awa.JobState.COMPLETED}
    opts = awa.UniqueOpts(states=states)
    first = await client.insert(SendEmail("a"), unique_opts=opts)
    assert must_job_row(conn, first.id)["unique_states"] == 0b0001_0111
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), unique_opts=opts)
    set_state(conn, first.id, "completed")
    await client.insert(SendEmail("a"), unique_opts={"states": 0b0001_0111})
    assert count_jobs(conn) == 2


async def test_mask_including_cancelled(client: awa.AsyncClient, conn: Conn) -> None:
    opts = {"states": DEFAULT_UNIQUE_STATES | {awa.JobState.CANCELLED}}
    first = await client.insert(SendEmail("a"), unique_opts=opts)
    await client.cancel(first.id)
    with pytest.raises(awa.UniqueConflict):
        await client.insert(SendEmail("a"), unique_opts=opts)
    assert count_jobs(conn) == 1


async def test_unknown_unique_opts_key(client: awa.AsyncClient, conn: Conn) -> None:
    with pytest.raises(awa.ValidationError, match="by_qeue"):
        await client.insert(SendEmail("a"), unique_opts={"by_qeue": True})
    assert count_jobs(conn) == 0


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_duplicate_of_an_existing_job_rolls_back_the_batch(
    client: awa.AsyncClient, conn: Conn, method: str
) -> None:
    existing = await client.insert(SendEmail("b"), unique_opts={})
    batch = [SendEmail("a"), SendEmail("b"), SendEmail("c")]
    with pytest.raises(awa.UniqueConflict) as caught:
        await getattr(client, method)(batch, unique_opts={})
    assert caught.value.job_id == existing.id
    assert count_jobs(conn) == 1


@pytest.mark.parametrize("method", ["insert_many", "insert_many_copy"])
async def test_duplicate_within_a_batch_rolls_back_the_batch(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, method: str
) -> None:
    batch = [SendEmail("a"), SendEmail("b"), SendEmail("a")]
    with pytest.raises(awa.UniqueConflict) as caught:
        await getattr(client, method)(batch, unique_opts={})
    assert caught.value.job_id is None
    assert "same batch" in str(caught.value)
    with pytest.raises(awa.UniqueConflict):
        getattr(sync_client, method)(batch, unique_opts={})
    assert count_jobs(conn) == 0


async def test_unique_batch_without_conflict(client: awa.AsyncClient, conn: Conn) -> None:
    jobs = await client.insert_many_copy([SendEmail("a"), SendEmail("b")], unique_opts={})
    assert [job.unique_key is not None for job in jobs] == [True, True]
    assert [await client.get_job(job.id) for job in jobs] == jobs
    assert count_jobs(conn, "unique_key IS NOT NULL") == 2


async def test_conflict_leaves_an_async_transaction_usable(
    client: awa.AsyncClient, conn: Conn
) -> None:
    async with client.transaction() as tx:
        first = await tx.insert(SendEmail("a"), unique_opts={})
        with pytest.raises(awa.UniqueConflict) as caught:
            await tx.insert(SendEmail("a"), unique_opts={})
        assert caught.value.job_id == first.id
        with pytest.raises(awa.UniqueConflict):
            await tx.insert_many([SendEmail("b"), SendEmail("a")], unique_opts={})
        with pytest.raises(awa.UniqueConflict):
            await tx.insert_many([SendEmail("c"), SendEmail("c")], unique_opts={})
        second = await tx.insert(SendEmail("d"), unique_opts={})
        assert await tx.fetch_one("SELECT count(*) AS n FROM awa.jobs") == {"n": 2}
    assert [row["id"] for row in job_rows(conn)] == [first.id, second.id]


def test_conflict_leaves_a_sync_transaction_usable(sync_client: awa.Client, conn: Conn) -> None:
    existing = sync_client.insert(SendEmail("a"), unique_opts={})
    with sync_client.transaction() as tx:
        kept = tx.insert(SendEmail("b"))
        with pytest.raises(awa.UniqueConflict) as caught:
            tx.insert(SendEmail("a"), unique_opts={})
        assert caught.value.job_id == existing.id
        with pytest.raises(awa.UniqueConflict):
            tx.insert_many([SendEmail("c"), SendEmail("a")], unique_opts={})
        also = tx.insert(SendEmail("e"))
    assert [row["id"] for row in job_rows(conn)] == [existing.id, kept.id, also.id]


def test_racing_sync_producers_insert_exactly_one(database_url: str, conn: Conn) -> None:
    producers = 10
    clients = [awa.Client(database_url, max_connections=1) for _ in range(producers)]
    for client in clients:
        client.pool()  # connect before the race
    barrier = threading.Barrier(producers)
    results: list[Any] = [None] * producers

    def produce(index: int) -> None:
        barrier.wait()
        try:
            results[index] = clients[index].insert(SendEmail("race"), unique_opts={})
        except awa.UniqueConflict as error:
            results[index] = error

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for client in clients:
        client.close()
    winners = [result for result in results if isinstance(result, awa.JobRow)]
    losers = [result for result in results if isinstance(result, awa.UniqueConflict)]
    assert (len(winners), len(losers)) == (1, producers - 1)
    assert {loser.job_id for loser in losers} == {winners[0].id}
    assert count_jobs(conn) == 1


async def test_racing_async_producers_insert_exactly_one(database_url: str, conn: Conn) -> None:
    producers = 10
    clients = [awa.AsyncClient(database_url, max_connections=1) for _ in range(producers)]
    for client in clients:
        await client.pool()
    try:
        results = await asyncio.gather(
            *(client.insert(SendEmail("race"), unique_opts={}) for client in clients),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.close()
    assert sum(isinstance(result, awa.JobRow) for result in results) == 1
    assert sum(isinstance(result, awa.UniqueConflict) for result in results) == producers - 1
    assert count_jobs(conn) == 1


async def test_conflicts_across_insert_chunks_roll_back_every_chunk(
    client: awa.AsyncClient, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(awa.producer.statements, "INSERT_CHUNK", 2)
    existing = await client.insert(SendEmail("e"), unique_opts={})
    jobs = await client.insert_many([SendEmail(str(i)) for i in range(5)], unique_opts={})
    assert [job.args["to"] for job in jobs] == ["0", "1", "2", "3", "4"]
    with pytest.raises(awa.UniqueConflict) as caught:
        await client.insert_many([SendEmail(t) for t in "abcde"], unique_opts={})
    assert caught.value.job_id == existing.id
    with pytest.raises(awa.UniqueConflict, match="same batch"):
        await client.insert_many([SendEmail(t) for t in "vwxyv"], unique_opts={})
    assert count_jobs(conn) == 6


async def test_retry_into_a_held_key_raises_and_changes_nothing(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn
) -> None:
    first = await client.insert(SendEmail("a"), unique_opts={})
    await client.cancel(first.id)
    second = await client.insert(SendEmail("a"), unique_opts={})
    with pytest.raises(awa.UniqueConflict) as caught:
        await client.retry(first.id)
    assert caught.value.constraint == UNIQUE_INDEX
    with pytest.raises(awa.UniqueConflict):
        sync_client.retry(first.id)
    assert [row["state"] for row in job_rows(conn)] == ["cancelled", "available"]
    await client.cancel(second.id)
    assert (await client.retry(first.id)) is not None
