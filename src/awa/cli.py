"""The ``awa`` operator command: migrations, jobs, queues.

Command modules added later plug into the same group and reuse its helpers::

    from awa.cli import client_from_context, json_option, main, print_json, print_table

    @main.command()
    @json_option
    @click.pass_context
    def health(ctx: click.Context, as_json: bool) -> None:
        \"\"\"Say whether the queue is healthy.\"\"\"
        stats = client_from_context(ctx).queue_stats()
        ...

``client_from_context`` (or the ``pass_client`` decorator) opens the blocking client once per
invocation, after checking that the database answers; asyncio commands build their own
``awa.AsyncClient(database_url_from_context(ctx))``. Raise ``CliError`` (or let any
``awa.AwaError`` escape) to end with ``error: <message>`` on stderr and exit code 1.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import getpass
import json
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Concatenate, NoReturn, ParamSpec, TypeVar

import click
import psycopg
from rich.console import Console
from rich.table import Table
from rich.text import Text

import awa
from awa.db import check_database_url, mask_password
from awa.embedded import embedded_status, stop_embedded_server
from awa.errors import AwaError, ValidationError
from awa.migrations import migration_script
from awa.model import JobRow, JobState
from awa.sql import current_version

__all__ = [
    "CliError",
    "CliState",
    "CliUsageError",
    "client_from_context",
    "database_url_from_context",
    "json_option",
    "main",
    "pass_client",
    "print_json",
    "print_table",
    "to_jsonable",
]

P = ParamSpec("P")
R = TypeVar("R")

CONNECT_TIMEOUT = 10
"""Seconds the CLI waits for the database before giving up with one error line."""


# Helpers for command modules ---------------------------------------------------------------


class CliError(click.ClickException):
    """Ends the command with ``error: <message>`` (one line) on stderr and exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


class CliUsageError(CliError):
    """Bad input on the command line, said in one line: ``error: <message>``, exit code 2."""

    exit_code = 2


def fail(message: str) -> NoReturn:
    raise CliError(message)


@dataclasses.dataclass
class CliState:
    """What the root group knows: the ``--database-url`` given (or None), where it came
    from (the option or ``DATABASE_URL``), and the client."""

    database_url: str | None = None
    database_url_source: str = "--database-url"
    client: awa.Client | None = None


def _state(ctx: click.Context) -> CliState:
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def database_url_from_context(ctx: click.Context) -> str | None:
    """The URL given with ``--database-url`` or ``DATABASE_URL``; None lets the client resolve
    one (``PG*`` variables, then the embedded server).

    A URL that is not PostgreSQL's (``mysql://...``) ends the command with one error line
    naming where it came from and the forms accepted.
    """
    state = _state(ctx)
    if state.database_url is not None:
        try:
            check_database_url(state.database_url)
        except ValidationError as error:
            fail(f"{state.database_url_source}: {error}")
    return state.database_url


def client_from_context(ctx: click.Context) -> awa.Client:
    """The invocation's blocking client, created on first use and closed when the command ends.

    Connects once up front so that an unreachable database fails fast with one clear line.
    """
    state = _state(ctx)
    if state.client is None:
        given = database_url_from_context(ctx)
        client = awa.Client(given, max_connections=2, application_name="awa-cli")
        url = client.database_url()
        try:
            with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT, autocommit=True):
                pass
        except psycopg.Error as error:
            fail(f"cannot connect to the database: {error}")
        state.client = client
        ctx.find_root().call_on_close(client.close)
    return state.client


def pass_client(f: Callable[Concatenate[awa.Client, P], R]) -> Callable[P, R]:
    """Decorator: call the command with the invocation's client as first argument."""

    @functools.wraps(f)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        return f(client_from_context(click.get_current_context()), *args, **kwargs)

    return wrapper


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of text."
)
"""The ``--json`` flag; the command receives it as ``as_json: bool``."""


