"""The dead-letter queue: failed jobs of DLQ-enabled queues move to awa.dlq_entries in the
failure's transaction (every failing path: last attempt, TerminalError, rescue,
a callback failed), hooks and follow-ups still fire; the operations (list, get, depth,
retry, move, purge), retention, the settings and the CLI.

Semantics: reference/python-api.md §2.12, semantics.md §4 ("DLQ"); docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

import awa
from awa.cli import main
from awa.dlq.duty import dlq_retention_duty
from awa.worker.config import QueueConfig, RuntimeConfig
from awa.worker.duties import leader_duties
from awa.worker.settings import parse_queue_option, parse_value
from helpers_callbacks import Payment, register_parking_task, wait_parked
from helpers_lifecycle import Recorder, jobs_of_kind
from helpers_worker import insert_raw, queue, start, wait_for, wait_for_state
from jobs_helpers import Conn, job_row

DLQ = "dlq"  # a queue with the DLQ turned on in these tests
PLAIN = "plain"  # one without

RESCUE: dict[str, Any] = {
    "heartbeat_rescue_interval": 0.1,
    "heartbeat_interval": 0.2,
    "heartbeat_staleness": 1.0,
}


@dataclasses.dataclass
class Flaky:
    n: int = 0


@dataclasses.dataclass
class Doomed:
    n: int = 0


@dataclasses.dataclass
class AuditNote:
    failed_job_id: int
    error: str


@pytest.fixture(autouse=True)
def _empty_dlq(database_url: str) -> Iterator[None]:
    """The DLQ tables are not emptied by the shared fixtures: empty them around each test,
    so that no queue keeps its DLQ turned on for the rest of the session."""

    def empty() -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM awa.dlq_entries; DELETE FROM awa.queue_settings")

    empty()
    yield
    empty()


def dlq_queue(name: str = DLQ, **options: Any) -> dict[str, Any]:
    return queue(name, dlq_enabled=True, **options)


def register_failing(client: awa.AsyncClient) -> None:
    @client.task(Flaky, queue=DLQ)
    async def flaky(job: awa.Job[Flaky]) -> None:
        raise ValueError(f"flaky {job.args.n}")

    @client.task(Doomed, queue=DLQ)
    async def doomed(job: awa.Job[Doomed]) -> None:
        raise awa.TerminalError("no point retrying")


async def wait_in_dlq(client: awa.AsyncClient, job_id: int, timeout: float = 5.0) -> Any:
    return await wait_for(lambda: client.get_dlq_job(job_id), timeout)


def failed_row(conn: Conn, *, queue_name: str = PLAIN, kind: str = "flaky", **extra: Any) -> int:
    """A failed job written with plain SQL (tags, unique key and attempts from ``extra``)."""
    columns = {"attempt": 3, "max_attempts": 3, "run_lease": 3, "tags": [], **extra}
    return insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, args, state, attempt, max_attempts, run_lease, tags,"
        " unique_key, unique_states, finalized_at, errors) VALUES (%s, %s, '{\"n\": 1}',"
        " 'failed', %s, %s, %s, %s, %s, %s, now(),"
        ' \'[{"error": "boom", "attempt": 3}]\') RETURNING id',
        kind,
        queue_name,
        columns["attempt"],
        columns["max_attempts"],
        columns["run_lease"],
        columns["tags"],
        extra.get("unique_key"),
        extra.get("unique_states"),
    )


# Moves on failure -----------------------------------------------------------------------


async def test_an_exhausted_job_moves_with_its_hook_and_follow_up(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register_failing(client)
    recorder = Recorder()
    client.on_event(Flaky)(recorder)
    client.on_exhausted_enqueue(
        Flaky, lambda args, job, error, attempt: AuditNote(job.id, error.splitlines()[0])
    )
    await start(client, dlq_queue())
    job = await client.insert(Flaky(7), max_attempts=1)

    entry = await wait_in_dlq(client, job.id)
    assert job_row(conn, job.id) is None  # gone from awa.jobs
    assert entry.reason == "max_attempts_exhausted"
    assert entry.original_run_lease == 1
    assert entry.job.id == job.id
    assert entry.job.state is awa.JobState.FAILED
    assert entry.job.attempt == 1
    assert entry.job.args == {"n": 7}
    assert "ValueError: flaky 7" in entry.job.errors[-1]["error"]
    assert entry.dlq_at >= entry.job.finalized_at

    # The Exhausted hook fired with the failed row; the follow-up committed with the move.
    [event] = await recorder.wait(awa.Exhausted, job.id)
    assert event.job.state is awa.JobState.FAILED
    assert event.attempt == 1
    [note] = jobs_of_kind(conn, "audit_note")
    assert note["args"]["failed_job_id"] == job.id
    assert note["args"]["error"].startswith("ValueError: flaky 7")
    assert await client.dlq_depth(queue=DLQ) == 1
    await client.shutdown()


async def test_a_terminal_error_moves_as_terminal(client: awa.AsyncClient, conn: Conn) -> None:
    register_failing(client)
    await start(client, dlq_queue())
    doomed = await client.insert(Doomed())

    entry = await wait_in_dlq(client, doomed.id)
    assert entry.reason == "terminal_error"
    assert entry.job.attempt == 1
    assert entry.job.max_attempts == 25
    assert entry.job.errors[-1]["terminal"] is True
    await client.shutdown()


async def test_a_rescue_of_the_last_attempt_moves_the_job(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register_failing(client)
    recorder = Recorder()
    client.on_event_kind("stranded", recorder)
    stranded = insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, state, attempt, max_attempts, run_lease,"
        " attempted_at, heartbeat_at) VALUES ('stranded', %s, 'running', 2, 2, 2,"
        " now() - interval '1 hour', now() - interval '1 hour') RETURNING id",
        DLQ,
    )
    await start(client, dlq_queue(), **RESCUE)

    entry = await wait_in_dlq(client, stranded)
    assert entry.reason == "stale_heartbeat"
    assert entry.original_run_lease == 2
    assert entry.job.errors[-1]["rescued"] == "stale_heartbeat"
    [event] = await recorder.wait(awa.Rescued, stranded)
    assert event.job.state is awa.JobState.FAILED
    assert job_row(conn, stranded) is None
    await client.shutdown()


async def test_a_callback_failed_through_the_client_moves_with_hook_and_follow_up(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register_parking_task(client, queue=DLQ)
    recorder = Recorder()
    client.on_event(Payment)(recorder)
    client.on_exhausted_enqueue(Payment, lambda args, job, error, attempt: AuditNote(job.id, error))
    await start(client, dlq_queue())
    job = await client.insert(Payment(3))
    callback_id = await wait_parked(conn, job.id)

    failed = await client.fail_external(callback_id, "card declined")
    assert failed.state is awa.JobState.FAILED  # the call returns the failed row
    entry = await client.get_dlq_job(job.id)
    assert entry is not None
    assert entry.reason == "callback_failed"
    assert job_row(conn, job.id) is None
    [event] = await recorder.wait(awa.Exhausted, job.id)
    assert event.error == "card declined"
    [note] = jobs_of_kind(conn, "audit_note")
    assert note["args"] == {"failed_job_id": job.id, "error": "card declined"}
    await client.shutdown()


async def test_a_queue_without_the_dlq_keeps_failed_jobs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Flaky, queue=PLAIN)
    async def flaky(job: awa.Job[Flaky]) -> None:
        raise ValueError("plain failure")

    await start(client, {**queue(PLAIN), **dlq_queue()})
    job = await client.insert(Flaky(), max_attempts=1)

    await wait_for_state(conn, job.id, "failed")
    assert await client.get_dlq_job(job.id) is None
    assert await client.dlq_depth() == 0
    await client.shutdown()


async def test_the_client_wide_default_applies_to_queues_that_do_not_say(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register_failing(client)

    @client.task(Doomed, kind="doomed_elsewhere", queue=PLAIN)
    async def doomed_elsewhere(job: awa.Job[Doomed]) -> None:
        raise awa.TerminalError("no")

    await start(client, {**queue(DLQ), **queue(PLAIN, dlq_enabled=False)}, dlq_enabled=True)
    settings = dict(conn.execute("SELECT queue, dlq_enabled FROM awa.queue_settings").fetchall())
    assert settings == {DLQ: True}  # a queue that never had the DLQ gets no row
    moved = await client.insert(Doomed())
    kept = await client.insert(Doomed(), kind="doomed_elsewhere")

    assert (await wait_in_dlq(client, moved.id)).reason == "terminal_error"
    await wait_for_state(conn, kept.id, "failed")
    await client.shutdown()

    # The last worker to start decides: one without the DLQ turns it off for its queues.
    await start(client, queue(DLQ))
    settings = dict(conn.execute("SELECT queue, dlq_enabled FROM awa.queue_settings").fetchall())
    assert settings == {DLQ: False}
    await client.shutdown()


def test_the_move_is_part_of_the_failing_transaction(conn: Conn, database_url: str) -> None:
    conn.execute("INSERT INTO awa.queue_settings (queue, dlq_enabled) VALUES (%s, true)", (DLQ,))
    job_id = insert_raw(
        conn,
        "INSERT INTO awa.jobs (kind, queue, state, attempt, max_attempts, run_lease)"
        " VALUES ('k', %s, 'running', 1, 1, 1) RETURNING id",
        DLQ,
    )
    with psycopg.connect(database_url) as tx:
        returned = tx.execute(
            "UPDATE awa.jobs SET state = 'failed', finalized_at = now() WHERE id = %s"
            " RETURNING state::text",
            (job_id,),
        ).fetchone()
        assert returned == ("failed",)  # RETURNING still shows the failed row
        inside = tx.execute("SELECT count(*) FROM awa.dlq_entries WHERE id = %s", (job_id,))
        assert inside.fetchone() == (1,)
        tx.rollback()
    # Rolled back: the job is running again and the DLQ holds nothing.
    assert job_row(conn, job_id)["state"] == "running"  # type: ignore[index]
    assert conn.execute("SELECT count(*) FROM awa.dlq_entries").fetchone() == (0,)


def test_the_dlq_table_holds_every_column_of_awa_jobs(conn: Conn) -> None:
    def columns(table: str) -> dict[str, str]:
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'awa' AND table_name = %s",
            (table,),
        ).fetchall()
        return {str(name): str(kind) for name, kind in rows}

    jobs, entries = columns("jobs"), columns("dlq_entries")
    assert {name: entries.get(name) for name in jobs} == jobs
    assert set(entries) - set(jobs) == {"reason", "dlq_at", "original_run_lease"}
    # Every column but the internal flag of client.wait is a field of JobRow.
    assert {field.name for field in dataclasses.fields(awa.JobRow)} == set(jobs) - {"watched"}


# Operations -------------------------------------------------------------------------------


def test_list_get_depth_and_the_cursor(sync_client: awa.Client, conn: Conn) -> None:
    ids = [failed_row(conn, queue_name=name) for name in ("a", "b", "a", "a")]
    for job_id in ids:
        assert sync_client.move_failed_to_dlq(job_id, "manual check") is not None
    # dlq_at out of step with id: the cursor must still walk every entry once.
    for job_id, days in zip(ids, (3, 0, 4, 1), strict=True):
        conn.execute(
            "UPDATE awa.dlq_entries SET dlq_at = now() - make_interval(days => %s) WHERE id = %s",
            (days, job_id),
        )
    expected = [ids[1], ids[3], ids[0], ids[2]]
    assert [entry.job.id for entry in sync_client.list_dlq()] == expected

    walked: list[int] = []
    cursor: dict[str, Any] = {}
    while page := sync_client.list_dlq(limit=1, **cursor):
        walked.append(page[0].job.id)
        cursor = {"before_id": page[0].job.id, "before_dlq_at": page[0].dlq_at}
        assert len(walked) <= len(expected)
    assert walked == expected
    by_time = sync_client.list_dlq(before_dlq_at=sync_client.list_dlq()[1].dlq_at)
    assert [entry.job.id for entry in by_time] == expected[2:]

    assert [entry.job.id for entry in sync_client.list_dlq(queue="a")] == [ids[3], ids[0], ids[2]]
    entry = sync_client.get_dlq_job(ids[0])
    assert entry is not None
    assert (entry.reason, entry.original_run_lease, entry.job.queue) == ("manual check", 3, "a")
    assert sync_client.get_dlq_job(999_999) is None
    assert sync_client.dlq_depth() == 4
    assert sync_client.dlq_depth(queue="a") == 3
    assert sync_client.dlq_depth_by_queue() == [("a", 3), ("b", 1)]
    with pytest.raises(awa.ValidationError, match="limit"):
        sync_client.list_dlq(limit=0)
    with pytest.raises(awa.ValidationError, match="before_dlq_at must be timezone-aware"):
        sync_client.list_dlq(before_dlq_at=dt.datetime(2024, 1, 1))


async def test_retry_from_dlq_gives_a_fresh_attempt_under_the_same_id(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job_id = failed_row(conn, tags=["billing"])
    await client.move_failed_to_dlq(job_id, "manual")

    revived = await client.retry_from_dlq(job_id)
    assert revived is not None
    assert revived.id == job_id
    assert revived.state is awa.JobState.AVAILABLE
    assert revived.attempt == 0
    assert revived.run_lease == 3  # kept: the next claim goes past every earlier attempt
    assert revived.errors == [{"error": "boom", "attempt": 3}]  # the history stays
    assert revived.tags == ["billing"]
    assert revived.finalized_at is None
    assert await client.get_dlq_job(job_id) is None
    assert await client.retry_from_dlq(job_id) is None  # no longer in the DLQ

    # Overrides: another queue, a priority, a future run_at (scheduled).
    other = failed_row(conn)
    await client.move_failed_to_dlq(other, "manual")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    moved = await client.retry_from_dlq(other, run_at=later, priority=1, queue="elsewhere")
    assert moved is not None
    assert (moved.state, moved.priority, moved.queue) == (awa.JobState.SCHEDULED, 1, "elsewhere")
    assert moved.run_at == later
    with pytest.raises(awa.ValidationError, match="priority"):
        await client.retry_from_dlq(other, priority=9)


async def test_retry_from_dlq_refuses_a_held_unique_key(
    client: awa.AsyncClient, conn: Conn
) -> None:
    original = await client.insert(Flaky(1), queue=PLAIN, unique_opts={"by_queue": True})
    conn.execute(
        "UPDATE awa.jobs SET state = 'failed', finalized_at = now() WHERE id = %s", (original.id,)
    )
    await client.move_failed_to_dlq(original.id, "manual")
    holder = await client.insert(Flaky(1), queue=PLAIN, unique_opts={"by_queue": True})

    with pytest.raises(awa.UniqueConflict) as raised:
        await client.retry_from_dlq(original.id)
    assert raised.value.job_id == holder.id
    assert (await client.get_dlq_job(original.id)) is not None  # the entry stays
    assert await client.bulk_retry_from_dlq(queue=PLAIN) == 0  # skipped, not an error

    await client.cancel(holder.id)
    assert await client.bulk_retry_from_dlq(queue=PLAIN) == 1
    assert job_row(conn, original.id)["state"] == "available"  # type: ignore[index]


def test_bulk_operations_need_a_filter_or_allow_all(sync_client: awa.Client, conn: Conn) -> None:
    with pytest.raises(awa.ValidationError, match="kind= or queue= or tag="):
        sync_client.bulk_retry_from_dlq()
    with pytest.raises(awa.ValidationError, match="kind= or queue= or tag="):
        sync_client.purge_dlq(before_dlq_at=dt.datetime.now(dt.UTC))  # a cursor is no scope
    with pytest.raises(awa.ValidationError, match="kind= or queue="):
        sync_client.bulk_move_failed_to_dlq()

    for name in ("a", "b", "b"):
        failed_row(conn, queue_name=name)
    assert sync_client.bulk_move_failed_to_dlq(queue="b", reason="triage") == 2
    assert sync_client.bulk_move_failed_to_dlq(allow_all=True) == 1
    assert {entry.reason for entry in sync_client.list_dlq()} == {"triage", "manual"}
    assert sync_client.bulk_retry_from_dlq(allow_all=True) == 3
    assert sync_client.dlq_depth() == 0


def test_move_failed_to_dlq_only_moves_failed_jobs(sync_client: awa.Client, conn: Conn) -> None:
    waiting = sync_client.insert(Flaky(), queue=PLAIN)
    assert sync_client.move_failed_to_dlq(waiting.id, "manual") is None
    assert job_row(conn, waiting.id) is not None
    with pytest.raises(awa.ValidationError, match="reason"):
        sync_client.move_failed_to_dlq(waiting.id, "")
    failed = failed_row(conn)
    entry = sync_client.move_failed_to_dlq(failed, "poison")
    assert entry is not None
    assert entry.reason == "poison"
    assert entry.job.state == "failed"
    assert job_row(conn, failed) is None


def test_purge_by_id_and_by_filter(sync_client: awa.Client, conn: Conn) -> None:
    ids = [failed_row(conn, queue_name=name, tags=[name]) for name in ("a", "a", "b")]
    for job_id in ids:
        sync_client.move_failed_to_dlq(job_id, "manual")
    assert sync_client.purge_dlq_job(ids[0]) is True
    assert sync_client.purge_dlq_job(ids[0]) is False
    assert sync_client.purge_dlq(tag="b") == 1
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    assert sync_client.purge_dlq(queue="a", before_dlq_at=past) == 0
    assert sync_client.purge_dlq(allow_all=True) == 1
    assert sync_client.dlq_depth() == 0
    # The same operations on a connection, through awa.admin.
    with psycopg.connect(conn.info.dsn) as own:
        assert awa.admin.dlq_depth(own) == 0
        assert awa.admin.list_dlq(own) == []


async def test_retention_deletes_old_entries_in_batches(
    client: awa.AsyncClient, conn: Conn
) -> None:
    ids = [failed_row(conn) for _ in range(5)]
    for job_id in ids:
        await client.move_failed_to_dlq(job_id, "manual")
    conn.execute(
        "UPDATE awa.dlq_entries SET dlq_at = now() - interval '31 days' WHERE id = ANY(%s)",
        (ids[:3],),
    )
    duty = dlq_retention_duty(interval=1.0, retention=30 * 86400.0, batch_size=2)
    async with client.connection() as own:
        await duty.run(own)
    assert [entry.job.id for entry in await client.list_dlq()] == sorted(ids[3:], reverse=True)
    assert any(
        duty.name == "dlq retention" for duty in leader_duties(RuntimeConfig(), on_rescued=_none)
    )


async def _none(rescued: Any) -> None:
    return None


def test_the_settings() -> None:
    assert RuntimeConfig().dlq_enabled is False
    assert RuntimeConfig().dlq_retention == 30 * 86400.0
    assert RuntimeConfig(dlq_retention=dt.timedelta(days=2)).dlq_retention == 172800.0
    assert QueueConfig("q").dlq_enabled is None
    with pytest.raises(awa.ValidationError, match="dlq_retention"):
        RuntimeConfig(dlq_retention=0)
    with pytest.raises(awa.ValidationError, match="dlq_enabled"):
        RuntimeConfig(dlq_enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(awa.ValidationError, match="dlq_enabled"):
        QueueConfig("q", dlq_enabled=1)  # type: ignore[arg-type]
    assert parse_value("dlq_enabled", "true") is True
    assert parse_value("dlq_enabled", "off") is False
    assert parse_queue_option("email.dlq_enabled=yes") == ("email", "dlq_enabled", True)
    assert parse_queue_option("email.dlq_enabled=none") == ("email", "dlq_enabled", None)
    with pytest.raises(awa.ValidationError, match="true or false"):
        parse_value("dlq_enabled", "maybe")


# The command ------------------------------------------------------------------------------


def awa_cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=False)


def test_the_cli(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    ids = [failed_row(conn, queue_name=name) for name in ("a", "a", "b")]
    for job_id in ids:
        sync_client.move_failed_to_dlq(job_id, "manual")

    listed = awa_cli(database_url, "dlq", "list", "--queue", "a")
    assert listed.exit_code == 0, listed.output
    assert "REASON" in listed.stdout
    assert "manual" in listed.stdout
    assert "boom" in listed.stdout
    as_json = json.loads(awa_cli(database_url, "dlq", "list", "--json").stdout)
    assert {entry["job"]["id"] for entry in as_json} == set(ids)
    assert as_json[0]["reason"] == "manual"

    shown = awa_cli(database_url, "dlq", "get", str(ids[0]))
    assert shown.exit_code == 0
    assert "reason      manual" in shown.stdout
    missing = awa_cli(database_url, "dlq", "get", "999999")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == "error: job 999999 is not in the dead-letter queue"

    depth = json.loads(awa_cli(database_url, "dlq", "depth", "--json").stdout)
    assert depth == {"total": 3, "queues": {"a": 2, "b": 1}}
    assert "2 job(s)" in awa_cli(database_url, "dlq", "depth", "--queue", "a").stdout

    retried = awa_cli(database_url, "dlq", "retry", str(ids[0]), "--priority", "1")
    assert retried.exit_code == 0, retried.output
    assert f"job {ids[0]} is available again in queue a" in retried.stdout
    unscoped = awa_cli(database_url, "dlq", "retry")
    assert unscoped.exit_code == 2
    assert "--all" in unscoped.stderr
    bulk = json.loads(awa_cli(database_url, "dlq", "retry", "--queue", "b", "--json").stdout)
    assert bulk == {"retried": 1}

    refused = awa_cli(database_url, "dlq", "purge")
    assert refused.exit_code == 2
    assert awa_cli(database_url, "dlq", "purge", str(ids[1])).stdout.strip() == (
        f"purged job {ids[1]}"
    )
    naive = awa_cli(database_url, "dlq", "purge", "--all", "--before", "2024-01-01T00:00:00")
    assert naive.exit_code == 2
    assert "timezone" in naive.stderr
    assert awa_cli(database_url, "dlq", "purge", "--all").stdout.strip() == (
        "purged 0 job(s) (every entry)"
    )
    assert "empty" in awa_cli(database_url, "dlq", "depth").stdout


async def test_an_entry_keeps_every_column_of_the_failed_row(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """The move copies the row whole (bytes, intervals, arrays, JSON, UUIDs and all)."""
    job = await client.insert(
        {"n": 1},
        kind="full",
        queue=PLAIN,
        tags=["a", "b"],
        metadata={"k": [1, {"x": None}]},
        unique_opts={"by_args": True},
        ordering_key=b"\x00\xffkey",
        deadline_duration=dt.timedelta(minutes=5, microseconds=7),
        concurrency_key="tenant-1",
    )
    conn.execute(
        "UPDATE awa.jobs SET state = 'failed', attempt = 2, finalized_at = now(),"
        " workflow_id = gen_random_uuid(), has_dependents = true, progress = '{\"p\": 1}',"
        ' errors = \'[{"error": "boom", "attempt": 2, "at": "2026-01-01T00:00:00Z"}]\''
        " WHERE id = %s",
        (job.id,),
    )
    before = job_row(conn, job.id)
    assert before is not None
    entry = await client.move_failed_to_dlq(job.id, "kept whole")
    assert entry is not None
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        cursor.execute("SELECT * FROM awa.dlq_entries WHERE id = %s", (job.id,))
        stored = cursor.fetchone()
    assert stored is not None
    assert {name: stored[name] for name in before} == before
    assert (stored["reason"], stored["original_run_lease"]) == ("kept whole", before["run_lease"])
