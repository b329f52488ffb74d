"""Completions with follow-ups are committed many per transaction (DESIGN §4.7): each job's
completion and its follow-ups commit together or not at all, and one job's failing
follow-up never holds back the others of its batch."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import awa
from helpers_lifecycle import Recorder, hooks_idle, jobs_of_kind
from helpers_worker import queue, start, wait_for, wait_for_all
from jobs_helpers import Conn, job_insert_trigger

TRIGGERS = "orders"
BATCH = 20
# A long linger gathers every completion of the test into one batch.
ONE_BATCH: dict[str, Any] = {"completion_linger": 0.5, "completion_batch_size": 512}


@dataclasses.dataclass
class Order:
    n: int


@dataclasses.dataclass
class Receipt:
    order: int
    order_job: int


@dataclasses.dataclass
class Packing:
    order: int


def finalized_stamps(conn: Conn, ids: list[int]) -> set[Any]:
    rows = conn.execute("SELECT finalized_at FROM awa.jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    return {row[0] for row in rows}


def receipts_by_order(conn: Conn) -> dict[int, dict[str, Any]]:
    return {row["args"]["order"]: row for row in jobs_of_kind(conn, "receipt")}


async def test_a_batch_with_raising_closures_commits_every_other_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Raising closures mixed into one batch: their jobs are recorded as failed attempts
    (retryable, the error naming the closure), every other job of the batch completed with
    its follow-up, in one transaction."""
    recorder = Recorder()
    client.on_event(Order, recorder)
    bad = {3, 7, 11}

    @client.on_completed_enqueue(Order)
    def receipt(args: Order, job: awa.JobRow) -> Receipt:
        if args.n in bad:
            raise RuntimeError(f"no receipt for order {args.n}")
        return Receipt(args.n, job.id)

    @client.task(Order, queue=TRIGGERS)
    async def handle(job: awa.Job[Order]) -> None:
        job.enqueue_on_completion(Packing(job.args.n))

    orders = await client.insert_many([Order(n) for n in range(BATCH)])
    await start(client, queue(TRIGGERS, max_workers=BATCH), **ONE_BATCH)
    try:
        await wait_for_all(conn, "completed", BATCH - len(bad))
        await wait_for_all(conn, "retryable", len(bad))
    finally:
        await client.shutdown()
    good = [job for job in orders if job.args["n"] not in bad]  # type: ignore[index]
    assert len(finalized_stamps(conn, [job.id for job in good])) == 1  # one transaction
    receipts = receipts_by_order(conn)
    assert sorted(receipts) == sorted(job.args["n"] for job in good)  # type: ignore[index]
    for job in good:
        assert receipts[job.args["n"]]["args"]["order_job"] == job.id  # type: ignore[index]
    packings = sorted(row["args"]["order"] for row in jobs_of_kind(conn, "packing"))
    assert packings == sorted(job.args["n"] for job in good)  # type: ignore[index]
    for job in orders:
        if job.args["n"] in bad:  # type: ignore[index]
            found = conn.execute("SELECT state, errors FROM awa.jobs WHERE id = %s", (job.id,))
            state, errors = found.fetchone()  # type: ignore[misc]
            assert state == "retryable"
            error = errors[-1]["error"]
            assert f"no receipt for order {job.args['n']}" in error  # type: ignore[index]
            assert "on_completed_enqueue for 'order'" in error
    await hooks_idle(client)
    completed = {event.job.id for event in recorder.of(awa.Completed)}
    retried = {event.job.id for event in recorder.of(awa.Retried)}
    assert completed == {job.id for job in good}
    assert retried == {job.id for job in orders} - completed