def to_jsonable(value: Any) -> Any:
    """Convert rows, stats and other values to JSON types: ISO-8601 timestamps, durations in
    seconds, bytes as hex, enums by value."""
    if isinstance(value, awa.QueueStats):
        return {
            "queue": value.queue,
            "counts": {state.value: value.count(state) for state in JobState},
            "total": value.total,
            "oldest_available_at": to_jsonable(value.oldest_available_at),
            "oldest_available_age": _oldest_age(value),
            "paused": value.paused,
            "paused_by": value.paused_by,
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_jsonable(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(to_jsonable(key)): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(item) for item in value]
    return value


def _oldest_age(stats: awa.QueueStats) -> float | None:
    # The age is only meaningful when there is an available job (queue_stats reports 0.0).
    return stats.oldest_available_age if stats.oldest_available_at is not None else None


def print_json(value: Any) -> None:
    """Print a value (rows, stats, plain data) as indented JSON on stdout."""
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False, default=str))


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print plain aligned columns (no borders, so the output greps and cuts well); columns
    holding only integers are right-aligned. None prints as ``-``."""
    body = [["-" if cell is None else cell for cell in row] for row in rows]
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for index, header in enumerate(headers):
        numeric = bool(body) and all(isinstance(row[index], int) for row in body)
        table.add_column(header, justify="right" if numeric else "left", no_wrap=True)
    for row in body:
        table.add_row(*(Text(str(cell)) for cell in row))
    # Never truncate cells to fit the terminal (a long line wraps instead), and drop trailing
    # blanks, so that lines grep, cut and compare cleanly.
    console = Console(highlight=False, soft_wrap=False, width=10_000)
    with console.capture() as captured:
        console.print(table)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def format_time(value: dt.datetime | None) -> str:
    """A timestamp in UTC to the second, e.g. ``2024-05-01T12:00:00Z``."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_age(seconds: float | None) -> str:
    """A duration for humans: ``45s``, ``3m 20s``, ``2h 5m``, ``3d 4h``."""
    if seconds is None:
        return "-"
    total = int(max(seconds, 0))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


# The root group ----------------------------------------------------------------------------


class AwaGroup(click.Group):
    """Turns awa and driver errors raised by any subcommand, and bad command lines, into one
    ``error:`` line (exit code 1, or 2 for a bad command line)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError:
            raise
        except click.UsageError as error:
            where = error.ctx.command_path if error.ctx is not None else ctx.command_path
            raise CliUsageError(f"{error.format_message()} (see '{where} --help')") from error
        except AwaError as error:
            raise CliError(str(error) or type(error).__name__) from error
        except psycopg.Error as error:
            raise CliError(f"database error: {error}") from error


@click.group(cls=AwaGroup)
@click.option(
    "--database-url",
    envvar="DATABASE_URL",
    show_envvar=True,
    metavar="URL",
    help="PostgreSQL connection URL. Without it (and without PG* variables) awa starts an "
    "embedded server in your user data directory and reuses it.",
)
@click.version_option(awa.__version__, prog_name="awa")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Operate awa, the Postgres-native job queue: apply the schema, inspect, cancel and
    retry jobs, pause and drain queues.

    Put global options before the command: awa --database-url URL job list.
    Commands that print data take --json for scripts.
    """
    source = ctx.get_parameter_source("database_url")
    from_env = source is click.core.ParameterSource.ENVIRONMENT
    ctx.obj = CliState(
        database_url=database_url or None,
        database_url_source="DATABASE_URL" if from_env else "--database-url",
    )


@main.command()
@click.option("--sql", "sql_only", is_flag=True, help="Print the schema SQL; do not connect.")
@json_option
@click.pass_context
def migrate(ctx: click.Context, sql_only: bool, as_json: bool) -> None:
    """Create or upgrade the awa schema.

    Safe to run again and from several processes at once. With --sql, print the whole
    schema as one SQL script to review or to apply by other means; nothing connects.
    """
    if sql_only:
        if as_json:
            raise click.UsageError("--sql prints SQL; it cannot be combined with --json")
        click.echo(migration_script(), nl=False)
        return
    applied = client_from_context(ctx).migrate()
    version = current_version()
    if as_json:
        print_json({"applied": applied, "version": version})
    elif applied:
        listed = ", ".join(str(number) for number in applied)
        click.echo(f"applied migration(s) {listed}; the schema is at version {version}")
    else:
        click.echo(f"the schema is up to date (version {version})")


