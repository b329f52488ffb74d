"""Hostile and careless schedules: ``client.periodic()`` refuses what can never be stored or
fire, and a schedule that fails at run time (stored by an older version, by SQL, in a zone
that vanished, or refused by the database when fired) never stops the others.

Contract: a bad declaration raises ``awa.ValidationError`` naming the schedule and what is
wrong, and nothing is declared or stored. The leader evaluates and fires each schedule on its
own: a failing one is skipped, logged once (again only when its error changes, or after it
recovered), counted in ``awa.cron.schedule_errors``, and marked in ``list_cron_jobs()``
(``error``, ``next_fire_at`` None) and ``awa cron list``; the others fire as usual.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.periodic.duty import periodic_duty
from awa.storage.db import connection_kwargs
from awa.ui import create_app as create_ui_app
from helpers_lifecycle import Counters, metric_reader
from helpers_ui import browse, text
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn

ERRORS = "awa.cron.schedule_errors"
SCHEDULE = "awa.cron.schedule"


@dataclasses.dataclass
class Report:
    name: str


@pytest.fixture(autouse=True)
def _metrics() -> None:
    metric_reader()  # route awa's counters to an in-memory reader


# Declaring: one table ---------------------------------------------------------------------------

NEVER = r"periodic job 'nightly': cron expression {} never fires: no time in the next 50 years"
BAD_CRON = r"periodic job 'nightly': invalid cron expression: "
BAD_ZONE = r"periodic job 'nightly': invalid timezone: "
BAD_POLICY = r"periodic job 'nightly': invalid cron missed fire policy "

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    # expressions that never fire
    ("30 February", {"cron_expr": "0 0 30 2 *"}, NEVER.format(r"'0 0 30 2 \*'")),
    ("31 April", {"cron_expr": "0 0 31 4 *"}, NEVER.format(r"'0 0 31 4 \*'")),
    ("30 February, 6 fields", {"cron_expr": "0 0 0 30 2 *"}, NEVER.format(r"'0 0 0 30 2 \*'")),
    ("31 February or April", {"cron_expr": "0 0 31 2,4 *"}, NEVER.format(r"'0 0 31 2,4 \*'")),
    ("30 or 31 February", {"cron_expr": "0 0 30-31 2 *"}, NEVER.format(r"'0 0 30-31 2 \*'")),
    # malformed expressions
    ("10,000 characters", {"cron_expr": "* " * 5000}, BAD_CRON + r".* is 10000 characters long"),
    ("NUL", {"cron_expr": "0 0 * * *\x00"}, BAD_CRON + r"'0 0 \* \* \*\\x00' \(expected 5"),
    ("a lone surrogate", {"cron_expr": "0 0 * * \ud800"}, BAD_CRON),
    ("empty", {"cron_expr": ""}, BAD_CRON + r"'' \(expected a non-empty string\)"),
    ("blank", {"cron_expr": "   "}, BAD_CRON + r"'   ' \(expected a non-empty string\)"),
    ("a number", {"cron_expr": 5}, BAD_CRON + r"5 \(expected a non-empty string\)"),
    ("bytes", {"cron_expr": b"* * * * *"}, BAD_CRON + r"b'\* \* \* \* \*' \(expected"),
    ("None", {"cron_expr": None}, BAD_CRON + r"None \(expected"),
    ("a list", {"cron_expr": ["*"] * 5}, BAD_CRON + r"\['\*'"),
    ("minute 61", {"cron_expr": "61 * * * *"}, BAD_CRON + r"'61 \* \* \* \*' \(expected 5"),
    ("seven fields", {"cron_expr": "* * * * * * 2030"}, BAD_CRON),
    # time zones that are not IANA names
    ("an unknown zone", {"timezone": "Nowhere/Land"}, BAD_ZONE + "'Nowhere/Land' is not a known"),
    ("lower case", {"timezone": "utc"}, BAD_ZONE + "'utc' is not a known IANA time zone"),
    ("posix/", {"timezone": "posix/UTC"}, BAD_ZONE + "'posix/UTC' is not a known"),
    ("right/", {"timezone": "right/UTC"}, BAD_ZONE + "'right/UTC' is not a known"),
    ("an absolute path", {"timezone": "/etc/localtime"}, BAD_ZONE + "'/etc/localtime' is not"),
    ("dot-dot", {"timezone": "../zoneinfo/UTC"}, BAD_ZONE + r"'\.\./zoneinfo/UTC' is not"),
    ("NUL in the zone", {"timezone": "UTC\x00"}, BAD_ZONE + r"'UTC\\x00' is not a known"),
    (
        "10,000-character zone",
        {"timezone": "Z" * 10_000},
        BAD_ZONE + r"'ZZZZ.*\.\.\. \(cut\) is not",
    ),
    ("an empty zone", {"timezone": ""}, BAD_ZONE + r"'' \(expected an IANA name such as UTC\)"),
    ("None as zone", {"timezone": None}, BAD_ZONE + r"None \(expected an IANA name"),
    ("a ZoneInfo object", {"timezone": dt.UTC}, BAD_ZONE + r"datetime.timezone.utc \(expected"),
    # names
    ("an empty name", {"name": ""}, "^periodic job name must not be empty$"),
    ("201 characters", {"name": "n" * 201}, "^periodic job name is 201 characters long; the limit"),
    ("10,000 characters", {"name": "n" * 10_000}, "^periodic job name is 10000 characters long"),
    ("NUL in the name", {"name": "a\x00b"}, "^periodic job name contains a NUL byte"),
    ("a lone surrogate", {"name": "a\ud800"}, r"^periodic job name contains a lone surrogate"),
    ("a number as name", {"name": 5}, "^periodic job name must be a string, not int$"),
    ("bytes as name", {"name": b"nightly"}, "^periodic job name must be a string, not bytes$"),
    # the rest of the declaration
    ("a policy", {"missed_fire_policy": "sometimes"}, BAD_POLICY + "'sometimes'"),
    ("None as policy", {"missed_fire_policy": None}, BAD_POLICY + "None"),
    ("args_type not a class", {"args_type": "Report"}, "args_type must be a class, not 'Report'"),
    ("args of another type", {"args": {"name": "x"}}, "args must be an instance of Report, not"),
    ("NUL in args", {"args": Report("a\x00")}, r"args\['name'\] contains a NUL byte"),
    ("priority as text", {"priority": "1"}, "priority must be an integer, not str"),
    ("priority beyond bigint", {"priority": 2**63}, "priority must be between 1 and 4, got"),
    ("max_attempts NaN", {"max_attempts": math.nan}, "max_attempts must be an integer, not float"),
    ("max_attempts 1001", {"max_attempts": 1001}, "max_attempts must be between 1 and 1000"),
    ("an empty queue", {"queue": ""}, "queue must not be empty"),
    ("NUL in the queue", {"queue": "q\x00"}, "queue contains a NUL byte"),
    ("21 tags", {"tags": ["t"] * 21}, "21 tags given; the limit is 20"),
    ("tags as a string", {"tags": "ops"}, "tags must be a list of strings, not str"),
    ("tags as a number", {"tags": 5}, "tags must be a list of strings, not int"),
    ("NaN in metadata", {"metadata": {"a": math.nan}}, r"metadata\['a'\] is NaN or infinite"),
    ("metadata as a list", {"metadata": [1]}, "metadata must be a dict, not list"),
]

# Stored and read back byte for byte (the UI and the CLI escape them; they are bound
# parameters in SQL).
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("a name with slashes", {"name": "../../jobs/1/discard"}),
    ("a name with control characters", {"name": "a\nb\x1b[31mc\u202e"}),
    ("a name like SQL", {"name": "x'); DROP TABLE awa.jobs;--"}),
    ("200 characters", {"name": "é" * 200}),
    ("29 February", {"name": "leap", "cron_expr": "0 0 29 2 *"}),
    ("the fifth Monday of February", {"name": "rare", "cron_expr": "0 0 * 2 1#5"}),
    ("a zone", {"name": "berlin", "timezone": "Europe/Berlin"}),
]


def declaration(**options: Any) -> dict[str, Any]:
    declared: dict[str, Any] = {
        "name": "nightly",
        "cron_expr": "0 3 * * *",
        "args_type": Report,
        "args": Report("x"),
    }
    declared.update(options)
    return declared


@pytest.mark.parametrize(("case", "options", "error"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_a_bad_declaration_names_the_schedule_and_what_is_wrong(
    client: awa.AsyncClient, case: str, options: dict[str, Any], error: str
) -> None:
    with pytest.raises(awa.ValidationError, match=error) as refused:
        client.periodic(**declaration(**options))
    assert isinstance(refused.value, ValueError)
    assert len(str(refused.value)) < 400, "the error repeats the hostile input"
    client.periodic(**declaration())  # nothing was declared under that name


async def test_refused_declarations_store_nothing_and_accepted_ones_round_trip(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Report, queue="reports")
    async def handle(job: awa.Job[Report]) -> None:
        return None

    for _case, options, _error in REFUSED:
        with pytest.raises(awa.ValidationError):
            client.periodic(**declaration(**options))
    for _case, options in ACCEPTED:
        client.periodic(**declaration(**options))
    await start(client, queue("reports"))
    await client.shutdown()
    stored = conn.execute("SELECT name, cron_expr, timezone FROM awa.cron_jobs").fetchall()
    expected = [declaration(**options) for _case, options in ACCEPTED]
    assert sorted(stored) == sorted(
        (each["name"], each["cron_expr"], each.get("timezone", "UTC")) for each in expected
    )
    listed = await client.list_cron_jobs()
    assert [entry.error for entry in listed] == [None] * len(ACCEPTED)
    assert all(entry.next_fire_at is not None for entry in listed)


# At run time: a schedule that cannot fire ----------------------------------------------------

# Stored by SQL (an older version, a hand edit): each sorts before the good schedule, so a
# leader that stopped at the first failure would never reach it.
BROKEN: dict[str, tuple[str, str, str]] = {
    # name: (expression, zone, the error list_cron_jobs() gives)
    "a-never": ("0 0 30 2 *", "UTC", "cron expression '0 0 30 2 *' never fires"),
    "b-gone-zone": ("* * * * *", "Mars/Olympus", "invalid timezone: 'Mars/Olympus' is not"),
    "c-bad-cron": ("61 * * * *", "UTC", "invalid cron expression: '61 * * * *'"),
}
GOOD = "z-tick"


def store_broken(conn: Conn) -> None:
    for name, (expression, zone, _error) in BROKEN.items():
        conn.execute(
            "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, created_at)"
            " VALUES (%s, %s, %s, 'report', 'reports', now() - interval '1 hour')",
            (name, expression, zone),
        )


def fired(conn: Conn, name: str) -> int:
    found = conn.execute(
        "SELECT count(*) FROM awa.jobs WHERE metadata->>'cron_name' = %s", (name,)
    ).fetchone()
    assert found is not None
    return int(found[0])


def cron_errors(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "awa.maintenance"
        and record.levelno == logging.ERROR
        and record.getMessage().startswith(f"periodic job {name!r} cannot fire")
    ]


async def test_a_schedule_that_cannot_fire_never_stops_the_others(
    client: awa.AsyncClient, database_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awa.maintenance")
    store_broken(conn)
    counted = {name: Counters.capture(ERRORS, **{SCHEDULE: name}) for name in BROKEN}

    @client.task(Report, queue="reports")
    async def handle(job: awa.Job[Report]) -> None:
        return None

    client.periodic(GOOD, "* * * * * *", Report, Report("tick"), missed_fire_policy="catch_up")
    await start(client, queue("reports"), cron_interval=0.1)
    try:
        await wait_for(lambda: fired(conn, GOOD) >= 3, 15, message="the good schedule stopped")
        # Several ticks over the broken ones: each tick counts each of them once.
        await wait_for(lambda: min(c.delta() for c in counted.values()) >= 5, 15)
    finally:
        await client.shutdown()

    for name, (_expression, _zone, error) in BROKEN.items():
        assert fired(conn, name) == 0
        [logged] = cron_errors(caplog, name)  # once, across every tick
        assert error in logged, logged
        assert "the other schedules fire" in logged
    listed = {entry.name: entry for entry in await client.list_cron_jobs()}
    for name, (_expression, _zone, error) in BROKEN.items():
        assert listed[name].error is not None
        assert error in listed[name].error
        assert listed[name].next_fire_at is None
    assert listed[GOOD].error is None
    assert listed[GOOD].next_fire_at is not None

    runner = CliRunner()
    as_json = runner.invoke(main, ["--database-url", database_url, "cron", "list", "--json"])
    assert as_json.exit_code == 0, as_json.output
    entries = {entry["name"]: entry for entry in json.loads(as_json.stdout)}
    assert BROKEN["a-never"][2] in entries["a-never"]["error"]
    assert entries["a-never"]["next_fire_at"] is None
    assert entries[GOOD]["error"] is None
    table = runner.invoke(main, ["--database-url", database_url, "cron", "list"])
    assert table.exit_code == 0, table.output
    header, *lines = table.stdout.splitlines()
    assert header.split()[-1] == "ERROR"
    [never] = [line for line in lines if line.startswith("a-never")]
    assert BROKEN["a-never"][2] in never
    [good] = [line for line in lines if line.startswith(GOOD)]
    assert good.rstrip().endswith("-")


class Leader:
    """One cron duty (its logged-once state is its own), run pass by pass on a
    connection, as the leader runs it."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.duty = periodic_duty(1.0)

    async def tick(self, *, in_transaction: bool = False) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.database_url, **connection_kwargs("awa-test-cron")
        ) as conn:
            if in_transaction:
                async with conn.transaction():
                    await self.duty.run(conn)
            else:
                await self.duty.run(conn)


