"""``awa callback ...`` (answer a callback by hand) and ``awa callbacks serve`` (the HTTP
receiver).

``awa callback`` works like ``awa job``: it changes rows only, through ``awa.admin``, so no
lifecycle hook or follow-up fires. ``awa callbacks serve MODULE:CLIENT`` resolves through
your AsyncClient, so its hooks and follow-ups do fire.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import click

import awa
from awa.callbacks import DEFAULT_TIMEOUT, DefaultAction, ResolveResult
from awa.cli import (
    CliError,
    database_url_from_context,
    format_time,
    json_option,
    main,
    pass_client,
    print_json,
)
from awa.model import JobRow

# awa callback ... ---------------------------------------------------------------------------


@main.group()
def callback() -> None:
    """Answer a job's external callback by hand (complete, fail, retry, resume, resolve).

    ID is the callback id the job registered (see `awa job get`). These commands change
    rows only: no lifecycle hooks or follow-up jobs fire.
    """


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise click.BadParameter(f"not valid JSON: {error}", param_hint="--payload") from None


payload_option = click.option(
    "--payload", metavar="JSON", help="The callback's payload, as JSON (e.g. '{\"paid\": true}')."
)
lease_option = click.option(
    "--run-lease",
    type=int,
    metavar="N",
    help="Only if the job's attempt still has this run lease.",
)


def _report(row: JobRow, as_json: bool, note: str = "") -> None:
    if as_json:
        print_json(row)
    else:
        click.echo(f"job {row.id} is now {row.state.value}{note}")


@callback.command("complete")
@click.argument("callback_id", metavar="ID")
@payload_option
@lease_option
@json_option
@pass_client
def complete(
    client: awa.Client, callback_id: str, payload: str | None, run_lease: int | None, as_json: bool
) -> None:
    """Complete the job holding callback ID; the payload becomes its output."""
    with client.connection() as conn:
        row = awa.admin.complete_external(conn, callback_id, _payload(payload), run_lease)
    _report(row, as_json)


@callback.command("fail")
@click.argument("callback_id", metavar="ID")
@click.option("--error", "error", required=True, help="Why it failed (kept in the job's errors).")
@lease_option
@json_option
@pass_client
def fail(
    client: awa.Client, callback_id: str, error: str, run_lease: int | None, as_json: bool
) -> None:
    """Fail the job holding callback ID, for good."""
    with client.connection() as conn:
        row = awa.admin.fail_external(conn, callback_id, error, run_lease)
    _report(row, as_json)


@callback.command("retry")
@click.argument("callback_id", metavar="ID")
@lease_option
@json_option
@pass_client
def retry(client: awa.Client, callback_id: str, run_lease: int | None, as_json: bool) -> None:
    """Run the job parked on callback ID again, with a fresh attempt budget."""
    with client.connection() as conn:
        row = awa.admin.retry_external(conn, callback_id, run_lease)
    _report(row, as_json)


@callback.command("resume")
@click.argument("callback_id", metavar="ID")
@payload_option
@lease_option
@json_option
@pass_client
def resume(
    client: awa.Client, callback_id: str, payload: str | None, run_lease: int | None, as_json: bool
) -> None:
    """Hand the payload to the job holding callback ID.

    A handler waiting in job.wait_for_callback() continues with it; a job parked by
    WaitForCallback runs again and finds it in job.callback_result.
    """
    with client.connection() as conn:
        row = awa.admin.resume_external(conn, callback_id, _payload(payload), run_lease)
    _report(row, as_json)


@callback.command("resolve")
@click.argument("callback_id", metavar="ID")
@payload_option
@click.option(
    "--default-action",
    type=click.Choice(["complete", "fail", "ignore"]),
    default="ignore",
    show_default=True,
    help="What to do when no CEL expression of the callback decides.",
)
@lease_option
@json_option
@pass_client
def resolve(
    client: awa.Client,
    callback_id: str,
    payload: str | None,
    default_action: DefaultAction,
    run_lease: int | None,
    as_json: bool,
) -> None:
    """Complete, fail or ignore by the callback's CEL expressions and the payload."""
    with client.connection() as conn:
        result: ResolveResult = awa.admin.resolve_callback(
            conn, callback_id, _payload(payload), default_action, run_lease
        )
    if as_json:
        print_json(result)
    elif result.job is None:
        click.echo(f"ignored: {result.reason}")
    else:
        click.echo(f"{result.outcome}: job {result.job.id} is now {result.job.state.value}")


@callback.command("heartbeat")
@click.argument("callback_id", metavar="ID")
@click.option(
    "--timeout",
    "timeout_seconds",
    type=click.FloatRange(min=0),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="The new timeout, from now.",
)
@json_option
@pass_client
def heartbeat(client: awa.Client, callback_id: str, timeout_seconds: float, as_json: bool) -> None:
    """Push the timeout of the job parked on callback ID to SECONDS from now."""
    with client.connection() as conn:
        row = awa.admin.heartbeat_callback(conn, callback_id, timeout_seconds)
    _report(row, as_json, f"; its callback times out at {format_time(row.callback_timeout_at)}")


# awa callbacks serve --------------------------------------------------------------------------


@main.group()
def callbacks() -> None:
    """Receive external callbacks over HTTP."""


@callbacks.command("serve")
@click.argument("target", metavar="[MODULE:CLIENT]", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--secret",
    envvar="AWA_CALLBACK_SECRET",
    show_envvar=True,
    help="Shared secret senders sign requests with (HMAC-SHA256).",
)
@click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Accept requests without a signature (signed ones are still checked).",
)
@click.option("--prefix", default="/callbacks", show_default=True, help="Path prefix.")
@click.option("--log-level", default="info", show_default=True, help="uvicorn log level.")
@click.pass_context
def serve(
    ctx: click.Context,
    target: str | None,
    host: str,
    port: int,
    secret: str | None,
    allow_unsigned: bool,
    prefix: str,
    log_level: str,
) -> None:
    """Serve POST /callbacks/{id}/complete|fail|retry|resume|resolve|heartbeat.

    With MODULE:CLIENT (an awa.AsyncClient, e.g. myapp.jobs:client) resolutions run that
    client's lifecycle hooks and follow-ups; without it, a plain client makes the same
    transitions and fires nothing. Requests must be signed with --secret unless
    --allow-unsigned is given.
    """
    if not secret and not allow_unsigned:
        raise click.UsageError("give --secret (or AWA_CALLBACK_SECRET), or --allow-unsigned")
    import uvicorn

    from awa.callbacks_http import create_app

    url = database_url_from_context(ctx)
    if target is not None:
        from awa.worker.command import load_client

        if url:
            os.environ["DATABASE_URL"] = url  # a client built without a URL reads it
        client = load_client(target)
    else:
        client = awa.AsyncClient(url, application_name="awa-callbacks")
    try:
        app = create_app(
            client, secret=secret or None, allow_unsigned=allow_unsigned, prefix=prefix
        )
    except ValueError as error:
        raise CliError(str(error)) from error
    signing = "signed requests" if secret else "UNSIGNED requests"
    if secret and allow_unsigned:
        signing = "signed and unsigned requests"
    click.echo(
        f"awa callback receiver on http://{host}:{port}{app.routes[0].path} ({signing})",  # type: ignore[attr-defined]
        err=True,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")
    asyncio.run(_serve(uvicorn.Server(config), client))


async def _serve(server: Any, client: awa.AsyncClient) -> None:
    try:
        await client.pool()  # fail now, not on the first request, if the database is down
        await server.serve()
    finally:
        await client.close()