# Jobs --------------------------------------------------------------------------------------


@main.group()
def job() -> None:
    """Inspect, cancel and retry jobs.

    These commands change rows only: no lifecycle hooks or follow-up jobs fire.
    """


class JobId(click.ParamType[int]):
    """A job id: a positive integer, else one ``error:`` line (exit code 2).

    Commands taking one set ``ignore_unknown_options`` so that ``-5`` reaches this type
    instead of being reported as an unknown option; a token that is neither a number nor a
    known option is reported here as an unknown option.
    """

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        text = str(value).strip()
        if text.startswith("-") and not text[1:].isdigit():
            raise CliUsageError(f"no such option: {text}")
        digits = text.removeprefix("+")
        if digits.isascii() and digits.isdigit() and int(digits) > 0:
            return int(digits)
        raise CliUsageError(f"job id must be a positive integer, not {text or repr(text)}")


JOB_ID = JobId()
_TAKES_JOB_ID = {"ignore_unknown_options": True}  # see JobId


_STATE_CHOICE = click.Choice([state.value for state in JobState], case_sensitive=False)
_STATE_NAMES = ", ".join(state.value for state in JobState)


@job.command("list")
@click.option(
    "--state", type=_STATE_CHOICE, metavar="STATE", help=f"Only jobs in this state: {_STATE_NAMES}."
)
@click.option("--kind", help="Only jobs of this kind.")
@click.option("--queue", help="Only jobs in this queue.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    metavar="N",
    help="Show at most N jobs.",
)
@json_option
@pass_client
def list_jobs(
    client: awa.Client,
    state: str | None,
    kind: str | None,
    queue: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first."""
    jobs = client.list_jobs(state=state, kind=kind, queue=queue, limit=limit)
    if as_json:
        print_json(jobs)
        return
    if not jobs:
        click.echo("no jobs found")
        return
    headers = ["ID", "KIND", "QUEUE", "STATE", "ATTEMPT/MAX", "PRIORITY", "RUN_AT"]
    print_table(headers, [_job_cells(row) for row in jobs])
    if len(jobs) == limit:
        click.echo(f"(showing the newest {limit}; raise --limit to see more)", err=True)


def _job_cells(row: JobRow) -> list[object]:
    attempts, run_at = f"{row.attempt}/{row.max_attempts}", format_time(row.run_at)
    return [row.id, row.kind, row.queue, row.state.value, attempts, row.priority, run_at]


def _json_block(value: Any) -> str:
    text = json.dumps(to_jsonable(value), indent=2, ensure_ascii=False, default=str)
    return text.replace("\n", "\n  ")


def _error_time(value: object) -> str:
    try:
        return format_time(dt.datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def _describe(row: JobRow) -> None:
    now = dt.datetime.now(dt.UTC)

    def when(value: dt.datetime | None) -> str:
        if value is None:
            return "-"
        delta = (value - now).total_seconds()
        relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(-delta)} ago"
        return f"{format_time(value)} ({relative})"

    deadline = "-"
    if row.deadline_duration is not None:
        deadline = format_age(row.deadline_duration.total_seconds())
    fields: list[tuple[str, object]] = [
        ("id", row.id),
        ("kind", row.kind),
        ("queue", row.queue),
        ("state", row.state.value),
        ("attempt", f"{row.attempt}/{row.max_attempts}"),
        ("priority", row.priority),
        ("run lease", row.run_lease),
        ("tags", ", ".join(row.tags) or "-"),
        ("created at", when(row.created_at)),
        ("run at", when(row.run_at)),
        ("attempted at", when(row.attempted_at)),
        ("heartbeat at", when(row.heartbeat_at)),
        ("deadline at", when(row.deadline_at)),
        ("finalized at", when(row.finalized_at)),
        ("deadline", deadline),
        ("unique key", to_jsonable(row.unique_key)),
        ("unique states", row.unique_states),
        ("ordering key", to_jsonable(row.ordering_key)),
    ]
    if row.callback_id is not None:
        fields += [
            ("callback id", row.callback_id),
            ("callback timeout", when(row.callback_timeout_at)),
        ]
        for name in ("filter", "on_complete", "on_fail", "transform"):
            value = getattr(row, f"callback_{name}")
            if value is not None:
                fields.append((f"callback {name}", value))
    for label, value in fields:
        click.echo(f"{label:<17}{'-' if value is None else value}")
    for label, data in (("args", row.args), ("metadata", row.metadata)):
        click.echo(f"{label}:\n  {_json_block(data)}")
    if row.progress is not None:
        click.echo(f"progress:\n  {_json_block(row.progress)}")
    if row.output is not None:
        click.echo(f"output:\n  {_json_block(row.output)}")
    click.echo(f"errors ({len(row.errors)}):" if row.errors else "errors: none")
    for entry in row.errors:
        if isinstance(entry, dict) and "error" in entry:
            stamp = _error_time(entry.get("at"))
            terminal = " (terminal)" if entry.get("terminal") else ""
            message = str(entry["error"]).replace("\n", "\n      ")
            click.echo(f"  attempt {entry.get('attempt', '?')} at {stamp}{terminal}:")
            click.echo(f"      {message}")
        else:
            click.echo(f"  {_json_block(entry)}")


@job.command("get", context_settings=_TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@pass_client
def get_job(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Show one job in full.

    Every field, the error history of its attempts, progress and metadata.
    """
    row = client.get_job(job_id)
    if row is None:
        fail(f"job {job_id} not found")
    if as_json:
        print_json(row)
    else:
        _describe(row)


def _report_change(
    client: awa.Client, job_id: int, row: JobRow | None, as_json: bool, rule: str, note: str = ""
) -> None:
    """Print the changed row, or say why there is none (unknown id, or the rule it broke)."""
    if row is None:
        current = client.get_job(job_id)
        if current is None:
            fail(f"job {job_id} not found")
        fail(f"job {job_id} is {current.state.value}; {rule}")
    if as_json:
        print_json(row)
    else:
        click.echo(f"job {row.id} is now {row.state.value}{note}")


@job.command("cancel", context_settings=_TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@pass_client
def cancel_job(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Cancel a job that has not finished.

    A running attempt is told to stop; whatever it writes afterwards is ignored.
    """
    row = client.cancel(job_id)
    _report_change(client, job_id, row, as_json, "only unfinished jobs can be cancelled")


@job.command("retry", context_settings=_TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=JOB_ID)
@json_option
@pass_client
def retry_job(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Run a failed, cancelled or parked job again.

    The job becomes available now with a fresh attempt budget; its error history is kept.
    Parked (waiting_external) jobs drop their callback.
    """
    row = client.retry(job_id)
    rule = "only failed, cancelled or waiting_external jobs can be retried"
    note = f"; it runs again with up to {row.max_attempts} attempts" if row else ""
    _report_change(client, job_id, row, as_json, rule, note)


@job.command("retry-failed")
@click.option("--kind", help="Retry the failed jobs of this kind.")
@click.option("--queue", help="Retry the failed jobs of this queue.")
@json_option
@click.pass_context
def retry_failed(ctx: click.Context, kind: str | None, queue: str | None, as_json: bool) -> None:
    """Retry every failed job of a kind or a queue.

    Give exactly one of --kind and --queue.
    """
    if (kind is None) == (queue is None):
        raise click.UsageError("give exactly one of --kind or --queue")
    jobs = client_from_context(ctx).retry_failed(kind=kind, queue=queue)
    if as_json:
        print_json({"retried": len(jobs), "job_ids": [row.id for row in jobs]})
    else:
        scope = f"kind {kind}" if kind is not None else f"queue {queue}"
        click.echo(f"retried {len(jobs)} failed job(s) of {scope}")


@job.command("discard")
@click.option("--kind", required=True, help="The kind whose failed jobs are deleted.")
@json_option
@pass_client
def discard_failed(client: awa.Client, kind: str, as_json: bool) -> None:
    """Delete every failed job of a kind, for good."""
    count = client.discard_failed(kind)
    if as_json:
        print_json({"discarded": count, "kind": kind})
    else:
        click.echo(f"deleted {count} failed job(s) of kind {kind}")


# Queues ------------------------------------------------------------------------------------


@main.group()
def queue() -> None:
    """Show queue depth; pause, resume and drain queues."""


_STATS_STATES = [JobState.AVAILABLE, JobState.RUNNING, JobState.SCHEDULED, JobState.RETRYABLE]
_STATS_STATES += [JobState.WAITING_EXTERNAL, JobState.FAILED]


@queue.command("stats")
@json_option
@pass_client
def queue_stats(client: awa.Client, as_json: bool) -> None:
    """Jobs per queue and state, the age of the oldest available job, and pause status.

    WAITING counts jobs parked on a callback. Completed and cancelled counts are in --json.
    """
    stats = client.queue_stats()
    if as_json:
        print_json(stats)
        return
    if not stats:
        click.echo("no queues yet")
        return
    counted = [state.value.split("_")[0].upper() for state in _STATS_STATES]
    headers = ["QUEUE", *counted, "OLDEST AVAILABLE", "PAUSED"]
    rows = []
    for entry in stats:
        paused = "no"
        if entry.paused:
            paused = f"yes (by {entry.paused_by})" if entry.paused_by else "yes"
        counts = [entry.count(state) for state in _STATS_STATES]
        rows.append([entry.queue, *counts, format_age(_oldest_age(entry)), paused])
    print_table(headers, rows)


def _default_pauser() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


@queue.command("pause")
@click.argument("name", metavar="QUEUE")
@click.option("--by", "paused_by", help="Who paused it (default: your user name).")
@json_option
@pass_client
def pause_queue(client: awa.Client, name: str, paused_by: str | None, as_json: bool) -> None:
    """Stop workers from claiming jobs of QUEUE; running jobs finish. Inserts still work.

    A queue no job has used yet is paused too (ready for its first jobs), with a note to
    check the name; --json then says "known": false.
    """
    paused_by = paused_by or _default_pauser()
    with client.connection() as conn:
        known = awa.admin.queue_known(conn, name)
    client.pause_queue(name, paused_by=paused_by)
    if as_json:
        print_json({"queue": name, "paused": True, "paused_by": paused_by, "known": known})
        return
    note = "" if known else " (no job has used this queue yet; check the name)"
    click.echo(f"queue {name} paused" + (f" by {paused_by}" if paused_by else "") + note)


@queue.command("resume")
@click.argument("name", metavar="QUEUE")
@json_option
@pass_client
def resume_queue(client: awa.Client, name: str, as_json: bool) -> None:
    """Let workers claim jobs of QUEUE again."""
    was_paused = client.resume_queue(name)
    if as_json:
        print_json({"queue": name, "paused": False, "was_paused": was_paused})
    elif was_paused:
        click.echo(f"queue {name} resumed")
    else:
        click.echo(f"queue {name} was not paused")


@queue.command("drain")
@click.argument("name", metavar="QUEUE")
@json_option
@pass_client
def drain_queue(client: awa.Client, name: str, as_json: bool) -> None:
    """Cancel every job of QUEUE that waits to run or is parked on a callback.

    Running jobs finish their attempt.
    """
    count = client.drain_queue(name)
    if as_json:
        print_json({"queue": name, "cancelled": count})
    else:
        click.echo(f"cancelled {count} job(s) in queue {name}")


# Database ----------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Show which database awa uses; look after the embedded server.

    Without --database-url, DATABASE_URL or PG* variables, awa starts an embedded
    PostgreSQL server on first use and leaves it running for the next command; `awa db
    status` shows it and `awa db stop` stops it (its data is kept).
    """


_PG_VARS = {"PGDATABASE": "dbname"} | {
    v: v[2:].lower() for v in ("PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGSERVICE")
}


@db.command("url")
@click.option(
    "--show-password", is_flag=True, help="Print the password too (it shows as *** otherwise)."
)
@json_option
@click.pass_context
def db_url(ctx: click.Context, show_password: bool, as_json: bool) -> None:
    """Print the connection string awa uses, its password masked as ***.

    The first that is set wins: --database-url, DATABASE_URL, the PG* variables; with none
    of them, the embedded server (started here if it is not running).
    """
    url = awa.Client(database_url_from_context(ctx)).database_url()
    if not url:  # libpq reads the PG* variables: show what they say
        parts = {key: os.environ[var] for var, key in _PG_VARS.items() if os.environ.get(var)}
        url = psycopg.conninfo.make_conninfo("", **parts)
    if not show_password:
        url = mask_password(url)
    if as_json:
        print_json({"database_url": url})
    else:
        click.echo(url)


_PG_SOURCE = "PG* variables"


def _configured_elsewhere(ctx: click.Context) -> tuple[str, str] | None:
    """What points awa at another server than the embedded one, and what it says (password
    masked); None when awa uses the embedded server."""
    state = _state(ctx)
    if state.database_url:
        return state.database_url_source, mask_password(state.database_url)
    names = [var for var in _PG_VARS if os.environ.get(var)]
    if names:
        settings = ", ".join(f"{name}={os.environ[name]}" for name in names)
        return _PG_SOURCE, settings
    return None


@db.command("status")
@json_option
@click.pass_context
def db_status(ctx: click.Context, as_json: bool) -> None:
    """Say whether the embedded server runs: its pid, data directory and URL.

    Starts nothing. Also says when --database-url, DATABASE_URL or PG* variables point awa
    at another server (the embedded one is then not used). AWA_EMBEDDED_DATA_DIR chooses the
    data directory.
    """
    status = embedded_status()
    elsewhere = _configured_elsewhere(ctx)
    if as_json:
        print_json(
            {
                "embedded": status,
                "in_use": elsewhere is None,
                "configured_by": elsewhere[0] if elsewhere else None,
                "database_url": elsewhere[1] if elsewhere else None,
            }
        )
        return
    if status.running:
        state = f"running (pid {status.pid})"
    elif status.initialized:
        state = "stopped (awa starts it again when it needs it)"
    else:
        state = "not created yet (awa creates and starts it when it needs it)"
    details = [f"PostgreSQL {status.version}"] if status.version else []
    details += [f"owner {status.owner}"] if status.owner else []
    suffix = f" ({', '.join(details)})" if details else ""
    rows = [("embedded server", state), ("data directory", f"{status.data_dir}{suffix}")]
    if status.url:
        rows.append(("url", status.url))
    for label, value in rows:
        click.echo(f"{label:<17}{value}")
    if elsewhere:
        source, value = elsewhere
        verb = "are" if source == _PG_SOURCE else "is"
        click.echo(
            f"note: {source} {verb} set ({value}): awa uses that server, not the embedded one"
        )


@db.command("stop")
@json_option
def db_stop(as_json: bool) -> None:
    """Stop the embedded server cleanly (a fast shutdown: sessions end, data is kept).

    Waits until it has exited. The next command that needs it starts it again; to delete
    it, stop it and remove its data directory (see `awa db status`).
    """
    data_dir = embedded_status().data_dir
    pid = stop_embedded_server(data_dir)
    if as_json:
        print_json({"stopped": pid is not None, "pid": pid, "data_dir": str(data_dir)})
    elif pid is None:
        click.echo(f"the embedded server is not running (data directory {data_dir})")
    else:
        click.echo(f"stopped the embedded server (pid {pid}); its data stays in {data_dir}")


if __name__ == "__main__":
    main()


def _register_command_modules() -> None:
    # These modules add their commands to `main` when imported.
    from awa import bench, callbacks_cli, demo, health_command  # noqa: F401
    from awa.worker import command  # noqa: F401


_register_command_modules()