def set_expression(conn: Conn, name: str, expression: str) -> None:
    conn.execute("UPDATE awa.cron_jobs SET cron_expr = %s WHERE name = %s", (expression, name))


async def test_logged_again_only_when_the_error_changes_or_after_it_recovered(
    database_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awa.maintenance")
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue, created_at) VALUES"
        " ('flaky', '0 0 30 2 *', 'report', 'reports', now() - interval '1 hour')"
    )
    counted = Counters.capture(ERRORS, **{SCHEDULE: "flaky"})
    leader = Leader(database_url)
    for _ in range(3):
        await leader.tick()
    assert len(cron_errors(caplog, "flaky")) == 1
    assert counted.delta() == 3

    set_expression(conn, "flaky", "0 0 31 4 *")  # another error: logged
    await leader.tick()
    await leader.tick()
    logged = cron_errors(caplog, "flaky")
    assert len(logged) == 2
    assert "'0 0 31 4 *' never fires" in logged[1]

    set_expression(conn, "flaky", "* * * * *")  # fixed: it fires, and says so once
    await leader.tick()
    await leader.tick()
    assert fired(conn, "flaky") == 1
    recovered = [r.getMessage() for r in caplog.records if "fires again" in r.getMessage()]
    assert recovered == ["periodic job 'flaky' fires again"]

    set_expression(conn, "flaky", "0 0 30 2 *")  # broken again: logged again
    await leader.tick()
    assert len(cron_errors(caplog, "flaky")) == 3
    assert counted.delta() == 6