async def test_a_refused_insert_takes_its_jobs_one_by_one(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The database refuses one follow-up of the batch (a trigger raises for it): the batch's
    follow-up part rolls back, its jobs are committed one by one, and only the job whose
    follow-up is refused fails; the others complete with their follow-ups."""
    refuse = """
        BEGIN
            IF NEW.kind = 'receipt' AND (NEW.args->>'order')::int = 5 THEN
                RAISE EXCEPTION 'receipt 5 refused';
            END IF;
            RETURN NEW;
        END"""
    with job_insert_trigger(conn, "awa_test_refuse_five", refuse):
        client.on_completed_enqueue(Order, lambda args, job: Receipt(args.n, job.id))

        @client.task(Order, queue=TRIGGERS)
        async def handle(job: awa.Job[Order]) -> None:
            return None

        await client.insert_many([Order(n) for n in range(10)])
        await start(client, queue(TRIGGERS, max_workers=10), **ONE_BATCH)
        await wait_for_all(conn, "completed", 9)
        await wait_for_all(conn, "retryable", 1)
        await client.shutdown()
        assert sorted(receipts_by_order(conn)) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
        [failed] = conn.execute(
            "SELECT args, errors FROM awa.jobs WHERE state = 'retryable'"
        ).fetchall()
        assert failed[0] == {"n": 5}
        assert "receipt 5 refused" in failed[1][-1]["error"]
        await client.shutdown()


async def test_async_closures_of_a_batch_run_side_by_side(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Two async closures of one batch wait for each other: they can only both return if
    they run side by side (one after the other, the first would wait forever)."""
    barrier = asyncio.Barrier(2)

    @client.on_completed_enqueue(Order)
    async def receipt(args: Order, job: awa.JobRow) -> Receipt:
        await asyncio.wait_for(barrier.wait(), 5)
        return Receipt(args.n, job.id)

    @client.task(Order, queue=TRIGGERS)
    async def handle(job: awa.Job[Order]) -> None:
        return None

    await client.insert_many([Order(1), Order(2)])
    await start(client, queue(TRIGGERS, max_workers=2), **ONE_BATCH)
    try:
        await wait_for_all(conn, "completed", 2)
    finally:
        await client.shutdown()
    assert sorted(receipts_by_order(conn)) == [1, 2]


async def test_closures_see_the_committed_row_and_follow_ups_share_its_transaction(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The row a closure receives in a batch is the committed row: completed, its
    finalized_at, and what the attempt wrote to it (a callback it registered, its metadata);
    the follow-up's created_at equals the trigger's finalized_at (one transaction)."""
    seen: dict[int, awa.JobRow] = {}

    @client.on_completed_enqueue(Order)
    def receipt(args: Order, job: awa.JobRow) -> Receipt:
        seen[args.n] = job
        return Receipt(args.n, job.id)

    @client.task(Order, queue=TRIGGERS)
    async def handle(job: awa.Job[Order]) -> None:
        if job.args.n == 1:
            await job.register_callback(timeout_seconds=60)

    orders = await client.insert_many([Order(0), Order(1)], metadata={"source": "web"})
    await start(client, queue(TRIGGERS, max_workers=2), **ONE_BATCH)
    try:
        await wait_for_all(conn, "completed", 2)
    finally:
        await client.shutdown()
    for job in orders:
        db = conn.execute(
            "SELECT finalized_at, callback_id, callback_timeout_at FROM awa.jobs WHERE id = %s",
            (job.id,),
        ).fetchone()
        assert db is not None
        row = seen[job.args["n"]]  # type: ignore[index]
        assert row.state is awa.JobState.COMPLETED
        assert row.finalized_at == db[0]
        assert row.callback_id == (str(db[1]) if db[1] is not None else None)
        assert row.callback_timeout_at == db[2]
        assert row.metadata == {"source": "web"}
        assert (row.heartbeat_at, row.progress, row.output) == (None, None, None)
        receipt_row = receipts_by_order(conn)[job.args["n"]]  # type: ignore[index]
        created = conn.execute(
            "SELECT created_at FROM awa.jobs WHERE id = %s", (receipt_row["id"],)
        ).fetchone()
        assert created is not None
        assert created[0] == db[0]
    assert seen[1].callback_id is not None


async def test_unique_follow_ups_of_one_batch_are_inserted_once(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Unique follow-ups take the insert that skips held keys: two jobs of a batch asking for
    the same unique follow-up insert it once; both complete."""
    client.on_completed_enqueue_with(
        Order, lambda args, job: awa.EnqueueRequest(Packing(0)).unique(awa.UniqueOpts())
    )

    @client.task(Order, queue=TRIGGERS)
    async def handle(job: awa.Job[Order]) -> None:
        return None

    await client.insert_many([Order(1), Order(2)])
    await start(client, queue(TRIGGERS, max_workers=2), **ONE_BATCH)
    try:
        await wait_for_all(conn, "completed", 2)
        await wait_for(lambda: jobs_of_kind(conn, "packing"))
    finally:
        await client.shutdown()
    assert len(jobs_of_kind(conn, "packing")) == 1
