"""The ``awa`` command group and the helpers every command module uses.

Command modules (``awa.cli.jobs``, ``awa.cli.queues``, ...) add their commands to ``main``
and import only from here, never from each other or from ``awa.cli`` itself; the package's
``__init__`` imports them all once, so that ``awa.cli.main`` has every command::

    from awa.cli.group import client_from_context, json_option, main, print_json

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
import importlib
import json
import os
import sys
import traceback
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Concatenate, NoReturn, ParamSpec, TypeVar

import click
import psycopg
from rich.console import Console
from rich.table import Table
from rich.text import Text

import awa
from awa.core.arguments import check_seconds, check_text
from awa.errors import AwaError, ValidationError
from awa.model import BIGINT_MAX, MAX_LIST_LIMIT, JobState, check_name, check_tags
from awa.storage.db import check_database_url

__all__ = [
    "JOB_ID",
    "KIND",
    "LIMIT",
    "QUEUE",
    "RUN_LEASE",
    "SECONDS",
    "TAG",
    "TAKES_JOB_ID",
    "TEXT",
    "Checked",
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
    "visible",
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


# Parameter types: bad input is a usage error naming the option (exit code 2) -------------


class Checked(click.ParamType[Any]):
    """A value checked by one of awa's validators before any command runs: a failure is
    ``Invalid value for '--queue': queue is 201 characters long; ...`` (exit code 2)."""

    def __init__(self, name: str, check: Callable[[Any], Any]) -> None:
        self.name = name
        self._check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self._check(value)
        except ValidationError as error:
            self.fail(str(error), param, ctx)


class JobId(click.ParamType[int]):
    """A job id: an integer from 1 to 2**63 - 1, else one ``error:`` line (exit code 2).

    Commands taking one set ``ignore_unknown_options`` so that ``-5`` reaches this type
    instead of being reported as an unknown option; a token that is neither a number nor a
    known option is reported here as an unknown option.
    """

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= BIGINT_MAX:
            return value
        text = str(value).strip()
        if text.startswith("-") and not text[1:].isdigit():
            raise CliUsageError(f"no such option: {text}")
        digits = text.removeprefix("+")
        shown = text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
        if digits.isascii() and digits.isdigit():
            # Compare the length first: int() of thousands of digits raises ValueError.
            if len(digits.lstrip("0")) > len(str(BIGINT_MAX)) or int(digits) > BIGINT_MAX:
                raise CliUsageError(f"job id must be at most {BIGINT_MAX}, not {shown}")
            if int(digits) > 0:
                return int(digits)
        raise CliUsageError(f"job id must be a positive integer, not {shown or repr(text)}")


TAKES_JOB_ID = {"ignore_unknown_options": True}  # see JobId


def _lease_text(value: Any) -> int:
    number = value if isinstance(value, int) else _integer(value, "run lease")
    if not 0 <= number <= BIGINT_MAX:
        raise ValidationError(f"run lease must be between 0 and {BIGINT_MAX}, got {number}")
    return number


def _integer(value: Any, field: str) -> int:
    text = str(value).strip()
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text.removeprefix("+"))
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 30:
        raise ValidationError(f"{field} must be an integer, not {text or repr(text)}")
    return int(sign + digits)


def _limit_text(value: Any) -> int:
    number = value if isinstance(value, int) else _integer(value, "limit")
    if not 1 <= number <= MAX_LIST_LIMIT:
        raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {number}")
    return number


def _seconds_text(value: Any) -> float:
    if not isinstance(value, int | float):
        try:
            value = float(str(value).strip())
        except ValueError:
            raise ValidationError(f"{value!r} is not a number of seconds") from None
    return check_seconds("seconds", value)


def _tag_text(value: Any) -> str:
    return check_tags([value])[0]


QUEUE = Checked("queue", lambda value: check_name("queue", value))
"""A queue name (1 to 200 characters, no NUL or lone surrogate)."""
KIND = Checked("kind", lambda value: check_name("kind", value))
"""A job kind (the rules of a queue name)."""
TAG = Checked("tag", _tag_text)
"""A tag (no NUL or lone surrogate)."""
TEXT = Checked("text", lambda value: check_text("text", value))
"""Free text stored as given (who paused a queue): at most 200 characters."""
JOB_ID = JobId()
"""A job id: 1 to 2**63 - 1."""
RUN_LEASE = Checked("lease", _lease_text)
"""A run lease: 0 to 2**63 - 1."""
LIMIT = Checked("n", _limit_text)
"""How many rows a list shows: 1 to 1000."""
SECONDS = Checked("seconds", _seconds_text)
"""A duration in seconds: finite, from 0 to 100 years."""


@dataclasses.dataclass
class CliState:
    """What the root group knows: the ``--database-url`` given (or None), where it came
    from (the option or ``DATABASE_URL``), and the client."""

    database_url: str | None = None
    database_url_source: str = "--database-url"
    client: awa.Client | None = None


def cli_state(ctx: click.Context) -> CliState:
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
    state = cli_state(ctx)
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
    state = cli_state(ctx)
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


def print_descriptors(
    rows: Sequence[Any],
    as_json: bool,
    empty: str,
    names: list[str],
    named: Callable[[Any], list[Any]],
) -> None:
    """Stored descriptors (of queues or job kinds) as JSON with ``declared``, or a table:
    the ``names`` columns (``named(row)``), then display name, owner, tags, live, last seen."""
    if as_json:
        print_json([{**to_jsonable(row), "declared": row.declared} for row in rows])
        return
    if not rows:
        click.echo(empty)
        return
    headers = [*names, "DISPLAY NAME", "OWNER", "TAGS", "LIVE", "LAST SEEN"]
    cells = [
        [
            *named(row),
            row.display_name,
            row.owner,
            ", ".join(row.tags) or None,
            "yes" if row.live else "no",
            format_time(row.last_seen_at),
        ]
        for row in rows
    ]
    print_table(headers, cells)


def current_user() -> str | None:
    """Who runs the command (the default of ``--by``), when the system can tell."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return None


