"""Job output (issue "Handler-staged follow-ups, job outputs and the testing harness"):
``job.record_output(value)``.

Semantics (seed lifecycle-hooks.md, the job-output remarks; DESIGN §2; semantics.md §2.9 and
§8.3 item 15): the output is a JSON value stored on the completed row (``get_job``, the CLI),
carried by the ``Completed`` event on both the batched and the per-job completion paths, and
never shown to follow-up specs, which receive the row without it. Only a completion stores
it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pydantic
import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.testing import HandlerJob
from helpers_lifecycle import Recorder, jobs_of_kind
from helpers_worker import queue, start, wait_for_all, wait_for_state
from jobs_helpers import Conn, writer_xid

QUEUE = "reports"


@dataclasses.dataclass
class Report:
    n: int


@dataclasses.dataclass
class Notify:
    n: int


@dataclasses.dataclass
class Summary:
    rows: int
    at: dt.datetime


class Totals(pydantic.BaseModel):
    total: int
    ids: list[uuid.UUID]


def xmin(conn: Conn, job_id: int) -> str:
    return writer_xid(conn, job_id)


def stored_output(conn: Conn, job_id: int) -> Any:
    found = conn.execute("SELECT output FROM awa.jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found[0]


async def test_batched_completions_store_outputs_and_events_carry_them(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """Jobs without follow-ups complete on the batched path, in one statement (one xmin
    with a long linger); the ones that recorded an output have it on their row and in their
    Completed event, the others have none."""
    recorder = Recorder()
    client.on_event(Report)(recorder)

    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        if job.args.n % 2 == 0:
            job.record_output({"n": job.args.n, "pair": (1, 2)})

    jobs = await client.insert_many([Report(n) for n in range(4)], queue=QUEUE)
    await start(client, queue(QUEUE, max_workers=8), completion_linger=0.3)
    await wait_for_all(conn, "completed", 4)
    events = await recorder.wait(awa.Completed, count=4)
    await client.shutdown()

    assert len({xmin(conn, job.id) for job in jobs}) == 1, "one batched statement"
    by_n = {event.args.n: event for event in events}
    for job in jobs:
        n = job.args["n"]
        expected = {"n": n, "pair": [1, 2]} if n % 2 == 0 else None
        assert stored_output(conn, job.id) == expected
        assert by_n[n].output == expected
        assert by_n[n].job.output == expected
        fetched = await client.get_job(job.id)
        assert fetched is not None
        assert fetched.output == expected


async def test_per_job_completion_stores_the_output_and_specs_never_see_it(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """§8.3.15: with a Completed spec the completion has its own transaction; the output is
    stored and carried by the event, but the spec's JobRow has no output."""
    recorder = Recorder()
    client.on_event(Report)(recorder)
    spec_saw: list[Any] = []

    @client.on_completed_enqueue(Report)
    def notify(args: Report, job: awa.JobRow) -> Notify:
        spec_saw.append(job.output)
        return Notify(args.n)

    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        job.record_output({"rows": 12})

    await start(client, queue(QUEUE))
    job = await client.insert(Report(1), queue=QUEUE)
    await wait_for_state(conn, job.id, "completed")
    [event] = await recorder.wait(awa.Completed, job.id)
    await client.shutdown()
    [notify_row] = jobs_of_kind(conn, "notify")
    assert xmin(conn, job.id) == xmin(conn, notify_row["id"]), "the per-job transaction"
    assert stored_output(conn, job.id) == {"rows": 12}
    assert event.output == {"rows": 12}
    assert event.job.output == {"rows": 12}
    assert spec_saw == [None]


async def test_output_beside_a_staged_follow_up(client: awa.AsyncClient, conn: Conn) -> None:
    """The follow-up gets its value in its args; the output is for people to inspect."""

    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        job.enqueue_on_completion(Notify(job.args.n * 2))
        job.record_output({"notified": job.args.n * 2})

    await start(client, queue(QUEUE))
    job = await client.insert(Report(21), queue=QUEUE)
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    [notify_row] = jobs_of_kind(conn, "notify")
    assert notify_row["args"] == {"n": 42}
    assert stored_output(conn, job.id) == {"notified": 42}


