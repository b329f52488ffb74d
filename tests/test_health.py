"""Health: ``client.health_check()`` and the ``awa health`` command, with a worker running,
without one, against an unmigrated database and against no database at all."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from typing import Any

from click.testing import CliRunner, Result

import awa
from awa.cli import main
from awa.sql import current_version
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
        # The backlog queue has waited 90 s with no worker running it: unserved unless the
        # threshold is longer.
        args = ("health", "--unserved-after", "300")
        text = await asyncio.to_thread(awa_cli, *args, url=database_url)
        as_json = await asyncio.to_thread(awa_cli, *args, "--json", url=database_url)
        holder = lock_holder(conn)
    finally:
        await client.close()
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0] == "healthy"
    assert lines[1] == f"schema:  version {current_version()} (expected {current_version()})"
    assert lines[2].startswith(f"leader:  backend pid {holder} ({APP}")
    assert lines[3] == "workers: 1 live"
    assert f"pid {os.getpid()}" in lines[4]
    assert "default=4" in lines[4]
    header = lines[6].split()
    assert header[:5] == ["QUEUE", "AVAILABLE", "RUNNING", "SCHEDULED", "RETRYABLE"]
    assert header[-1] == "SERVED"
    [row] = [line.split() for line in lines[7:] if line.startswith("backlog")]
    assert row[1:5] == ["2", "0", "0", "0"]
    assert row[5] in {"1m", "1m 30s", "1m 31s", "1m 32s"} or row[5].startswith("1m")
    assert row[-1] == "no"

    assert as_json.exit_code == 0, as_json.output
    data: dict[str, Any] = json.loads(as_json.stdout)
    assert data["healthy"] is True
    assert data["status"] == "healthy"
    [worker] = data["workers"]
    assert (worker["pid"], worker["queues"], worker["concurrency"]) == (
        os.getpid(),
        ["default"],
        {"default": 4},
    )
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
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    assert lines[0] == "unreachable"
    assert lines[1].startswith("  problem: database unreachable")
    assert len(lines) == 2
    data = json.loads(awa_cli("health", "--json", url=UNREACHABLE).stdout)
    assert data["postgres_connected"] is False


# unserved queues and the runtimes table -----------------------------------------------------


def runtime_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT pid, queues FROM awa.runtimes ORDER BY started_at").fetchall()


async def test_unserved_queue_degrades_health(database_url: str, conn: Conn) -> None:
    """A queue holding available jobs older than the threshold that no live worker runs is
    unserved: status degraded, exit code 2. Queues a worker runs, paused queues and young
    backlogs are not."""
    backlog(conn, 3, waited=90)  # queue "backlog": nobody runs it
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, run_at) VALUES"
        " ('idle', 'young', now() - interval '5 seconds'),"
        " ('idle', 'held', now() - interval '5 minutes')"
    )
    client = await running_worker(database_url)
    try:
        await client.pause_queue("held")
        check = await client.health_check()
        result = await asyncio.to_thread(awa_cli, "health", url=database_url)
        as_json = await asyncio.to_thread(awa_cli, "health", "--json", url=database_url)
        relaxed = await client.health_check(unserved_after=600)
    finally:
        await client.close()
    assert check.status == "degraded"
    assert not check.healthy
    assert [(item.queue, item.available) for item in check.unserved] == [("backlog", 3)]
    assert 90 <= check.unserved[0].oldest_available_age < 120
    assert check.problems == [
        "queue 'backlog' is unserved: 3 available job(s), the oldest waiting "
        f"{check.unserved[0].oldest_available_age:.0f}s, and no live worker runs it"
    ]
    assert result.exit_code == 2
    assert result.stdout.splitlines()[0] == "degraded"
    [row] = [line.split() for line in result.stdout.splitlines() if line.startswith("backlog")]
    assert row[-1] == "UNSERVED"
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["status"] == "degraded"
    assert [entry["queue"] for entry in data["unserved"]] == ["backlog"]
    assert relaxed.status == "healthy"


async def test_a_queue_run_by_another_worker_is_served(database_url: str, conn: Conn) -> None:
    backlog(conn, 2, waited=90)
    client = await running_worker(database_url)
    other = awa.AsyncClient(database_url)
    release = asyncio.Event()

    @other.task(Idle, queue="backlog")
    async def handle(job: awa.Job[Idle]) -> None:
        await release.wait()  # keep the jobs running, so the backlog stays

    try:
        await start(other, {"backlog": {"max_workers": 1}})
        check = await client.health_check()
        assert [worker.queues for worker in check.workers] == [["default"], ["backlog"]]
        assert check.unserved == []
        assert check.status == "healthy", check.problems
    finally:
        release.set()
        await other.close()
        await client.close()


async def test_runtime_row_lifecycle(database_url: str, conn: Conn) -> None:
    """Registered at start with its queues, removed on a clean shutdown; a row that stopped
    heartbeating (a crashed process) is ignored by health and expired by the leader."""
    client = await running_worker(database_url)
    try:
        assert runtime_rows(conn) == [(os.getpid(), ["default"])]
        conn.execute(
            "INSERT INTO awa.runtimes (id, hostname, pid, application_name, version, queues,"
            " stale_after, heartbeat_at) VALUES (gen_random_uuid(), 'gone', 1, 'x', '0',"
            " ARRAY['backlog'], interval '10 seconds', now() - interval '1 minute')"
        )
        backlog(conn, 1, waited=90)
        check = await client.health_check()
        assert [worker.pid for worker in check.workers] == [os.getpid()]
        assert [item.queue for item in check.unserved] == ["backlog"]
        await client.shutdown()
        await start(client, cleanup_interval=0.1)
        await wait_for(lambda: len(runtime_rows(conn)) == 1, 5)
        assert runtime_rows(conn) == [(os.getpid(), ["default"])]
    finally:
        await client.close()
    assert runtime_rows(conn) == []