def json_client(f: Callable[Concatenate[awa.Client, P], R]) -> Callable[P, R]:
    """``--json`` and a blocking client, what most commands take (``pass_client`` then
    ``json_option``)."""
    return json_option(pass_client(f))


def to_jsonable(value: Any) -> Any:
    """Convert rows, stats and other values to JSON types: ISO-8601 timestamps, durations in
    seconds, bytes as hex, enums by value."""
    if isinstance(value, awa.QueueStats):
        return {
            "queue": value.queue,
            "counts": {state.value: value.count(state) for state in JobState},
            "total": value.total,
            "oldest_available_at": to_jsonable(value.oldest_available_at),
            "oldest_available_age": lag_seconds(value),
            "paused": value.paused,
            "paused_by": value.paused_by,
            "limits": to_jsonable(value.limits),
            "held_back": {**to_jsonable(value.held_back), "total": value.held_back.total},
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


def lag_seconds(stats: awa.QueueStats) -> float | None:
    """How long the oldest available job has waited (None: nothing available)."""
    return stats.oldest_available_age if stats.oldest_available_at is not None else None


def print_json(value: Any) -> None:
    """Print a value (rows, stats, plain data) as indented JSON on stdout."""
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False, default=str))


def limit_option(what: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``--limit N``: show at most N ``what`` (1 to 1000, default 50)."""
    return click.option(
        "--limit",
        type=LIMIT,
        default=50,
        show_default=True,
        metavar="N",
        help=f"Show at most N {what} (1 to 1000).",
    )


def report(as_json: bool, value: Any, text: str) -> None:
    """Print a command's result: ``value`` as JSON, or ``text``."""
    if as_json:
        print_json(value)
    else:
        click.echo(text)


def json_or_empty(as_json: bool, items: Sequence[Any], empty: str) -> bool:
    """Print ``items`` as JSON, or ``empty`` when there are none; True when that was all
    (else the caller prints the items its own way)."""
    if as_json:
        print_json(items)
        return True
    if not items:
        click.echo(empty)
        return True
    return False


def visible(text: str, keep: str = "") -> str:
    """``text`` safe to print on a terminal: control and format characters (escape
    sequences, newlines, a right-to-left override) shown as escapes (``\\x1b``, ``\\n``,
    ``\\u202e``), so a stored name can neither restyle the terminal nor fake a line of
    output. Characters in ``keep`` stay as they are."""
    if text.isprintable():
        return text
    return "".join(
        char
        if char in keep or unicodedata.category(char) not in _HIDDEN
        else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print plain aligned columns (no borders, so the output greps and cuts well); columns
    holding only integers are right-aligned. None prints as ``-``; stored text is shown with
    its control characters escaped (``visible``)."""
    body = [
        ["-" if cell is None else visible(cell) if isinstance(cell, str) else cell for cell in row]
        for row in rows
    ]
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
        except ValidationError as error:
            # Bad input the command's own checks did not catch: still a usage error.
            raise CliUsageError(str(error) or type(error).__name__) from error
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
    "embedded server in your user data directory and reuses it (the embedded extra).",
)
@click.version_option(awa.__version__, prog_name="awa")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Operate awa, the Postgres-native job queue: apply the schema, inspect, cancel and
    retry jobs, pause and drain queues, override their settings live.

    Put global options before the command: awa --database-url URL job list.
    Commands that print data take --json for scripts.
    """
    source = ctx.get_parameter_source("database_url")
    from_env = source is click.core.ParameterSource.ENVIRONMENT
    ctx.obj = CliState(
        database_url=database_url or None,
        database_url_source="DATABASE_URL" if from_env else "--database-url",
    )


# Loading the user's client ------------------------------------------------------------------


def load_client(target: str) -> awa.AsyncClient:
    """Import ``module:attribute`` (the attribute an AsyncClient, or a function returning
    one) with the current directory on the import path. Any failure is one CliError line."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(f"expected module:attribute (e.g. myapp.jobs:client), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise CliError(
                f"cannot import {module_name!r}: no module named {error.name!r} "
                f"(run from the directory that holds it, or add it to PYTHONPATH)"
            ) from None
        raise CliError(f"importing {module_name!r} failed: {_describe(error)}") from None
    except SyntaxError as error:
        where = f"{error.filename}, line {error.lineno}" if error.filename else "unknown place"
        raise CliError(
            f"cannot import {module_name!r}: syntax error in {where}: {error.msg}"
        ) from None
    except Exception as error:
        raise CliError(f"importing {module_name!r} failed: {_describe(error)}") from None
    if not hasattr(module, attribute):
        raise CliError(f"module {module_name!r} has no attribute {attribute!r}")
    value: Any = getattr(module, attribute)
    if callable(value) and not isinstance(value, awa.AsyncClient | awa.Client | type):
        try:
            value = value()
        except Exception as error:
            raise CliError(f"calling {target} failed: {_describe(error)}") from None
    if isinstance(value, awa.Client):
        raise CliError(
            f"{target} is an awa.Client (blocking, producer and admin only); the worker needs "
            "an awa.AsyncClient"
        )
    if not isinstance(value, awa.AsyncClient):
        raise CliError(f"{target} is a {type(value).__name__}, not an awa.AsyncClient")
    return value


def _describe(error: BaseException) -> str:
    """``Type: message (file:line)`` of the innermost frame, on one line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(error).split())
    return (
        f"{type(error).__name__}: {message}{where}" if message else f"{type(error).__name__}{where}"
    )
