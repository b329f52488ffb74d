"""Bad input gets a clear error naming what is wrong, and nothing is stored: lone surrogates
in names, tags and ordering keys; args and metadata beyond the size limits; a deeply nested
body at the callback receiver; ``flush_progress_sync()`` on the event loop's thread."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

import awa
from awa.callbacks.http import create_app
from helpers_callbacks import insert_parked
from helpers_worker import queue, row, start, wait_for, wait_for_state
from jobs_helpers import Conn

SURROGATE = "q\ud800"


@dataclasses.dataclass
class Note:
    text: str


def job_count(conn: Conn) -> int:
    found = conn.execute("SELECT count(*) FROM awa.jobs").fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"kind": SURROGATE}, "kind"),
        ({"queue": SURROGATE}, "queue"),
        ({"tags": ["ok", SURROGATE]}, "tag"),
        ({"ordering_key": SURROGATE}, "ordering_key"),
        ({"metadata": {"note": SURROGATE}}, "metadata"),
    ],
)
async def test_lone_surrogates_are_refused_on_every_insert_path(
    client: awa.AsyncClient, conn: Conn, options: dict[str, Any], field: str
) -> None:
    calls = [
        lambda: client.insert(Note("a"), **options),
        lambda: client.insert_many([Note("a"), Note("b")], **options),
        lambda: client.insert_many_copy([Note("a"), Note("b")], **options),
        lambda: (
            client.insert_many([awa.EnqueueRequest(Note("a"), kind=options.get("kind"))])
            if "kind" in options
            else client.insert_many([Note("a")], **options)
        ),
    ]
    for call in calls:
        with pytest.raises(awa.ValidationError, match=field):
            await call()
    with pytest.raises(awa.ValidationError, match=field):
        async with client.transaction() as tx:
            await tx.insert(Note("a"), **options)
    assert job_count(conn) == 0


async def test_lone_surrogate_in_args_is_refused(client: awa.AsyncClient, conn: Conn) -> None:
    with pytest.raises(awa.ValidationError, match="args"):
        await client.insert(Note(SURROGATE))
    assert job_count(conn) == 0


def test_lone_surrogate_through_the_blocking_client(sync_client: awa.Client, conn: Conn) -> None:
    with pytest.raises(awa.ValidationError, match="lone surrogate"):
        sync_client.insert(Note("a"), queue=SURROGATE)
    assert job_count(conn) == 0


async def test_staging_a_surrogate_fails_the_attempt_at_once(
    client: awa.AsyncClient, conn: Conn
) -> None:
    """enqueue_on_completion validates at once: StagingError (a TerminalError), so the job
    fails on this attempt instead of retrying to exhaustion."""
    seen: list[str] = []

    @client.task(Note)
    async def handle(job: awa.Job[Note]) -> None:
        try:
            job.enqueue_on_completion(Note("follow"), tags=[SURROGATE])
        except awa.StagingError as error:
            seen.append(str(error))
            raise

    job = await client.insert(Note("trigger"), max_attempts=5)
    await start(client, queue())
    try:
        failed = await wait_for_state(conn, job.id, "failed")
    finally:
        await client.shutdown()
    assert failed["attempt"] == 1
    assert "lone surrogate" in seen[0]
    assert "tag" in seen[0]
    assert "StagingError" in failed["errors"][-1]["error"]
    assert job_count(conn) == 1  # no follow-up


async def test_args_and_metadata_size_limits(client: awa.AsyncClient, conn: Conn) -> None:
    """Defaults: 1 MiB of args, 256 KiB of metadata (as JSON, UTF-8 bytes)."""
    with pytest.raises(awa.ValidationError, match=r"args is 1048\d+ bytes as JSON; the limit is"):
        await client.insert(Note("x" * (1024 * 1024)))
    with pytest.raises(awa.ValidationError, match=r"limit is 262144 bytes"):
        await client.insert(Note("x"), metadata={"blob": "é" * 140_000})
    with pytest.raises(awa.ValidationError, match=r"job 1: args is"):
        await client.insert_many_copy([Note("ok"), Note("x" * (1024 * 1024))])
    assert job_count(conn) == 0
    # Just under the limit goes in.
    await client.insert(Note("x" * (1024 * 1024 - 100)))
    assert job_count(conn) == 1


async def test_size_limits_are_configurable(database_url: str, conn: Conn) -> None:
    async with awa.AsyncClient(database_url, max_args_bytes=64, max_metadata_bytes=32) as small:
        with pytest.raises(awa.ValidationError, match="args is 71 bytes as JSON; the limit is 64"):
            await small.insert(Note("x" * 60))
        with pytest.raises(awa.ValidationError, match=r"metadata is .* the limit is 32"):
            await small.insert(Note("x"), metadata={"k": "y" * 40})

        @small.task(Note)
        async def handle(job: awa.Job[Note]) -> None:
            job.enqueue_on_completion(Note("z" * 100))  # too big for this client

        trigger = await small.insert(Note("t"))
        await start(small, queue())
        try:
            failed = await wait_for_state(conn, trigger.id, "failed")
        finally:
            await small.shutdown()
        assert "the limit is 64" in failed["errors"][-1]["error"]
    with pytest.raises(awa.ValidationError, match="max_args_bytes must be a positive integer"):
        awa.AsyncClient(database_url, max_args_bytes=0)
    assert job_count(conn) == 1


async def test_receiver_answers_a_deeply_nested_body_with_400(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job_id, cb = await insert_parked(client, conn)
    transport = httpx.ASGITransport(app=create_app(client, allow_unsigned=True))
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
        for depth in (100_000, 1_000, 65):
            body = '{"payload": ' + "[" * depth + "]" * depth + "}"
            response = await http.post(f"/callbacks/{cb}/complete", content=body.encode())
            assert response.status_code == 400, (depth, response.text)
            assert "error" in response.json()
        nested_ok = '{"payload": ' + "[" * 30 + "]" * 30 + "}"
        response = await http.post(f"/callbacks/{cb}/complete", content=nested_ok.encode())
        assert response.status_code == 200, response.text
    assert row(conn, job_id)["state"] == "completed"


async def test_flush_progress_sync_on_the_loop_thread_raises_instead_of_hanging(
    client: awa.AsyncClient, conn: Conn
) -> None:
    errors: list[str] = []

    @client.task(Note)
    async def handle(job: awa.Job[Note]) -> None:
        job.set_progress(50, "half")
        try:
            job.flush_progress_sync()  # wrong from an async handler: must not block the loop
        except RuntimeError as error:
            errors.append(str(error))
        await job.flush_progress()

    job = await client.insert(Note("a"))
    await start(client, queue())
    try:
        await wait_for_state(conn, job.id, "completed")
        await wait_for(lambda: errors)
    finally:
        await client.shutdown()
    assert "flush_progress_sync() is for def handlers" in errors[0]


async def test_clients_refuse_a_url_that_is_not_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(awa.ValidationError, match="sqlite://, which is not a PostgreSQL URL"):
        awa.Client("sqlite:///jobs.db").get_job(1)
    with pytest.raises(awa.ValidationError, match="not a PostgreSQL URL"):
        await awa.AsyncClient("mysql://app@db/app").get_job(1)
    monkeypatch.setenv("DATABASE_URL", "redis://localhost")
    with pytest.raises(awa.ValidationError, match=r"^DATABASE_URL: .*redis://"):
        await awa.AsyncClient().get_job(1)
