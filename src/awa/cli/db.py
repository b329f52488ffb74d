"""``awa migrate`` and ``awa db``: the schema, and which database awa uses (with the
embedded server's status and stop)."""

from __future__ import annotations

import os

import click
import psycopg

import awa
from awa.cli.group import (
    cli_state,
    client_from_context,
    database_url_from_context,
    json_option,
    main,
    print_json,
    report,
)
from awa.core.extras import require_extra
from awa.sql import current_version
from awa.storage.db import mask_password
from awa.storage.embedded import embedded_status, stop_embedded_server
from awa.storage.migrations import migration_script


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
    report(as_json, {"database_url": url}, url)


_PG_SOURCE = "PG* variables"


def _configured_elsewhere(ctx: click.Context) -> tuple[str, str] | None:
    """What points awa at another server than the embedded one, and what it says (password
    masked); None when awa uses the embedded server."""
    state = cli_state(ctx)
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
    require_extra("embedded", "awa db status")
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
    require_extra("embedded", "awa db stop")
    data_dir = embedded_status().data_dir
    pid = stop_embedded_server(data_dir)
    if as_json:
        print_json({"stopped": pid is not None, "pid": pid, "data_dir": str(data_dir)})
    elif pid is None:
        click.echo(f"the embedded server is not running (data directory {data_dir})")
    else:
        click.echo(f"stopped the embedded server (pid {pid}); its data stays in {data_dir}")


@main.group()
def storage() -> None:
    """The job storage (the reference package's `storage` commands).

    awa has one storage engine, built by the migrations in the schema awa: there is no
    transition to prepare or finalize.
    """


@storage.command("status")
@click.pass_context
def storage_status(ctx: click.Context) -> None:
    """Print the storage report as JSON (engine, state, schema, migration version, live
    workers), in the shape of the reference package's `storage status`."""
    click.echo(client_from_context(ctx).storage_status())
