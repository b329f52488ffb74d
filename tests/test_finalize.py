"""Completion in the handler's own transaction (docs/finalize.md): the business writes and the
completion of this exact attempt commit together or not at all, guarded by its run lease;
follow-ups and workflow releases join that transaction; hooks fire after it commits."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any

import psycopg
import pytest

import awa
from awa.testing import AwaTestClient, HandlerJob
from helpers_lifecycle import Recorder, counter_value, hooks_idle, jobs_of_kind, metric_reader
from helpers_worker import queue, start, wait_for, wait_for_state
from jobs_helpers import Conn, must_job_row
from test_bridge import _asyncpg_kwargs, _sqlalchemy_url, django_connection

__all__ = ["django_connection"]  # the fixture, shared with the bridge tests


QUICK_RETRY = awa.RetryPolicy(base=1.0, jitter=0.0, max_delay=0.05)


@dataclasses.dataclass
class Charge:
    n: int


@dataclasses.dataclass
class Receipt:
    n: int


@pytest.fixture
def ledger(conn: Conn) -> Conn:
    """A business table: one row per charge the handler wrote."""
    conn.execute("DROP TABLE IF EXISTS ledger; CREATE TABLE ledger (job_id bigint, n int)")
    return conn


WRITE = "INSERT INTO ledger VALUES (%s, %s)"
"""The business write: the job's id and a number telling which write it was."""


async def record(tx: Any, job: awa.Job[Any], n: Any) -> None:
    """The business write in ``job.finalize()``'s transaction."""
    await tx.execute(WRITE, job.id, n)


def ledger_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT job_id, n FROM ledger ORDER BY job_id").fetchall()


