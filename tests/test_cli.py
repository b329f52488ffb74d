"""The `awa` command against the real database: output, exit codes and the rows afterwards."""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg.types.json import Jsonb

import awa
from awa.cli import CliError, client_from_context, json_option, main, print_json, print_table
from awa.sql import current_version
from awa.storage.db import check_database_url, mask_password

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


@dataclasses.dataclass
class SendEmail:
    to: str


@dataclasses.dataclass
class Resize:
    width: int


def awa_cli(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
    runner = CliRunner()
    prefix = ["--database-url", url] if url is not None else []
    return runner.invoke(main, [*prefix, *args], env=env, catch_exceptions=False)


def ok(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Result:
    result = awa_cli(*args, url=url, env=env)
    assert result.exit_code == 0, result.output
    return result


def error_line(result: Result) -> str:
    """The single stderr line of a failed command (exit code 1, no traceback)."""
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def usage_line(result: Result) -> str:
    """The single stderr line of a command given bad input (exit code 2, no usage text)."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def set_state(conn: psycopg.Connection[Any], job_id: int, state: str, **columns: Any) -> None:
    assignments = ", ".join(f"{name} = %({name})s" for name in columns)
    sql = f"UPDATE awa.jobs SET state = %(state)s{', ' if columns else ''}{assignments} "
    conn.execute(sql + "WHERE id = %(id)s", {"state": state, "id": job_id, **columns})


def job_state(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    row = conn.execute("SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


# migrate -----------------------------------------------------------------------------------


def test_migrate_sql_needs_no_database() -> None:
    result = ok("migrate", "--sql", env={"DATABASE_URL": UNREACHABLE})
    assert "CREATE TABLE awa.jobs" in result.stdout
    assert result.stdout.rstrip().endswith("COMMIT;")
    assert result.stderr == ""


def test_migrate_sql_and_json_is_a_usage_error() -> None:
    result = awa_cli("migrate", "--sql", "--json", url=UNREACHABLE)
    assert result.exit_code == 2
    assert "cannot be combined" in result.stderr


def test_migrate_fresh_database_then_again(fresh_database: str) -> None:
    first = ok("migrate", url=fresh_database)
    assert first.stdout.startswith("applied migration(s) 1")
    assert f"version {current_version()}" in first.stdout
    with psycopg.connect(fresh_database) as conn:
        assert conn.execute("SELECT to_regclass('awa.jobs') IS NOT NULL").fetchone() == (True,)

    again = ok("migrate", url=fresh_database)
    assert again.stdout == f"the schema is up to date (version {current_version()})\n"
    as_json = json.loads(ok("migrate", "--json", url=fresh_database).stdout)
    assert as_json == {"applied": [], "version": current_version()}


def test_unmigrated_database_says_to_migrate(fresh_database: str) -> None:
    line = error_line(awa_cli("job", "list", url=fresh_database))
    assert "awa migrate" in line


# job list / get ----------------------------------------------------------------------------


def test_job_list_table_and_filters(sync_client: awa.Client, database_url: str) -> None:
    email = sync_client.insert(SendEmail("a@example.com"), queue="mail")
    resize = sync_client.insert(Resize(64), priority=1, max_attempts=3)

    table = ok("job", "list", url=database_url).stdout.splitlines()
    assert table[0].split() == ["ID", "KIND", "QUEUE", "STATE", "ATTEMPT/MAX", "PRIORITY", "RUN_AT"]
    assert table[1].split()[:6] == [str(resize.id), "resize", "default", "available", "0/3", "1"]
    assert table[2].split()[:5] == [str(email.id), "send_email", "mail", "available", "0/25"]
    run_at = table[2].split()[6]
    assert dt.datetime.fromisoformat(run_at) == email.run_at.replace(microsecond=0)

    by_queue = ok("job", "list", "--queue", "mail", url=database_url).stdout
    assert "send_email" in by_queue
    assert "resize" not in by_queue
    by_kind = ok("job", "list", "--kind", "resize", url=database_url).stdout
    assert "resize" in by_kind
    assert "send_email" not in by_kind
    assert ok("job", "list", "--state", "failed", url=database_url).stdout == "no jobs found\n"
    # State names are case-insensitive.
    assert "resize" in ok("job", "list", "--state", "AVAILABLE", url=database_url).stdout


def test_job_list_limit_says_there_may_be_more(sync_client: awa.Client, database_url: str) -> None:
    newest = sync_client.insert_many([SendEmail("a"), SendEmail("b")])[-1]
    result = ok("job", "list", "--limit", "1", url=database_url)
    assert len(result.stdout.splitlines()) == 2
    assert result.stdout.splitlines()[1].split()[0] == str(newest.id)
    assert "--limit" in result.stderr


def test_job_list_json(sync_client: awa.Client, database_url: str) -> None:
    job = sync_client.insert(SendEmail("a@example.com"), tags=["x"], unique_opts={})
    rows = json.loads(ok("job", "list", "--json", url=database_url).stdout)
    assert [row["id"] for row in rows] == [job.id]
    row = rows[0]
    assert row["state"] == "available"
    assert row["args"] == {"to": "a@example.com"}
    assert row["tags"] == ["x"]
    assert job.unique_key is not None
    assert row["unique_key"] == job.unique_key.hex()
    assert dt.datetime.fromisoformat(row["run_at"]) == job.run_at


def test_job_list_rejects_bad_state_and_limit(database_url: str) -> None:
    result = awa_cli("job", "list", "--state", "exploded", url=database_url)
    assert result.exit_code == 2
    assert "Invalid value for '--state'" in result.stderr
    assert awa_cli("job", "list", "--limit", "0", url=database_url).exit_code == 2


def test_job_get_human(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = sync_client.insert(
        SendEmail("a@example.com"), metadata={"tenant": "acme"}, ordering_key=b"\x01\xff"
    )
    errors = [
        {"error": "smtp timeout", "attempt": 1, "at": "2024-05-01T12:00:00+00:00"},
        {"error": "bad address", "attempt": 2, "at": "2024-05-01T12:01:00+00:00", "terminal": True},
    ]
    set_state(conn, job.id, "failed", attempt=2, errors=Jsonb(errors), progress=Jsonb({"pct": 50}))

    text = ok("job", "get", str(job.id), url=database_url).stdout
    assert f"id               {job.id}\n" in text
    assert "state            failed\n" in text
    assert "attempt          2/25\n" in text
    assert "ordering key     01ff\n" in text
    assert '"tenant": "acme"' in text
    assert '"pct": 50' in text
    assert '"to": "a@example.com"' in text
    assert "errors (2):" in text
    assert "attempt 1 at 2024-05-01T12:00:00Z:\n      smtp timeout" in text
    assert "attempt 2 at 2024-05-01T12:01:00Z (terminal):\n      bad address" in text


def test_job_get_json_is_the_full_row(sync_client: awa.Client, database_url: str) -> None:
    job = sync_client.insert(SendEmail("a@example.com"), deadline_duration=90)
    row = json.loads(ok("job", "get", str(job.id), "--json", url=database_url).stdout)
    assert set(row) == {field.name for field in dataclasses.fields(awa.JobRow)}
    assert row["id"] == job.id
    assert row["state"] == "available"
    assert row["deadline_duration"] == 90.0
    assert dt.datetime.fromisoformat(row["created_at"]) == job.created_at
    assert row["errors"] == []
    assert row["finalized_at"] is None


def test_job_get_unknown_id(database_url: str) -> None:
    assert error_line(awa_cli("job", "get", "99", url=database_url)) == "error: job 99 not found"


@pytest.mark.parametrize("command", ["get", "cancel", "retry"])
@pytest.mark.parametrize("bad", ["-5", "0", "-0", "seven", "1.5", ""])
def test_job_id_must_be_a_positive_integer(
    command: str, bad: str, sync_client: awa.Client, database_url: str
) -> None:
    job = sync_client.insert(SendEmail("a"))
    line = usage_line(awa_cli("job", command, bad, "--json", url=database_url))
    assert line == f"error: job id must be a positive integer, not {bad or repr(bad)}"
    assert sync_client.get_job(job.id).state is awa.JobState.AVAILABLE  # type: ignore[union-attr]


def test_job_id_argument_keeps_options_working(sync_client: awa.Client, database_url: str) -> None:
    job = sync_client.insert(SendEmail("a"))
    for args in (["--json", str(job.id)], [str(job.id), "--json"], ["--json", f"+{job.id}"]):
        assert json.loads(ok("job", "get", *args, url=database_url).stdout)["id"] == job.id
    assert usage_line(awa_cli("job", "get", "--jsn", url=database_url)) == (
        "error: no such option: --jsn"
    )


# job cancel / retry ------------------------------------------------------------------------


def test_job_cancel(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = sync_client.insert(SendEmail("a"))
    result = ok("job", "cancel", str(job.id), url=database_url)
    assert result.stdout == f"job {job.id} is now cancelled\n"
    assert job_state(conn, job.id) == "cancelled"

    other = sync_client.insert(SendEmail("b"))
    row = json.loads(ok("job", "cancel", str(other.id), "--json", url=database_url).stdout)
    assert row["id"] == other.id
    assert row["state"] == "cancelled"
    assert row["finalized_at"] is not None


def test_job_cancel_ineligible_or_unknown(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = sync_client.insert(SendEmail("a"))
    set_state(conn, job.id, "completed", finalized_at=dt.datetime.now(dt.UTC))
    line = error_line(awa_cli("job", "cancel", str(job.id), url=database_url))
    assert line == f"error: job {job.id} is completed; only unfinished jobs can be cancelled"
    assert job_state(conn, job.id) == "completed"
    assert error_line(awa_cli("job", "cancel", "99", url=database_url)) == (
        "error: job 99 not found"
    )


def test_job_retry(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = sync_client.insert(SendEmail("a"), max_attempts=3)
    set_state(conn, job.id, "failed", attempt=3, finalized_at=dt.datetime.now(dt.UTC))
    result = ok("job", "retry", str(job.id), url=database_url)
    assert result.stdout == f"job {job.id} is now available; it runs again with up to 3 attempts\n"
    row = conn.execute("SELECT state::text, attempt FROM awa.jobs WHERE id = %s", (job.id,))
    assert row.fetchone() == ("available", 0)

    line = error_line(awa_cli("job", "retry", str(job.id), url=database_url))
    assert line == (
        f"error: job {job.id} is available; "
        "only failed, cancelled or waiting_external jobs can be retried"
    )
    assert error_line(awa_cli("job", "retry", "99", url=database_url)) == (
        "error: job 99 not found"
    )

    set_state(conn, job.id, "cancelled")
    row_json = json.loads(ok("job", "retry", str(job.id), "--json", url=database_url).stdout)
    assert row_json["state"] == "available"


def test_job_retry_failed(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    emails = sync_client.insert_many([SendEmail("a"), SendEmail("b")], queue="mail")
    resize = sync_client.insert(Resize(1), queue="mail")
    for job in [*emails, resize]:
        set_state(conn, job.id, "failed")

    result = ok("job", "retry-failed", "--kind", "send_email", url=database_url)
    assert result.stdout == "retried 2 failed job(s) of kind send_email\n"
    assert [job_state(conn, job.id) for job in emails] == ["available", "available"]
    assert job_state(conn, resize.id) == "failed"

    out = json.loads(
        ok("job", "retry-failed", "--queue", "mail", "--json", url=database_url).stdout
    )
    assert out == {"retried": 1, "job_ids": [resize.id]}
    assert job_state(conn, resize.id) == "available"


@pytest.mark.parametrize("filters", [[], ["--kind", "a", "--queue", "b"]])
def test_job_retry_failed_needs_exactly_one_filter(filters: list[str]) -> None:
    # Checked before connecting: the unreachable URL is never tried.
    result = awa_cli("job", "retry-failed", *filters, url=UNREACHABLE)
    assert result.exit_code == 2
    assert "give exactly one of --kind or --queue" in result.stderr
    assert "cannot connect" not in result.output


def test_job_discard(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    doomed = sync_client.insert(SendEmail("a"))
    waiting = sync_client.insert(SendEmail("b"))
    other = sync_client.insert(Resize(1))
    set_state(conn, doomed.id, "failed")
    set_state(conn, other.id, "failed")

    result = ok("job", "discard", "--kind", "send_email", url=database_url)
    assert result.stdout == "deleted 1 failed job(s) of kind send_email\n"
    assert job_state(conn, doomed.id) is None
    assert job_state(conn, waiting.id) == "available"
    assert job_state(conn, other.id) == "failed"

    out = json.loads(ok("job", "discard", "--kind", "resize", "--json", url=database_url).stdout)
    assert out == {"discarded": 1, "kind": "resize"}
    assert awa_cli("job", "discard", url=database_url).exit_code == 2


# queues ------------------------------------------------------------------------------------


def test_queue_stats(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    assert ok("queue", "stats", url=database_url).stdout == "no queues yet\n"
    mail = sync_client.insert_many([SendEmail("a"), SendEmail("b"), SendEmail("c")], queue="mail")
    set_state(conn, mail[0].id, "failed")
    set_state(conn, mail[1].id, "running")
    set_state(
        conn, mail[2].id, "available", run_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=90)
    )
    sync_client.insert(Resize(1))
    sync_client.pause_queue("default", paused_by="ops")
    sync_client.pause_queue("idle", paused_by="ops")  # a queue with no jobs at all

    lines = ok("queue", "stats", url=database_url).stdout.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "AVAILABLE",
        "RUNNING",
        "SCHEDULED",
        "RETRYABLE",
        "WAITING",
        "FAILED",
        "OLDEST",
        "AVAILABLE",
        "PAUSED",
    ]
    assert lines[1].split()[:7] == ["default", "1", "0", "0", "0", "0", "0"]
    assert lines[1].endswith("yes (by ops)")
    assert lines[2].split() == ["idle", "0", "0", "0", "0", "0", "0", "-", "yes", "(by", "ops)"]
    assert lines[3].split()[:7] == ["mail", "1", "1", "0", "0", "0", "1"]
    assert lines[3].split()[7] == "1m"  # 90 seconds and counting
    assert lines[3].endswith(" no")

    stats = {
        entry["queue"]: entry
        for entry in json.loads(ok("queue", "stats", "--json", url=database_url).stdout)
    }
    assert stats["mail"]["counts"] == {
        "scheduled": 0,
        "available": 1,
        "running": 1,
        "completed": 0,
        "retryable": 0,
        "failed": 1,
        "cancelled": 0,
        "waiting_external": 0,
        "blocked": 0,
    }
    assert stats["mail"]["total"] == 3
    assert stats["mail"]["paused"] is False
    assert 89 <= stats["mail"]["oldest_available_age"] < 200
    assert dt.datetime.fromisoformat(stats["mail"]["oldest_available_at"]).tzinfo is not None
    assert stats["idle"]["oldest_available_age"] is None
    assert stats["idle"]["oldest_available_at"] is None
    assert stats["default"]["paused"] is True
    assert stats["default"]["paused_by"] == "ops"


def test_queue_pause_and_resume(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    sync_client.insert(SendEmail("a"), queue="mail")
    result = ok("queue", "pause", "mail", "--by", "alice", url=database_url)
    assert result.stdout == "queue mail paused by alice\n"
    row = conn.execute("SELECT paused, paused_by FROM awa.queues WHERE queue = 'mail'")
    assert row.fetchone() == (True, "alice")

    assert ok("queue", "resume", "mail", url=database_url).stdout == "queue mail resumed\n"
    row = conn.execute("SELECT paused FROM awa.queues WHERE queue = 'mail'")
    assert row.fetchone() == (False,)
    # Without --by, the pause is signed with the operator's user name.
    paused = json.loads(ok("queue", "pause", "mail", "--json", url=database_url).stdout)
    assert paused["paused_by"] == getpass.getuser()
    assert paused["paused"] is True
    assert paused["queue"] == "mail"
    assert paused["known"] is True
    assert conn.execute("SELECT paused FROM awa.queues").fetchone() == (True,)


def test_queue_pause_ahead_of_its_first_job_says_to_check_the_name(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    sync_client.insert(SendEmail("a"), queue="mail")
    result = ok("queue", "pause", "mial", "--by", "alice", url=database_url)
    assert result.stdout == (
        "queue mial paused by alice (no job has used this queue yet; check the name)\n"
    )
    row = conn.execute("SELECT paused, paused_by FROM awa.queues WHERE queue = 'mial'")
    assert row.fetchone() == (True, "alice")  # paused all the same
    fresh = json.loads(ok("queue", "pause", "sms", "--json", url=database_url).stdout)
    assert fresh["known"] is False
    assert fresh["paused"] is True
    # Once paused (a row in awa.queues) the queue is known, jobs or not.
    again = json.loads(ok("queue", "pause", "sms", "--json", url=database_url).stdout)
    assert again["known"] is True
    assert "check the name" not in ok("queue", "pause", "mial", url=database_url).stdout


def test_queue_resume_when_not_paused(database_url: str) -> None:
    assert ok("queue", "resume", "mail", url=database_url).stdout == "queue mail was not paused\n"
    ok("queue", "pause", "mail", url=database_url)
    ok("queue", "resume", "mail", url=database_url)
    again = ok("queue", "resume", "mail", "--json", url=database_url).stdout
    assert json.loads(again) == {"queue": "mail", "paused": False, "was_paused": False}


def test_queue_pause_rejects_bad_name(database_url: str) -> None:
    line = usage_line(awa_cli("queue", "pause", "x" * 201, url=database_url))
    assert "Invalid value for 'QUEUE': queue is 201 characters long" in line


def test_queue_drain(
    sync_client: awa.Client, database_url: str, conn: psycopg.Connection[Any]
) -> None:
    waiting = sync_client.insert_many([SendEmail("a"), SendEmail("b")], queue="mail")
    running = sync_client.insert(SendEmail("c"), queue="mail")
    set_state(conn, running.id, "running")
    elsewhere = sync_client.insert(SendEmail("d"))

    result = ok("queue", "drain", "mail", url=database_url)
    assert result.stdout == "cancelled 2 job(s) in queue mail\n"
    assert [job_state(conn, job.id) for job in waiting] == ["cancelled", "cancelled"]
    assert job_state(conn, running.id) == "running"
    assert job_state(conn, elsewhere.id) == "available"
    out = json.loads(ok("queue", "drain", "mail", "--json", url=database_url).stdout)
    assert out == {"queue": "mail", "cancelled": 0}


# database and errors -----------------------------------------------------------------------


def test_db_url_reads_env_and_option_overrides() -> None:
    env_url = "postgresql://someone@db.example:5432/app"
    assert ok("db", "url", env={"DATABASE_URL": env_url}).stdout == env_url + "\n"
    result = ok("db", "url", "--json", url="postgresql://other/x", env={"DATABASE_URL": env_url})
    assert json.loads(result.stdout) == {"database_url": "postgresql://other/x"}


def test_db_url_masks_the_password() -> None:
    url = "postgresql://app:s3cret@db.example:5432/app?sslmode=require"
    assert ok("db", "url", url=url).stdout == (
        "postgresql://app:***@db.example:5432/app?sslmode=require\n"
    )
    assert ok("db", "url", "--show-password", url=url).stdout == url + "\n"
    conninfo = "host=db.example user=app password='s3 cret' dbname=app"
    masked = json.loads(ok("db", "url", "--json", env={"DATABASE_URL": conninfo}).stdout)
    assert masked == {"database_url": "host=db.example user=app password=*** dbname=app"}
    in_query = "postgresql://app@db.example/app?password=s3cret&sslmode=require"
    assert ok("db", "url", url=in_query).stdout == (
        "postgresql://app@db.example/app?password=***&sslmode=require\n"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://app:pw@h/db", "postgresql://app:***@h/db"),
        ("postgres://:pw@h1:5432,h2:5433/db#x", "postgres://:***@h1:5432,h2:5433/db#x"),
        ("postgresql://app:p%40ss@h/db?password=x", "postgresql://app:***@h/db?password=***"),
        ("postgresql://app@h/db", "postgresql://app@h/db"),
        (
            "postgresql://postgres:@/postgres?host=/run",
            "postgresql://postgres:@/postgres?host=/run",
        ),
        ("host=h password=pw dbname=d", "host=h password=*** dbname=d"),
        ("host=h password = 'a b\\'c' dbname=d", "host=h password = *** dbname=d"),
        ("host=h dbname=d", "host=h dbname=d"),
        ("", ""),
    ],
)
def test_mask_password(url: str, expected: str) -> None:
    assert mask_password(url) == expected


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///jobs.db", "postgresql+psycopg://h/db"])
def test_non_postgres_url_is_one_error_line(url: str, database_url: str) -> None:
    scheme = url.split("://")[0]
    accepted = (
        "use postgresql://..., postgres://..., or a libpq key=value conninfo string such as "
        "'host=localhost dbname=app'"
    )
    line = error_line(awa_cli("job", "list", url=url))
    assert line == (
        f"error: --database-url: the database URL starts with {scheme}://, which is not a "
        f"PostgreSQL URL; {accepted}"
    )
    from_env = error_line(awa_cli("queue", "stats", env={"DATABASE_URL": url}))
    assert from_env.startswith(f"error: DATABASE_URL: the database URL starts with {scheme}://")
    assert error_line(awa_cli("db", "url", env={"DATABASE_URL": url})) == from_env
    # The option overrides the variable, and libpq's key=value form is accepted.
    conninfo = psycopg.conninfo.make_conninfo(database_url)
    assert "://" not in conninfo
    assert ok("job", "list", url=conninfo, env={"DATABASE_URL": url}).stdout == "no jobs found\n"


def test_check_database_url() -> None:
    for good in ("postgresql://h/db", "postgres://h", "host=h dbname=d", "", "dbname=x"):
        assert check_database_url(good) == good
    with pytest.raises(awa.ValidationError, match="scheme in lower case"):
        check_database_url("POSTGRES://h")
    with pytest.raises(awa.ValidationError, match="neither a PostgreSQL URL nor a valid key="):
        check_database_url("localhost")
    with pytest.raises(awa.ValidationError, match=r"not a valid PostgreSQL URL .*%zz"):
        check_database_url("postgresql://h/db?%zz")
    # The message never quotes a token that may be the password.
    with pytest.raises(awa.ValidationError) as raised:
        check_database_url("user=bob password=pass word")
    assert "word" not in str(raised.value).replace("password", "")
    with pytest.raises(awa.ValidationError) as raised:
        check_database_url("mysql://root:hunter2@h/db")
    assert "hunter2" not in str(raised.value)


def test_unreachable_database_is_one_error_line() -> None:
    line = error_line(awa_cli("queue", "stats", url=UNREACHABLE))
    assert line.startswith("error: cannot connect to the database: ")


def test_help_lists_commands() -> None:
    text = ok("--help").stdout
    for command in ("migrate", "job", "queue", "db"):
        assert command in text
    job_help = ok("job", "--help").stdout
    for command in ("list", "get", "cancel", "retry", "retry-failed", "discard"):
        assert command in job_help


@pytest.fixture
def extra_command() -> Iterator[None]:
    """A command written the way later command modules are, using only the public helpers."""

    @main.command("test-extra")
    @click.option("--fail", "should_fail", is_flag=True)
    @json_option
    @click.pass_context
    def extra(ctx: click.Context, should_fail: bool, as_json: bool) -> None:
        if should_fail:
            raise CliError("it went\nwrong")
        jobs = client_from_context(ctx).list_jobs()
        if as_json:
            print_json({"count": len(jobs), "jobs": jobs})
        else:
            print_table(["ID", "NOTE"], [(row.id, None) for row in jobs])

    yield
    del main.commands["test-extra"]


@pytest.mark.usefixtures("extra_command")
def test_helpers_for_command_modules(sync_client: awa.Client, database_url: str) -> None:
    job = sync_client.insert(SendEmail("a"))
    assert ok("test-extra", url=database_url).stdout.splitlines()[1].split() == [str(job.id), "-"]
    out = json.loads(ok("test-extra", "--json", url=database_url).stdout)
    assert out["count"] == 1
    assert out["jobs"][0]["state"] == "available"
    assert error_line(awa_cli("test-extra", "--fail", url=database_url)) == "error: it went wrong"


# the installed command ---------------------------------------------------------------------


def _run(command: list[str], database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_console_script_reads_database_url(sync_client: awa.Client, database_url: str) -> None:
    script = Path(sys.executable).with_name("awa")
    assert script.exists(), "the awa console script is not installed next to this interpreter"
    job = sync_client.insert(SendEmail("a"))
    done = _run([str(script), "job", "list", "--json"], database_url)
    assert done.returncode == 0, done.stderr
    assert [row["id"] for row in json.loads(done.stdout)] == [job.id]

    missing = _run([str(script), "job", "get", "99"], database_url)
    assert (missing.returncode, missing.stdout, missing.stderr) == (
        1,
        "",
        "error: job 99 not found\n",
    )
    negative = _run([str(script), "job", "get", "-5"], database_url)
    assert (negative.returncode, negative.stdout, negative.stderr) == (
        2,
        "",
        "error: job id must be a positive integer, not -5\n",
    )


def test_module_entry_point(database_url: str) -> None:
    done = _run([sys.executable, "-m", "awa.cli", "db", "url"], database_url)
    assert (done.returncode, done.stdout) == (0, database_url + "\n")
