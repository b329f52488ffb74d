"""Failures that repeat are logged once per episode (awa.core.outage), and the runtime's
background services outlive unexpected errors: a maintenance duty that raises is retried
while the other duties go on, and the heartbeat thread survives a beat that raises."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from awa.core.outage import FailureLog, quiet_pool_reconnect_errors
from awa.job import Job
from awa.worker.heartbeat import Heartbeat
from awa.worker.maintenance import Duty, Maintenance
from helpers_worker import wait_for

LOG = logging.getLogger("awa.test.outage")


def records(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == name]


def test_a_failure_is_warned_once_then_its_recovery_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = FailureLog(LOG, "claiming", remind_every=3600)
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        failures.succeeded()  # nothing to report
        for attempt in range(5):
            failures.failed(OSError(f"connection\n  refused {attempt}"))
        assert failures.failing
        failures.succeeded()
        failures.succeeded()
    logged = records(caplog, LOG.name)
    assert logged[0] == (logging.WARNING, "claiming failed (connection refused 0); retrying")
    assert [level for level, _ in logged[1:5]] == [logging.DEBUG] * 4
    assert logged[5][0] == logging.INFO
    assert logged[5][1].startswith("claiming recovered after ")
    assert logged[5][1].endswith("s (5 failed attempts)")
    assert len(logged) == 6
    assert not failures.failing


def test_a_long_failure_is_recalled_now_and_then(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailureLog(LOG, "heartbeat", remind_every=0)
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        failures.failed("down", then="waiting")
        failures.failed("still down")
    logged = records(caplog, LOG.name)
    assert logged[0] == (logging.WARNING, "heartbeat failed (down); waiting")
    assert logged[1][0] == logging.WARNING
    assert logged[1][1].startswith("heartbeat still failing after ")
    assert logged[1][1].endswith(", 2 attempts (still down)")


def test_pool_reconnection_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    quiet_pool_reconnect_errors("awa")
    quiet_pool_reconnect_errors("awa")  # installing twice adds one filter
    pool_log = logging.getLogger("psycopg.pool")
    with caplog.at_level(logging.WARNING, logger="psycopg.pool"):
        for _ in range(5):
            pool_log.warning("error connecting in %r: %s", "awa", "connection refused")
            pool_log.warning("error connecting in %r: %s", "someone-else", "connection refused")
        pool_log.warning("discarding closed connection: %s", "<conn>")
    messages = [message for _, message in records(caplog, "psycopg.pool")]
    ours = [m for m in messages if "'awa'" in m]
    assert len(ours) <= 1  # one a minute (none if an earlier test used the minute)
    assert len([m for m in messages if "someone-else" in m]) == 5
    assert "discarding closed connection: <conn>" in messages


async def test_a_failing_duty_does_not_stop_the_leader(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs = {"broken": 0, "fine": 0}

    async def broken(conn: psycopg.AsyncConnection[Any]) -> None:
        runs["broken"] += 1
        raise RuntimeError("a bug in a duty")

    async def fine(conn: psycopg.AsyncConnection[Any]) -> None:
        runs["fine"] += 1
        await conn.execute("SELECT 1")

    maintenance = Maintenance(
        database_url,
        application_name="awa-test-outage",
        election_interval=0.1,
        check_interval=0.1,
        duties=[Duty("broken", 0.01, broken), Duty("fine", 0.01, fine)],
    )
    with caplog.at_level(logging.WARNING, logger="awa.maintenance"):
        maintenance.start()
        try:
            await wait_for(lambda: runs["broken"] >= 10 and runs["fine"] >= 10, 5)
            assert maintenance.is_leader
        finally:
            await maintenance.stop()
    warnings = [r for r in caplog.records if r.name == "awa.maintenance"]
    assert len(warnings) == 1
    assert "maintenance duty broken failed (a bug in a duty)" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None  # not an outage: the traceback comes along


async def test_the_heartbeat_thread_survives_an_unexpected_error(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def snapshot() -> list[Job[Any]]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug while taking the snapshot")
        return []

    heartbeat = Heartbeat(
        database_url, interval=0.01, snapshot=snapshot, application_name="awa-test-outage"
    )
    with caplog.at_level(logging.ERROR, logger="awa.worker"):
        heartbeat.start()
        try:
            await wait_for(lambda: len(calls) >= 5, 5)
            assert heartbeat.alive
        finally:
            await asyncio.to_thread(heartbeat.stop)
    assert any("heartbeat failed unexpectedly" in r.getMessage() for r in caplog.records)