async def test_business_write_and_completion_commit_together(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    recorder = Recorder()
    client.on_event(Charge, recorder)
    seen_inside: list[int] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        job.record_output({"charged": job.args.n})
        async with job.finalize() as tx:
            await record(tx, job, job.args.n)
            # No Completed hook before the commit.
            seen_inside.append(sum(isinstance(e, awa.Completed) for e in recorder.events))

    row = await client.insert(Charge(7))
    await start(client, queue())
    done = await wait_for_state(ledger, row.id, "completed")
    assert done["output"] == {"charged": 7}
    assert ledger_rows(ledger) == [(row.id, 7)]
    completed = await wait_for(
        lambda: [event for event in recorder.events if isinstance(event, awa.Completed)]
    )
    await hooks_idle(client)
    assert [event.job.id for event in completed] == [row.id]
    assert completed[0].job.output == {"charged": 7}
    assert seen_inside == [0]


async def test_a_block_that_raises_rolls_back_the_writes_and_the_attempt_retries(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with job.finalize() as tx:
            await record(tx, job, job.attempt)
            if job.attempt == 1:
                raise RuntimeError("the provider said no")

    row = await client.insert(Charge(1), max_attempts=3)
    await start(client, queue(retry=QUICK_RETRY))
    done = await wait_for_state(ledger, row.id, "completed")
    assert done["attempt"] == 2
    assert "the provider said no" in done["errors"][0]["error"]
    assert ledger_rows(ledger) == [(row.id, 2)]


async def test_an_attempt_cancelled_before_the_commit_cannot_commit_its_writes(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    """An operator cancels the running job while the handler holds its transaction open:
    the guard finds the attempt gone, the server aborts the transaction (AttemptLost), the
    business write rolls back, and the job stays cancelled."""
    writing = asyncio.Event()
    cancelled = asyncio.Event()
    raised: list[BaseException] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        try:
            async with job.finalize() as tx:
                await record(tx, job, 1)
                writing.set()
                await cancelled.wait()
        except awa.AttemptLost as error:
            raised.append(error)
            raise

    row = await client.insert(Charge(1))
    await start(client, queue())
    await asyncio.wait_for(writing.wait(), 5)
    assert await client.cancel(row.id) is not None
    cancelled.set()
    await wait_for(lambda: raised)
    [error] = raised
    assert (error.job_id, error.run_lease) == (row.id, must_job_row(ledger, row.id)["run_lease"])
    assert "no longer running" in str(error)
    assert getattr(error.__cause__, "sqlstate", None) == "AWA01"
    assert ledger_rows(ledger) == []
    assert must_job_row(ledger, row.id)["state"] == "cancelled"


async def test_a_rescue_that_arrives_after_the_completion_waits_and_finds_it_done(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    """The completion statement holds the job's row until the commit: a cancel arriving in
    between waits for it, then finds nothing left to cancel."""
    written = threading.Event()
    release = threading.Event()

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        connecting = psycopg.AsyncConnection.connect(database_url)
        async with await connecting as own, own.transaction():
            await own.execute(WRITE, (job.id, 1))
            await job.complete_in(own)
            written.set()
            await asyncio.to_thread(release.wait, 10)

    row = await client.insert(Charge(1))
    await start(client, queue())
    await asyncio.to_thread(written.wait, 10)
    with awa.Client(database_url) as operator:
        cancel = asyncio.create_task(asyncio.to_thread(operator.cancel, row.id))
        await asyncio.sleep(0)  # let the cancel reach the server and wait on the row lock
        release.set()
        assert await cancel is None  # the completion won
    assert (await wait_for_state(ledger, row.id, "completed"))["attempt"] == 1
    assert ledger_rows(ledger) == [(row.id, 1)]


async def test_an_attempt_rescued_and_re_claimed_cannot_commit_its_writes(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    """The first attempt outlives its deadline (a def handler cannot be interrupted): the
    leader rescues the job and a second attempt runs and completes it. When the first one
    then tries to complete in its transaction, the guard refuses and its write rolls back:
    only the second attempt's write is left."""
    lost: list[awa.AttemptLost] = []

    def rescued(job_id: int) -> bool:
        with psycopg.connect(database_url) as look:
            row = look.execute("SELECT attempt FROM awa.jobs WHERE id = %s", (job_id,))
            found = row.fetchone()
        return found is not None and found[0] >= 2

    @client.task(Charge)
    def charge(job: awa.Job[Charge]) -> None:
        with psycopg.connect(database_url) as own, own.transaction():
            own.execute(WRITE, (job.id, job.attempt))
            if job.attempt == 1:
                deadline = time.monotonic() + 10
                while not rescued(job.id):  # until the second attempt was claimed
                    assert time.monotonic() < deadline, "the attempt was never rescued"
                    time.sleep(0.02)
                try:
                    job.complete_in_sync(own)
                except awa.AttemptLost as error:
                    lost.append(error)
                    raise
            else:
                job.complete_in_sync(own)

    row = await client.insert(Charge(1), max_attempts=3)
    await start(
        client,
        queue(max_workers=2, deadline_duration=0.3, retry=QUICK_RETRY),
        deadline_rescue_interval=0.1,
    )
    done = await wait_for_state(ledger, row.id, "completed")
    await wait_for(lambda: lost)
    assert done["attempt"] == 2
    assert "deadline" in done["errors"][0]["error"]
    assert (lost[0].job_id, lost[0].run_lease) == (row.id, 1)
    assert ledger_rows(ledger) == [(row.id, 2)]


async def test_follow_ups_registered_and_staged_commit_in_the_same_transaction(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    @client.on_completed_enqueue(Charge)
    def receipt(args: Charge, job: awa.JobRow) -> Receipt:
        return Receipt(args.n)

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        job.enqueue_on_completion(Receipt(-job.args.n), queue="receipts")
        async with job.finalize() as tx:
            await record(tx, job, job.attempt)
            follow_ups = await tx.fetch_all("SELECT args FROM awa.jobs WHERE kind = 'receipt'")
            assert follow_ups == []  # they are written as the block ends
            if job.attempt == 1:
                raise RuntimeError("rolled back with everything")

    row = await client.insert(Charge(5), max_attempts=3)
    await start(client, queue(retry=QUICK_RETRY))
    await wait_for_state(ledger, row.id, "completed")
    receipts = sorted(r["args"]["n"] for r in jobs_of_kind(ledger, "receipt"))
    assert receipts == [-5, 5]  # once each: attempt 1's rolled back
    staged = [r for r in jobs_of_kind(ledger, "receipt") if r["queue"] == "receipts"]
    lineage = {"id": row.id, "kind": "charge", "outcome": "completed", "via": "staged"}
    assert staged[0]["metadata"]["awa:trigger"] == lineage
    assert ledger_rows(ledger) == [(row.id, 2)]


async def test_a_workflow_step_released_by_a_completion_in_the_handlers_transaction(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with job.finalize() as tx:
            await record(tx, job, job.args.n)

    @client.task(Receipt)
    async def receipt(job: awa.Job[Receipt]) -> None:
        return None

    workflow = awa.Workflow("billing")
    first = workflow.add(Charge(1))
    workflow.add(Receipt(1), depends_on=[first])
    run = await client.insert_workflow(workflow)
    await start(client, queue())
    for job in run.jobs:
        await wait_for_state(ledger, job.id, "completed")
    assert ledger_rows(ledger) == [(run.jobs[0].id, 1)]


async def test_a_caller_transaction_rolled_back_retries_the_attempt(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    """The handler wrote its completion, rolled back, and returned normally: the database
    still shows the attempt running, so it is retried (not completed without its writes)."""

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as own:
            await own.execute(WRITE, (job.id, job.attempt))
            await job.complete_in(own)
            if job.attempt == 1:
                await own.rollback()
            else:
                await own.commit()

    metric_reader()
    before = {result: own_completions(result) for result in ("committed", "not_committed")}
    row = await client.insert(Charge(1), max_attempts=3)
    await start(client, queue(retry=QUICK_RETRY))
    done = await wait_for_state(ledger, row.id, "completed")
    assert done["attempt"] == 2
    assert "did not commit" in done["errors"][0]["error"]
    assert ledger_rows(ledger) == [(row.id, 2)]
    await wait_for(lambda: own_completions("committed") == before["committed"] + 1)
    assert own_completions("not_committed") == before["not_committed"] + 1


def own_completions(result: str) -> int:
    attributes = {"awa.job.kind": "charge", "awa.finalize.result": result}
    return counter_value("awa.job.own_transaction_completions", **attributes)


async def test_a_handler_that_fails_after_its_completion_committed_stays_completed(
    client: awa.AsyncClient, ledger: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Durable state wins: a commit that happened is never retried (as after a commit whose
    acknowledgement was lost)."""
    caplog.set_level(logging.WARNING, logger="awa.worker")

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with job.finalize() as tx:
            await record(tx, job, 1)
        raise ConnectionError("the acknowledgement was lost")

    row = await client.insert(Charge(1), max_attempts=3)
    await start(client, queue())
    done = await wait_for_state(ledger, row.id, "completed")
    assert done["attempt"] == 1
    assert done["errors"] == []
    assert ledger_rows(ledger) == [(row.id, 1)]
    await wait_for(lambda: "the job stays completed" in caplog.text)


async def test_a_caught_attempt_lost_still_cannot_commit_the_writes(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    """The server aborted the transaction: a handler that swallows AttemptLost and commits
    anyway commits nothing (only a savepoint around the call could, which is unsupported)."""
    outcome: list[str] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as own:
            await own.execute(WRITE, (job.id, 1))
            with ledger_connection(database_url) as other:  # the attempt is taken away
                other.execute("SELECT awa.admin_cancel_for_test(%s)", (job.id,))
            try:
                await job.complete_in(own)
            except awa.AttemptLost:
                outcome.append("lost")
            await own.commit()

    ledger.execute(
        "CREATE OR REPLACE FUNCTION awa.admin_cancel_for_test(bigint) RETURNS void"
        " LANGUAGE sql AS $$ UPDATE awa.jobs SET state = 'cancelled', finalized_at = now()"
        " WHERE id = $1 $$"
    )
    try:
        row = await client.insert(Charge(1))
        await start(client, queue())
        await wait_for(lambda: outcome)
        await wait_for_state(ledger, row.id, "cancelled")
        assert ledger_rows(ledger) == []
    finally:
        ledger.execute("DROP FUNCTION awa.admin_cancel_for_test(bigint)")


def ledger_connection(database_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(database_url, autocommit=True)


async def test_finalize_twice_in_one_attempt_is_refused(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    raised: list[BaseException] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with job.finalize() as tx:
            await record(tx, job, 1)
        try:
            async with job.finalize() as tx:
                await record(tx, job, 2)
        except awa.AttemptLost as error:
            raised.append(error)

    row = await client.insert(Charge(1))
    await start(client, queue())
    await wait_for_state(ledger, row.id, "completed")
    await wait_for(lambda: raised)
    assert ledger_rows(ledger) == [(row.id, 1)]


async def test_a_def_handler_completes_in_its_own_blocking_connection(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    @client.on_completed_enqueue(Charge)
    def receipt(args: Charge, job: awa.JobRow) -> Receipt:
        return Receipt(args.n)

    @client.task(Charge)
    def charge(job: awa.Job[Charge]) -> None:
        with psycopg.connect(database_url) as own, own.transaction():
            own.execute(WRITE, (job.id, job.args.n))
            job.complete_in_sync(own)

    row = await client.insert(Charge(3))
    await start(client, queue())
    await wait_for_state(ledger, row.id, "completed")
    assert ledger_rows(ledger) == [(row.id, 3)]
    assert [r["args"]["n"] for r in jobs_of_kind(ledger, "receipt")] == [3]


async def test_sqlalchemy_sessions_and_asyncpg_connections_complete_the_attempt(
    client: awa.AsyncClient, ledger: Conn, database_url: str
) -> None:
    import asyncpg
    import sqlalchemy
    import sqlalchemy.orm
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = sqlalchemy.create_engine(_sqlalchemy_url(database_url, "psycopg"))
    async_engine = create_async_engine(_sqlalchemy_url(database_url, "psycopg"))

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        insert = "INSERT INTO ledger VALUES ($1, $2)"
        if job.args.n == 1:
            own = await asyncpg.connect(**_asyncpg_kwargs(database_url))
            try:
                async with own.transaction():
                    await own.execute(insert, job.id, 1)
                    await job.complete_in(own)
            finally:
                await own.close()
        else:
            async with async_engine.begin() as sa:
                await sa.execute(
                    sqlalchemy.text("INSERT INTO ledger VALUES (:id, 2)"), {"id": job.id}
                )
                await job.complete_in(sa)

    @client.task(Receipt)
    def receipt(job: awa.Job[Receipt]) -> None:
        with sqlalchemy.orm.Session(engine) as session, session.begin():
            session.execute(sqlalchemy.text("INSERT INTO ledger VALUES (:id, 3)"), {"id": job.id})
            job.complete_in_sync(session)

    try:
        rows = [await client.insert(Charge(1)), await client.insert(Charge(2))]
        rows.append(await client.insert(Receipt(3)))
        await start(client, queue())
        for row in rows:
            await wait_for_state(ledger, row.id, "completed")
        assert ledger_rows(ledger) == [(row.id, n) for row, n in zip(rows, [1, 2, 3], strict=True)]
    finally:
        engine.dispose()
        await async_engine.dispose()


async def test_a_django_atomic_block_completes_the_attempt(
    client: awa.AsyncClient, ledger: Conn, django_connection: Any
) -> None:
    from django.db import connection, transaction

    @client.task(Charge)
    def charge(job: awa.Job[Charge]) -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(WRITE, (job.id, job.attempt))
                job.complete_in_sync(connection)
                if job.attempt == 1:
                    raise RuntimeError("rolled back by the atomic block")
        finally:
            connection.close()  # the worker thread's own Django connection

    row = await client.insert(Charge(1), max_attempts=3)
    await start(client, queue(retry=QUICK_RETRY))
    done = await wait_for_state(ledger, row.id, "completed")
    assert done["attempt"] == 2
    assert ledger_rows(ledger) == [(row.id, 2)]


async def test_wrong_connections_and_threads_are_refused_with_a_clear_error(
    client: awa.AsyncClient, ledger: Conn, database_url: str, django_connection: Any
) -> None:
    errors: list[str] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        with psycopg.connect(database_url) as blocking:
            try:
                await job.complete_in(blocking)
            except TypeError as error:
                errors.append(str(error))
        try:
            job.complete_in_sync(object())
        except RuntimeError as error:
            errors.append(str(error))
        # Autocommit: the completion would commit at once, apart from the writes.
        connecting = psycopg.AsyncConnection.connect(database_url, autocommit=True)
        async with await connecting as autocommit:
            try:
                await job.complete_in(autocommit)
            except awa.ValidationError as error:
                errors.append(str(error))
        await asyncio.to_thread(outside_atomic, job, errors)

    row = await client.insert(Charge(1))
    await start(client, queue())
    await wait_for_state(ledger, row.id, "completed")
    assert "job.complete_in_sync() a blocking one" in errors[0]
    assert "psycopg.Connection" in errors[0]
    assert "is for def handlers" in errors[1]
    assert errors[2].startswith("job.complete_in() needs a transaction open on the connection")
    assert "autocommit" in errors[2]
    assert errors[3].startswith("job.complete_in_sync() needs a transaction open")
    assert ledger_rows(ledger) == []


def outside_atomic(job: awa.Job[Charge], errors: list[str]) -> None:
    """A Django connection outside ``atomic()`` (Django's default: autocommit)."""
    from django.db import connection

    try:
        job.complete_in_sync(connection)
    except awa.ValidationError as error:
        errors.append(str(error))
    finally:
        connection.close()


async def test_the_test_client_runs_a_handler_that_completes_in_its_transaction(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        async with job.finalize() as tx:
            await record(tx, job, 9)

    tester = AwaTestClient(client)
    row = await client.insert(Charge(9))
    result = await tester.work_one(Charge)
    assert result.outcome == "completed"
    assert result.job.id == row.id
    assert ledger_rows(ledger) == [(row.id, 9)]


async def test_the_finalize_block_owns_its_commit_and_rollback(
    client: awa.AsyncClient, ledger: Conn
) -> None:
    """Committing inside the block would commit the writes without the completion: refused,
    and the block (which then raises) rolls everything back. The rest of the transaction's
    API works inside it."""
    refused: list[str] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        if job.args.n == 1:
            try:
                async with job.finalize() as tx:
                    await record(tx, job, 1)
                    for end in (tx.commit, tx.rollback):
                        try:
                            await end()
                        except awa.AwaError as error:
                            refused.append(str(error))
                    raise RuntimeError("give up the block")
            except RuntimeError:
                return None  # completes on the batched path, without the rolled-back write
        async with job.finalize() as tx:
            await record(tx, job, 2)
            count = await tx.fetch_one("SELECT count(*) AS n FROM ledger WHERE n = 2")
            assert count == {"n": 1}
            await tx.insert_many([Receipt(1), Receipt(2)], queue="receipts")

    first = await client.insert(Charge(1))
    second = await client.insert(Charge(2))
    await start(client, queue())
    await wait_for_state(ledger, first.id, "completed")
    await wait_for_state(ledger, second.id, "completed")
    assert refused[0].startswith("job.finalize() commits when its block ends")
    assert refused[1] == "job.finalize() rolls back when its block raises: raise instead"
    assert ledger_rows(ledger) == [(second.id, 2)]
    assert len(jobs_of_kind(ledger, "receipt")) == 2


async def test_a_handler_job_points_to_the_test_client() -> None:
    """A unit-test job has no database: the completion forms say where to run such a
    handler."""
    job = HandlerJob(Charge(1))
    with pytest.raises(RuntimeError, match="run the handler with AwaTestClient"):
        async with job.finalize():
            pass
    with pytest.raises(RuntimeError, match=r"complete_in\(\) writes the completion"):
        await job.complete_in(object())
