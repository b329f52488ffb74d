"""Periodic jobs against the database: declaring and storing schedules, the leader's
evaluation (run here directly on a connection, so that the clock is the test's: downtime is
simulated by moving the stored last fire back), exactly one job per fire, the missed-fire
policies, pause / resume / trigger / delete, and the ``awa cron`` command."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from itertools import pairwise
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.periodic.duty import periodic_duty
from awa.storage.db import connection_kwargs
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn


@dataclasses.dataclass
class Report:
    name: str


def cron_row(conn: Conn, name: str) -> dict[str, Any]:
    cursor = conn.execute("SELECT * FROM awa.cron_jobs WHERE name = %s", (name,))
    row = cursor.fetchone()
    assert row is not None, f"no schedule {name}"
    assert cursor.description is not None
    return dict(zip([column.name for column in cursor.description], row, strict=True))


def fired_jobs(conn: Conn, name: str) -> list[tuple[str, dict[str, Any]]]:
    rows = conn.execute(
        "SELECT metadata->>'cron_fire_time', metadata FROM awa.jobs"
        " WHERE metadata->>'cron_name' = %s ORDER BY id",
        (name,),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def move_last_fire(conn: Conn, name: str, *, back: dt.timedelta) -> dt.datetime:
    """Pretend the leader was away: the last fire moves back (to a whole minute)."""
    found = conn.execute(
        "UPDATE awa.cron_jobs SET last_enqueued_at = date_trunc('minute', now()) - %s"
        " WHERE name = %s RETURNING last_enqueued_at",
        (back, name),
    ).fetchone()
    assert found is not None
    value: dt.datetime = found[0]
    return value


async def evaluate(database_url: str) -> None:
    """One evaluation pass of the leader's cron duty."""
    duty = periodic_duty(1.0)
    async with await psycopg.AsyncConnection.connect(
        database_url, **connection_kwargs("awa-test-cron")
    ) as conn:
        await duty.run(conn)


async def declare(client: awa.AsyncClient, name: str, cron: str, **options: Any) -> None:
    client.periodic(name, cron, Report, Report(name), **options)


@pytest.fixture
def reports(client: awa.AsyncClient) -> None:
    @client.task(Report, queue="reports")
    async def handle(job: awa.Job[Report]) -> None:
        return None


# declaring --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cron_expr": "61 * * * *"}, "invalid cron expression"),
        ({"cron_expr": "* * *"}, "invalid cron expression"),
        (
            {"cron_expr": "0 0 30 2 *"},
            r"^periodic job 'nightly': cron expression '0 0 30 2 \*' never",
        ),
        ({"timezone": "Nowhere/Land"}, "invalid timezone"),
        ({"missed_fire_policy": "sometimes"}, "invalid cron missed fire policy"),
        ({"priority": 9}, "priority must be between 1 and 4"),
        ({"args": {"not": "a report"}}, "must be an instance of Report"),
        ({"name": ""}, "periodic job name must not be empty"),
    ],
)
def test_bad_declarations_are_validation_errors(
    client: awa.AsyncClient, options: dict[str, Any], match: str
) -> None:
    declaration: dict[str, Any] = {
        "name": "nightly",
        "cron_expr": "0 3 * * *",
        "args_type": Report,
        "args": Report("x"),
    }
    declaration.update(options)
    with pytest.raises(awa.ValidationError, match=match):
        client.periodic(**declaration)


async def test_declared_twice_or_after_start_is_refused(
    client: awa.AsyncClient, reports: None
) -> None:
    client.periodic("nightly", "0 3 * * *", Report, Report("a"))
    with pytest.raises(awa.ValidationError, match="declared twice"):
        client.periodic("nightly", "0 4 * * *", Report, Report("b"))
    await start(client, queue("reports"))
    try:
        with pytest.raises(awa.AwaError, match="before start"):
            client.periodic("later", "0 4 * * *", Report, Report("c"))
    finally:
        await client.shutdown()


