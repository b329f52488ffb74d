"""``awa ui``: serve the operator web UI (loopback only unless told otherwise)."""

from __future__ import annotations

import os
import socket

import click
import psycopg

from awa.cli.group import database_url_from_context, fail, main
from awa.core.extras import require_extra
from awa.errors import ValidationError
from awa.storage.db import drive_sync, resolve_database_url
from awa.storage.migrations import check_version, schema_version_flow

AUTH_HELP = (
    "Require credentials, read from the environment variable of this name: 'user:password' "
    "for basic auth, or a token (sent as 'Authorization: Bearer <token>', or as the "
    "password of basic auth)."
)


@main.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--read-only", is_flag=True, help="Show no actions; refuse every change (403).")
@click.option("--auth", "auth_variable", metavar="ENV_VAR", help=AUTH_HELP)
@click.option("--title", default="awa", show_default=True, help="Name shown in the header.")
@click.pass_context
def ui(
    ctx: click.Context,
    host: str,
    port: int,
    read_only: bool,
    auth_variable: str | None,
    title: str,
) -> None:
    """Serve the operator web UI: queues, jobs, lineage, callbacks, schedules, failures.

    Needs the ui extra: pip install 'awa-py[ui]'.
    """
    require_extra("ui", "awa ui")
    import uvicorn

    from awa.ui import create_app
    from awa.ui.security import parse_credentials

    credentials = None
    if auth_variable is not None:
        credentials = os.environ.get(auth_variable)
        if not credentials:
            fail(f"--auth {auth_variable}: that environment variable is not set or empty")
        try:
            parse_credentials(credentials)
        except ValidationError as error:
            fail(f"--auth {auth_variable}: {error}")
    url = resolve_database_url(database_url_from_context(ctx))
    with psycopg.connect(url, autocommit=True) as conn:
        check_version(drive_sync(conn, schema_version_flow()))
    try:
        bound = socket.create_server((host, port))
    except OSError as error:
        fail(f"cannot serve the UI on {host}:{port}: {error}")
    app = create_app(url, read_only=read_only, title=title, auth=credentials)
    shown = bound.getsockname()
    mode = " (read-only)" if read_only else ""
    click.echo(f"awa ui{mode} on http://{shown[0]}:{shown[1]}/", err=True)
    if host not in ("127.0.0.1", "localhost", "::1") and credentials is None:
        click.echo("warning: the UI listens beyond this machine without --auth", err=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[bound])