async def test_only_a_completion_stores_the_output(client: awa.AsyncClient, conn: Conn) -> None:
    """An output recorded by an attempt that retries, fails or cancels is dropped; a later
    attempt that completes stores only its own."""
    recorded: list[int] = []

    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> Any:
        job.record_output({"attempt": job.attempt})
        recorded.append(job.attempt)
        if job.args.n == 1:
            return awa.Cancel("no")
        if job.args.n == 2:
            raise awa.TerminalError("bad")
        if job.attempt == 1:
            return awa.RetryAfter(0.01)
        if job.args.n == 4:
            job.record_output(None)  # cleared again
        return None

    await start(client, queue(QUEUE), promote_interval=0.02)
    cancelled = await client.insert(Report(1), queue=QUEUE)
    failed = await client.insert(Report(2), queue=QUEUE)
    retried = await client.insert(Report(3), queue=QUEUE)
    cleared = await client.insert(Report(4), queue=QUEUE)
    await wait_for_state(conn, cancelled.id, "cancelled")
    await wait_for_state(conn, failed.id, "failed")
    await wait_for_state(conn, retried.id, "completed")
    await wait_for_state(conn, cleared.id, "completed")
    await client.shutdown()
    assert stored_output(conn, cancelled.id) is None
    assert stored_output(conn, failed.id) is None
    assert stored_output(conn, retried.id) == {"attempt": 2}
    assert stored_output(conn, cleared.id) is None


async def test_a_retried_completed_job_loses_its_old_output(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The output belongs to the completing attempt: a job completed again (after an
    operator retried it) without recording one has none."""
    runs: list[int] = []

    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        runs.append(job.id)
        if len(runs) == 1:
            job.record_output("first")

    await start(client, queue(QUEUE))
    job = await client.insert(Report(1), queue=QUEUE)
    await wait_for_state(conn, job.id, "completed")
    assert stored_output(conn, job.id) == "first"
    conn.execute(
        "UPDATE awa.jobs SET state = 'available', finalized_at = NULL WHERE id = %s", (job.id,)
    )
    conn.execute("SELECT pg_notify('awa_jobs', %s)", (QUEUE,))
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert stored_output(conn, job.id) is None


def test_outputs_convert_like_args() -> None:
    """Dataclasses, pydantic models, datetimes and UUIDs become JSON; the value read back is
    what JSON holds."""
    job = HandlerJob(Report(1))
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    job.record_output(Summary(rows=3, at=when))
    assert job.output == {"rows": 3, "at": "2030-01-02T03:04:05Z"}
    ident = uuid.UUID(int=7)
    job.record_output(Totals(total=2, ids=[ident]))
    assert job.output == {"total": 2, "ids": [str(ident)]}
    job.record_output([1, "two", None, True, 2.5])
    assert job.output == [1, "two", None, True, 2.5]
    job.record_output(None)
    assert job.output is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "NaN"),
        ({"x": float("inf")}, "NaN or infinite"),
        ({"text": "a\x00b"}, "NUL"),
        (object(), "cannot be converted to JSON"),
        ("x" * (awa.MAX_OUTPUT_BYTES + 1), "the limit is 1048576 bytes"),
    ],
)
def test_outputs_jsonb_cannot_hold_are_refused(value: Any, message: str) -> None:
    job = HandlerJob(Report(1))
    job.record_output({"kept": True})
    with pytest.raises(awa.ValidationError, match=message):
        job.record_output(value)
    assert job.output == {"kept": True}


def test_an_output_at_the_limit_is_accepted() -> None:
    job = HandlerJob(Report(1))
    job.record_output("y" * (awa.MAX_OUTPUT_BYTES - 2))  # plus two quotes
    assert len(job.output) == awa.MAX_OUTPUT_BYTES - 2


async def test_an_oversized_output_fails_the_attempt_with_a_clear_error(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        job.record_output({"blob": "z" * awa.MAX_OUTPUT_BYTES})

    await start(client, queue(QUEUE))
    job = await client.insert(Report(1), queue=QUEUE, max_attempts=1)
    final = await wait_for_state(conn, job.id, "failed")
    await client.shutdown()
    assert "MAX_OUTPUT_BYTES" in final["errors"][-1]["error"]
    assert final["output"] is None


async def test_the_cli_shows_the_output(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    @client.task(Report, queue=QUEUE)
    async def report(job: awa.Job[Report]) -> None:
        job.record_output({"rows": 12, "file": "r.csv"})

    await start(client, queue(QUEUE))
    job = await client.insert(Report(1), queue=QUEUE)
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    result = CliRunner().invoke(main, ["--database-url", database_url, "job", "get", str(job.id)])
    assert result.exit_code == 0, result.output
    assert "output:" in result.stdout
    assert '"rows": 12' in result.stdout or '"rows":12' in result.stdout
    as_json = CliRunner().invoke(
        main, ["--database-url", database_url, "job", "get", str(job.id), "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    assert '"output"' in as_json.stdout