async def test_a_fire_the_database_refuses_rolls_back_that_schedule_only(
    database_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule whose job the database refuses (args stored as an array by hand) fails
    at its fire: its own fires roll back, its last fire stays, and the other schedule's
    fires commit, even when the leader's pass runs inside one transaction (a savepoint
    per schedule)."""
    caplog.set_level(logging.INFO, logger="awa.maintenance")
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, kind, queue, args, missed_fire_policy,"
        " created_at) VALUES"
        " ('a-array-args', '* * * * *', 'report', 'reports', '[1]', 'catch_up',"
        "  now() - interval '5 minutes'),"
        " ('b-minutely', '* * * * *', 'report', 'reports', '{}', 'catch_up',"
        "  now() - interval '5 minutes')"
    )
    counted = Counters.capture(ERRORS, **{SCHEDULE: "a-array-args"})
    leader = Leader(database_url)
    await leader.tick(in_transaction=True)
    assert fired(conn, "a-array-args") == 0
    assert fired(conn, "b-minutely") >= 5  # every minute missed since it was stored
    assert cron_errors(caplog, "b-minutely") == []
    await leader.tick()
    assert fired(conn, "a-array-args") == 0
    last = conn.execute(
        "SELECT last_enqueued_at FROM awa.cron_jobs WHERE name = 'a-array-args'"
    ).fetchone()
    assert last == (None,)
    [logged] = cron_errors(caplog, "a-array-args")
    assert "CheckViolation" in logged
    assert "jobs_args_object" in logged
    assert counted.delta() == 2


async def test_the_schedules_page_marks_a_schedule_that_cannot_fire(
    client: awa.AsyncClient, conn: Conn
) -> None:
    store_broken(conn)
    async with browse(create_ui_app(client)) as http:
        page = await http.get("/schedules")
    assert page.status_code == 200, page.text
    shown = text(page)
    for _name, (_expression, _zone, error) in BROKEN.items():
        assert f"cannot fire {error}" in shown, shown
