"""Hostile input on the ``awa`` command line: every bad value of every option or argument
is a usage error, one ``error:`` line naming the option (exit code 2, no traceback), before
anything reaches the database; every awa table is unchanged. Stored names that look like
paths or carry terminal escapes are printed escaped, never interpreted.

``CLI_ROWS`` has one row per option (helpers_hostile.Row); a new option gets its cases by
adding a row. Commands run in-process through click's CliRunner, as in test_cli.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from click.testing import CliRunner, Result

import awa
from awa.cli import main
from helpers_hostile import Row, assert_names, cases, row, snapshot
from jobs_helpers import Conn, set_state

CALLBACK = "00000000-0000-0000-0000-000000000001"
UUID = "00000000-0000-0000-0000-000000000002"

# Bad values as they arrive on a command line (strings; a byte that is not UTF-8 arrives
# as a lone surrogate).
CLI_IDS: dict[str, str] = {
    "beyond-bigint": str(2**63),
    "zero": "0",
    "negative": "-5",
    "nan": "nan",
    "float": "1.5",
    "5000-digits": "9" * 5000,
    "empty": "",
}
CLI_LIMITS: dict[str, str] = {
    "zero": "0",
    "negative": "-1",
    "1001": "1001",
    "beyond-bigint": str(2**63),
    "nan": "nan",
    "float": "10.5",
    "word": "ten",
}
CLI_NAMES: dict[str, str] = {
    "empty": "",
    "nul": "a\x00b",
    "not-utf8": "a\udcff",
    "10000-chars": "x" * 10_000,
}
CLI_TEXT: dict[str, str] = {"nul": "a\x00b", "not-utf8": "a\udcff", "10000-chars": "x" * 10_000}
CLI_SECONDS: dict[str, str] = {
    "nan": "nan",
    "inf": "inf",
    "negative": "-1",
    "beyond-100-years": "1e300",
    "word": "soon",
}
CLI_LEASES: dict[str, str] = {"beyond-bigint": str(2**63), "negative": "-1", "word": "x"}
CLI_UUIDS: dict[str, str] = {"word": "nope", "not-utf8": "a\udcff", "10000-chars": "x" * 10_000}


def argv(*head: str) -> Any:
    """A row's call: the command line with the bad value appended (or put where ``{}``
    stands)."""

    def build(_: Any, value: str) -> list[str]:
        if "{}" in head:
            return [value if part == "{}" else part for part in head]
        return [*head, value]

    return build


CLI_ROWS: list[Row] = [
    row("job get ID", "job id", CLI_IDS, argv("job", "get")),
    row("job cancel ID", "job id", CLI_IDS, argv("job", "cancel")),
    row("job retry ID", "job id", CLI_IDS, argv("job", "retry")),
    row("job list --limit", "'--limit'", CLI_LIMITS, argv("job", "list", "--limit")),
    row("job list --kind", "'--kind'", CLI_NAMES, argv("job", "list", "--kind")),
    row("job list --queue", "'--queue'", CLI_NAMES, argv("job", "list", "--queue")),
    row("job list --state", "'--state'", CLI_NAMES, argv("job", "list", "--state")),
    row("job retry-failed --kind", "'--kind'", CLI_NAMES, argv("job", "retry-failed", "--kind")),
    row("job retry-failed --queue", "'--queue'", CLI_NAMES, argv("job", "retry-failed", "--queue")),
    row("job discard --kind", "'--kind'", CLI_NAMES, argv("job", "discard", "--kind")),
    row("job kinds KIND", "'[KIND]'", CLI_NAMES, argv("job", "kinds")),
    row("queue pause QUEUE", "'QUEUE'", CLI_NAMES, argv("queue", "pause")),
    row("queue pause --by", "'--by'", CLI_TEXT, argv("queue", "pause", "q", "--by")),
    row("queue resume QUEUE", "'QUEUE'", CLI_NAMES, argv("queue", "resume")),
    row("queue drain QUEUE", "'QUEUE'", CLI_NAMES, argv("queue", "drain")),
    row("queue descriptors QUEUE", "'[QUEUE]'", CLI_NAMES, argv("queue", "descriptors")),
    row("dlq list --limit", "'--limit'", CLI_LIMITS, argv("dlq", "list", "--limit")),
    row("dlq list --before-id", "job id", CLI_IDS, argv("dlq", "list", "--before-id")),
    row("dlq list --kind", "'--kind'", CLI_NAMES, argv("dlq", "list", "--kind")),
    row("dlq list --queue", "'--queue'", CLI_NAMES, argv("dlq", "list", "--queue")),
    row(
        "dlq list --tag",
        "'--tag'",
        CLI_NAMES,
        argv("dlq", "list", "--tag"),
        skip=["empty", "10000-chars"],  # tags have no length limit: a filter matching none
    ),
    row("dlq get ID", "job id", CLI_IDS, argv("dlq", "get")),
    row("dlq retry ID", "job id", CLI_IDS, argv("dlq", "retry")),
    row("dlq retry --to-queue", "'--to-queue'", CLI_NAMES, argv("dlq", "retry", "1", "--to-queue")),
    row("dlq retry --queue", "'--queue'", CLI_NAMES, argv("dlq", "retry", "--queue")),
    row("dlq purge ID", "job id", CLI_IDS, argv("dlq", "purge")),
    row("dlq purge --queue", "'--queue'", CLI_NAMES, argv("dlq", "purge", "--queue")),
    row(
        "dlq purge --before",
        "ISO 8601",
        {"word": "yesterday", "year-10000": "10000-01-01T00:00:00Z"},
        argv("dlq", "purge", "--all", "--before"),
    ),
    row("dlq depth --queue", "'--queue'", CLI_NAMES, argv("dlq", "depth", "--queue")),
    row("callback complete ID", "callback id", CLI_UUIDS, argv("callback", "complete")),
    row(
        "callback complete --run-lease",
        "'--run-lease'",
        CLI_LEASES,
        argv("callback", "complete", CALLBACK, "--run-lease"),
    ),
    row(
        "callback fail --error",
        "error",
        {"nul": "a\x00b", "not-utf8": "a\udcff"},
        argv("callback", "fail", CALLBACK, "--error"),
    ),
    row(
        "callback heartbeat --timeout",
        "'--timeout'",
        CLI_SECONDS,
        argv("callback", "heartbeat", CALLBACK, "--timeout"),
    ),
    row(
        "callback resolve --run-lease",
        "'--run-lease'",
        CLI_LEASES,
        argv("callback", "resolve", CALLBACK, "--run-lease"),
    ),
    row("workflow get ID", "workflow id", CLI_UUIDS, argv("workflow", "get")),
    row("workflow cancel ID", "workflow id", CLI_UUIDS, argv("workflow", "cancel")),
    row(
        "health --unserved-after",
        "'--unserved-after'",
        CLI_SECONDS,
        argv("health", "--unserved-after"),
    ),
]


def run(url: str, args: list[str]) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=True)


@pytest.fixture
def seeded(sync_client: awa.Client, conn: Conn) -> None:
    sync_client.insert(Note("waiting"), queue="q", kind="k")
    failed = sync_client.insert(Note("failed"), queue="q", kind="k")
    set_state(conn, failed.id, "failed")
    sync_client.pause_queue("paused", paused_by="seed")


@dataclasses.dataclass
class Note:
    text: str = "x"


@pytest.mark.parametrize(("entry", "value"), list(cases(CLI_ROWS)))
def test_bad_options_are_usage_errors_naming_the_option(
    database_url: str, conn: Conn, seeded: None, entry: Row, value: str
) -> None:
    before = snapshot(conn)
    result = run(database_url, entry.call(None, value))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback: {result.exception!r}"
    )
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert_names(ValueError(lines[0]), entry.field)
    assert snapshot(conn) == before


def test_limits_at_their_bounds_are_accepted(database_url: str, seeded: None) -> None:
    """The table's control: the bounds themselves pass (a test of the limits, not of a
    command that refuses everything)."""
    for args in (
        ["job", "list", "--limit", "1"],
        ["job", "list", "--limit", "1000"],
        ["dlq", "list", "--limit", "1000"],
        ["job", "get", str(2**63 - 1)],  # a valid id that names no job: exit 1, not 2
    ):
        result = run(database_url, args)
        assert result.exit_code in (0, 1), (args, result.output)
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "name",
    ["../../jobs/1/discard", "a/b", "bell\x07\x1b[31mred", "two\nlines", "x\u202eevil"],
    ids=["dotdot", "slash", "escape", "newline", "rtl-override"],
)
def test_odd_stored_names_are_printed_escaped_and_acted_on_exactly(
    database_url: str, sync_client: awa.Client, conn: Conn, seeded: None, name: str
) -> None:
    job = sync_client.insert(Note(), queue=name, kind=name)
    paused = run(database_url, ["queue", "pause", name, "--by", "ops"])
    assert paused.exit_code == 0, paused.output
    rows = conn.execute("SELECT queue FROM awa.queues WHERE paused_at IS NOT NULL").fetchall()
    assert sorted(queue for (queue,) in rows) == sorted(["paused", name])
    listed = run(database_url, ["job", "list", "--queue", name])
    assert listed.exit_code == 0, listed.output
    shown = listed.stdout
    assert "\x1b" not in shown
    assert "\u202e" not in shown
    # One header and one row: a newline in the name cannot add a line.
    assert len(shown.splitlines()) == 2, shown
    described = run(database_url, ["job", "get", str(job.id)]).stdout
    assert "\x1b" not in described
    assert "\x07" not in described
    # The job of another queue is untouched.
    assert conn.execute("SELECT count(*) FROM awa.jobs WHERE state = 'available'").fetchone() == (
        2,
    )
