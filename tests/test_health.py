"""Health: ``client.health_check()`` and the ``awa health`` command, with a worker running,
without one, against an unmigrated database and against no database at all."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from click.testing import CliRunner, Result

import awa
from awa.cli import main
from helpers_worker import start, wait_for
from jobs_helpers import Conn

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"
APP = "awa-health-test"


@dataclasses.dataclass
class Idle:
    pass


def awa_cli(*args: str, url: str) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=False)


def backlog(conn: Conn, count: int, waited: float) -> None:
    """``count`` available jobs on queue ``backlog`` (nobody works it), due ``waited``
    seconds ago."""
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, run_at) SELECT 'idle', 'backlog',"
        " now() - make_interval(secs => %s) FROM generate_series(1, %s)",
        (waited, count),
    )


def lock_holder(conn: Conn) -> int:
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def running_worker(database_url: str) -> awa.AsyncClient:
    client = awa.AsyncClient(database_url, application_name=APP)

    @client.task(Idle)
    async def handle(job: awa.Job[Idle]) -> None:
        pass

    await start(client)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.is_leader, 5)
    return client


async def test_health_of_a_running_worker(database_url: str, conn: Conn) -> None:
    backlog(conn, 3, waited=30)
    client = await running_worker(database_url)
    try:
        check = await client.health_check()
    finally:
        await client.close()
    assert check.healthy, check.problems
    assert check.problems == []
    assert check.postgres_connected
    assert check.schema_version == check.expected_schema_version
    assert check.leader is not None
    assert check.leader.application_name == APP
    assert check.leader.pid > 0
    runtime = check.runtime
    assert runtime is not None
    assert runtime.is_leader
    assert runtime.listener_connected
    assert runtime.heartbeat_alive
    assert "default" in runtime.queues
    [stats] = [stats for stats in check.queues if stats.queue == "backlog"]
    assert stats.available == 3
    assert stats.oldest_available_at is not None
    assert stats.oldest_available_age is not None
    assert 30 <= stats.oldest_available_age < 60


async def test_health_names_the_backend_holding_the_lock(database_url: str, conn: Conn) -> None:
    client = await running_worker(database_url)
    try:
        check = await client.health_check()
        assert check.leader is not None
        assert check.leader.pid == lock_holder(conn)
    finally:
        await client.close()


def test_no_worker_is_unhealthy(sync_client: awa.Client) -> None:
    check = sync_client.health_check()
    assert not check.healthy
    assert check.postgres_connected
    assert check.leader is None
    assert check.runtime is None
    assert check.problems == ["no runtime holds the maintenance lock (no worker running?)"]


def test_unreachable_database_is_unhealthy() -> None:
    started = time.monotonic()
    with awa.Client(UNREACHABLE) as client:
        check = client.health_check()
    assert time.monotonic() - started < 10
    assert not check.healthy
    assert not check.postgres_connected
    assert len(check.problems) == 1
    assert check.problems[0].startswith("database unreachable")


def test_unmigrated_database_is_unhealthy(fresh_database: str) -> None:
    with awa.Client(fresh_database) as client:
        check = client.health_check()
    assert not check.healthy
    assert check.postgres_connected
    assert check.schema_version is None
    assert check.problems == ["the awa schema does not exist in this database (run `awa migrate`)"]


# awa health ------------------------------------------------------------------------------


async def test_cli_health_with_a_worker(database_url: str, conn: Conn) -> None:
    backlog(conn, 2, waited=90)
    client = await running_worker(database_url)
    try:
        text = await asyncio.to_thread(awa_cli, "health", url=database_url)
        as_json = await asyncio.to_thread(awa_cli, "health", "--json", url=database_url)
        holder = lock_holder(conn)
    finally:
        await client.close()
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0] == "healthy"
    assert lines[1] == "schema:  version 1 (expected 1)"
    assert lines[2].startswith(f"leader:  backend pid {holder} ({APP}")
    header = lines[4].split()
    assert header[:5] == ["QUEUE", "AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE"]
    [row] = [line.split() for line in lines[5:] if line.startswith("backlog")]
    assert row[1:5] == ["2", "0", "0", "0"]
    assert row[5] in {"1m", "1m 30s", "1m 31s", "1m 32s"} or row[5].startswith("1m")

    assert as_json.exit_code == 0, as_json.output
    data: dict[str, Any] = json.loads(as_json.stdout)
    assert data["healthy"] is True
    assert data["problems"] == []
    assert data["leader"]["pid"] == holder
    assert data["leader"]["application_name"] == APP
    [queue] = [entry for entry in data["queues"] if entry["queue"] == "backlog"]
    assert queue["counts"]["available"] == 2
    assert 90 <= queue["lag_seconds"] < 120
    assert queue["oldest_available_at"] is not None


def test_cli_health_without_a_worker_exits_1(database_url: str) -> None:
    result = awa_cli("health", url=database_url)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        "unhealthy",
        "  problem: no runtime holds the maintenance lock (no worker running?)",
    ]
    assert "leader:  none" in result.stdout
    as_json = awa_cli("health", "--json", url=database_url)
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["healthy"] is False
    assert data["leader"] is None


def test_cli_health_of_an_unreachable_database() -> None:
    result = awa_cli("health", url=UNREACHABLE)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "unhealthy"
    assert lines[1].startswith("  problem: database unreachable")
    assert len(lines) == 2
    data = json.loads(awa_cli("health", "--json", url=UNREACHABLE).stdout)
    assert data["postgres_connected"] is False