async def test_start_stores_schedules_routed_by_the_task(
    client: awa.AsyncClient, conn: Conn, reports: None
) -> None:
    await declare(
        client,
        "nightly",
        "30 2 * * *",
        timezone="Europe/Berlin",
        tags=["ops"],
        metadata={"team": "data"},
        priority=1,
        missed_fire_policy="catch_up",
    )
    await start(client, queue("reports"))
    await client.shutdown()
    row = cron_row(conn, "nightly")
    assert (row["cron_expr"], row["timezone"], row["kind"], row["queue"]) == (
        "30 2 * * *",
        "Europe/Berlin",
        "report",
        "reports",  # the task's queue
    )
    assert (row["args"], row["tags"], row["metadata"], row["priority"]) == (
        {"name": "nightly"},
        ["ops"],
        {"team": "data"},
        1,
    )
    assert row["missed_fire_policy"] == "catch_up"
    assert row["last_enqueued_at"] is None


async def test_two_deployments_keep_each_others_schedules(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    await declare(client, "billing-close", "0 0 1 * *")
    await start(client, queue("reports"))
    await client.shutdown()
    async with awa.AsyncClient(database_url) as other:

        @other.task(Report)
        async def handle(job: awa.Job[Report]) -> None:
            return None

        other.periodic("cleanup", "*/5 * * * *", Report, Report("cleanup"))
        await start(other, queue())
        await other.shutdown()
    names = [job.name for job in await client.list_cron_jobs()]
    assert names == ["billing-close", "cleanup"]


async def test_a_changed_definition_updates_and_keeps_history_and_pause(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    await declare(client, "nightly", "0 3 * * *")
    await start(client, queue("reports"))
    await client.shutdown()
    last = move_last_fire(conn, "nightly", back=dt.timedelta(hours=1))
    assert await client.pause_cron_job("nightly", paused_by="ops")
    async with awa.AsyncClient(database_url) as redeployed:

        @redeployed.task(Report, queue="reports")
        async def handle(job: awa.Job[Report]) -> None:
            return None

        redeployed.periodic("nightly", "0 4 * * *", Report, Report("v2"))
        await start(redeployed, queue("reports"))
        await redeployed.shutdown()
    row = cron_row(conn, "nightly")
    assert (row["cron_expr"], row["args"]) == ("0 4 * * *", {"name": "v2"})
    assert row["last_enqueued_at"] == last
    assert row["paused_by"] == "ops"


# firing -----------------------------------------------------------------------------------


async def test_the_leader_enqueues_each_fire_once(
    client: awa.AsyncClient, conn: Conn, reports: None
) -> None:
    await declare(client, "tick", "* * * * * *", missed_fire_policy="catch_up")
    await start(client, queue("reports"), cron_interval=0.2)
    try:
        await wait_for(lambda: len(fired_jobs(conn, "tick")) >= 3, 10)
    finally:
        await client.shutdown()
    fires = fired_jobs(conn, "tick")
    stamps = [dt.datetime.fromisoformat(stamp) for stamp, _ in fires]
    assert stamps == sorted(set(stamps))  # no fire twice
    assert all(later - earlier == dt.timedelta(seconds=1) for earlier, later in pairwise(stamps))
    assert fires[0][1]["cron_name"] == "tick"
    assert (await client.list_jobs(kind="report"))[0].queue == "reports"
    assert cron_row(conn, "tick")["last_enqueued_at"] == stamps[-1]


async def test_coalesce_enqueues_only_the_latest_missed_fire(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    await declare(client, "minutely", "* * * * *")
    await start(client, queue("reports"))
    await client.shutdown()
    last = move_last_fire(conn, "minutely", back=dt.timedelta(minutes=10))
    await evaluate(database_url)
    [(stamp, _)] = fired_jobs(conn, "minutely")
    fire = dt.datetime.fromisoformat(stamp)
    assert fire >= last + dt.timedelta(minutes=10)
    assert cron_row(conn, "minutely")["last_enqueued_at"] == fire
    await evaluate(database_url)  # nothing more is due
    assert len(fired_jobs(conn, "minutely")) == 1


async def test_catch_up_enqueues_every_missed_fire_in_order(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    await declare(client, "minutely", "* * * * *", missed_fire_policy="catch_up")
    await start(client, queue("reports"))
    await client.shutdown()
    last = move_last_fire(conn, "minutely", back=dt.timedelta(minutes=10))
    await evaluate(database_url)
    stamps = [dt.datetime.fromisoformat(stamp) for stamp, _ in fired_jobs(conn, "minutely")]
    assert stamps[:10] == [last + dt.timedelta(minutes=n) for n in range(1, 11)]
    assert len(stamps) in (10, 11)  # the current minute may have come due meanwhile


async def test_concurrent_evaluations_enqueue_each_fire_once(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    """Two leaders at once (as in a failover that overlaps): the compare-and-swap lets one
    of them enqueue each fire."""
    await declare(client, "minutely", "* * * * *", missed_fire_policy="catch_up")
    await start(client, queue("reports"))
    await client.shutdown()
    move_last_fire(conn, "minutely", back=dt.timedelta(minutes=30))
    await asyncio.gather(*(evaluate(database_url) for _ in range(4)))
    stamps = [stamp for stamp, _ in fired_jobs(conn, "minutely")]
    assert len(stamps) >= 30
    assert len(stamps) == len(set(stamps))


async def test_pause_resume_trigger_and_delete(
    client: awa.AsyncClient, database_url: str, conn: Conn, reports: None
) -> None:
    await declare(client, "minutely", "* * * * *")
    await start(client, queue("reports"))
    await client.shutdown()
    last = move_last_fire(conn, "minutely", back=dt.timedelta(minutes=5))
    assert await client.pause_cron_job("minutely", paused_by="ops")
    await evaluate(database_url)
    assert fired_jobs(conn, "minutely") == []  # paused: no fire
    [listed] = await client.list_cron_jobs()
    assert (listed.paused, listed.paused_by, listed.next_fire_at) == (True, "ops", None)

    triggered = await client.trigger_cron_job("minutely")  # works while paused
    assert triggered is not None
    assert triggered.metadata["triggered_manually"] is True
    assert cron_row(conn, "minutely")["last_enqueued_at"] == last  # the schedule did not move

    assert await client.resume_cron_job("minutely")
    await evaluate(database_url)  # coalesce: the latest fire missed while paused
    fires = fired_jobs(conn, "minutely")
    assert len(fires) == 2
    assert "triggered_manually" not in fires[1][1]
    [listed] = await client.list_cron_jobs()
    assert listed.next_fire_at is not None
    assert listed.next_fire_at > dt.datetime.now(dt.UTC)

    assert await client.delete_cron_job("minutely")
    assert await client.list_cron_jobs() == []
    assert not await client.pause_cron_job("minutely")
    assert not await client.resume_cron_job("minutely")
    assert await client.trigger_cron_job("minutely") is None
    assert not await client.delete_cron_job("minutely")


def test_blocking_client_and_admin(sync_client: awa.Client, conn: Conn) -> None:
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue) VALUES ('n', '0 3 * * *',"
        " 'report', 'reports')"
    )
    [job] = sync_client.list_cron_jobs()
    assert (job.name, job.paused) == ("n", False)
    assert sync_client.pause_cron_job("n")
    with psycopg.connect(str(conn.info.dsn)) as own:
        assert awa.admin.resume_cron_job(own, "n")
    assert sync_client.trigger_cron_job("n") is not None
    assert sync_client.delete_cron_job("n")


# awa cron ---------------------------------------------------------------------------------


def cli(database_url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--database-url", database_url, "cron", *args])


def test_cron_command(database_url: str, conn: Conn) -> None:
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue) VALUES"
        " ('nightly', '30 2 * * *', 'Europe/Berlin', 'report', 'reports')"
    )
    listed = cli(database_url, "list")
    assert listed.exit_code == 0, listed.output
    header, line = listed.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "CRON", "TIMEZONE", "KIND"]
    assert line.split()[:1] == ["nightly"]
    assert "30 2 * * *" in line
    [entry] = json.loads(cli(database_url, "list", "--json").stdout)
    assert (entry["name"], entry["paused_at"], entry["next_fire_at"] is not None) == (
        "nightly",
        None,
        True,
    )
    assert (
        cli(database_url, "pause", "nightly", "--by", "me").stdout
        == "periodic job nightly paused\n"
    )
    assert json.loads(cli(database_url, "list", "--json").stdout)[0]["paused_by"] == "me"
    assert cli(database_url, "resume", "nightly").exit_code == 0
    triggered = json.loads(cli(database_url, "trigger", "nightly", "--json").stdout)
    assert triggered["metadata"]["triggered_manually"] is True
    assert cli(database_url, "remove", "nightly").stdout == "periodic job nightly removed\n"
    missing = cli(database_url, "pause", "nightly")
    assert missing.exit_code == 1
    assert "no periodic job named 'nightly'" in missing.stderr
