"""Every failed attempt is logged by the worker that ran it (DESIGN §4.14): a retry at
WARNING, exhaustion and terminal failures at ERROR with the traceback, an unknown kind or
undecodable args at ERROR, a stale outcome at DEBUG; records carry the job's fields."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys

import pytest

import awa
from awa.observability.log_format import JsonFormatter
from helpers_worker import queue, start, wait_for, wait_for_state
from jobs_helpers import Conn


@dataclasses.dataclass
class Flaky:
    n: int


@dataclasses.dataclass
class Typed:
    count: int


def records_about(caplog: pytest.LogCaptureFixture, job_id: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "job_id", None) == job_id]


async def test_a_retry_is_a_warning_and_exhaustion_an_error_with_the_traceback(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="awa.worker")

    @client.task(Flaky)
    async def flaky(job: awa.Job[Flaky]) -> None:
        raise ValueError(f"flaky {job.args.n} broke")

    retried = await client.insert(Flaky(1), max_attempts=5)
    exhausted = await client.insert(Flaky(2), max_attempts=1)
    await start(client, queue())
    try:
        await wait_for_state(conn, retried.id, "retryable")
        await wait_for_state(conn, exhausted.id, "failed")
        await wait_for(lambda: records_about(caplog, exhausted.id))
    finally:
        await client.shutdown()

    [retry] = records_about(caplog, retried.id)
    assert retry.levelno == logging.WARNING
    message = retry.getMessage()
    assert f"job {retried.id} (kind flaky, queue default)" in message
    assert "attempt 1/5" in message
    assert "ValueError: flaky 1 broke" in message
    assert "retrying at" in message
    assert (retry.kind, retry.queue, retry.attempt) == ("flaky", "default", 1)  # type: ignore[attr-defined]
    assert retry.exc_info is None  # a retry is one line

    [final] = records_about(caplog, exhausted.id)
    assert final.levelno == logging.ERROR
    assert "attempt 1/1" in final.getMessage()
    assert "no attempts left" in final.getMessage()
    assert "ValueError: flaky 2 broke" in final.getMessage()
    assert final.exc_info is not None
    assert isinstance(final.exc_info[1], ValueError)
    text = logging.Formatter().formatException(final.exc_info)
    assert "in flaky" in text  # the handler's own frame


async def test_terminal_error_and_bad_args_are_errors(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="awa.worker")

    @client.task(Typed)
    async def typed(job: awa.Job[Typed]) -> None:
        raise awa.TerminalError("give up now")

    terminal = await client.insert(Typed(1))
    bad_args = await client.insert({"count": "not a number"}, kind="typed")
    await start(client, queue())
    try:
        for job in (terminal, bad_args):
            await wait_for_state(conn, job.id, "failed")
        await wait_for(lambda: all(records_about(caplog, j.id) for j in (terminal, bad_args)))
    finally:
        await client.shutdown()

    [record] = records_about(caplog, terminal.id)
    assert record.levelno == logging.ERROR
    assert "failed for good" in record.getMessage()
    assert "give up now" in record.getMessage()
    assert record.exc_info is not None
    [record] = records_about(caplog, bad_args.id)
    assert record.levelno == logging.ERROR
    assert "failed to decode args of kind 'typed'" in record.getMessage()


async def test_a_stale_outcome_is_debug(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="awa.worker")
    release = asyncio.Event()

    @client.task(Flaky)
    async def held(job: awa.Job[Flaky]) -> None:
        await release.wait()
        raise ValueError("too late")

    job = await client.insert(Flaky(1))
    await start(client, queue(), cancel_grace=None)
    try:
        await wait_for_state(conn, job.id, "running")
        # Move the row on under the attempt, as a rescue elsewhere would.
        conn.execute(
            "UPDATE awa.jobs SET state = 'retryable', run_at = now() + interval '1 hour',"
            " run_lease = run_lease + 1"
        )
        release.set()
        await wait_for(lambda: records_about(caplog, job.id))
    finally:
        await client.shutdown()
    [record] = records_about(caplog, job.id)
    assert record.levelno == logging.DEBUG
    assert "stale outcome ignored" in record.getMessage()


def test_json_formatter_writes_one_object_per_record() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord(
        "awa.worker", logging.WARNING, __file__, 1, "job %s failed", (7,), None
    )
    record.job_id, record.kind, record.queue, record.attempt = 7, "flaky", "default", 2
    entry = json.loads(formatter.format(record))
    assert entry["message"] == "job 7 failed"
    assert (entry["level"], entry["logger"]) == ("WARNING", "awa.worker")
    assert (entry["job_id"], entry["kind"], entry["queue"], entry["attempt"]) == (
        7,
        "flaky",
        "default",
        2,
    )
    try:
        raise RuntimeError("multi\nline")
    except RuntimeError:
        failing = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    line = formatter.format(failing)
    assert "\n" not in line
    assert "RuntimeError: multi" in json.loads(line)["exception"]
    assert "job_id" not in json.loads(line)
