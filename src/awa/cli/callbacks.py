"""``awa callback``: answer external callbacks by hand, or serve the HTTP receiver.

``complete``, ``fail``, ``retry``, ``resume``, ``resolve`` and ``heartbeat`` work like ``awa
job``: they change rows only, through ``awa.admin``, so no lifecycle hook or follow-up fires.
``serve MODULE:CLIENT`` resolves through your AsyncClient, so its hooks and follow-ups do
fire. ``awa callbacks serve`` remains as a hidden, deprecated alias of ``awa callback serve``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import click

import awa
from awa.callbacks import DEFAULT_TIMEOUT, DefaultAction, ResolveResult
from awa.callbacks import contract as callback_contract
from awa.cli.group import (
    RUN_LEASE,
    SECONDS,
    CliError,
    database_url_from_context,
    format_time,
    json_client,
    load_client,
    main,
    print_json,
    report,
)
from awa.core.extras import require_extra
from awa.model import JobRow

# awa callback ... ---------------------------------------------------------------------------


@main.group()
def callback() -> None:
    """Answer external callbacks: by hand, or over HTTP with `serve`.

    A job that waits for another system (a payment provider, an approval) registers a
    callback and parks in waiting_external, or waits inside its handler. ID is the
    callback id it registered: `awa job get JOB_ID` shows it as "callback id". An answer
    for a callback no job holds (answered already, replaced, timed out, or another
    attempt's with --run-lease) ends with "callback not found".

    complete, fail, retry, resume, resolve and heartbeat change the job's row only, like
    `awa job`: no lifecycle hook and no follow-up job fires. Hooks and follow-ups live in
    your AsyncClient; to fire them, answer through it (client.complete_external(...)) or
    run `awa callback serve MODULE:CLIENT`.
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
    type=RUN_LEASE,
    metavar="N",
    help="Only if the job's attempt still has this run lease.",
)


def _payload_answer(f: Callable[..., None]) -> Callable[..., None]:
    """The options of an answer carrying a payload: ``--payload``, ``--run-lease``,
    ``--json`` (and the client)."""
    return payload_option(lease_option(json_client(f)))


def _report(row: JobRow, as_json: bool, note: str = "") -> None:
    report(as_json, row, f"job {row.id} is now {row.state.value}{note}")


@callback.command("complete")
@click.argument("callback_id", metavar="ID")
@_payload_answer
def complete(
    client: awa.Client, callback_id: str, payload: str | None, run_lease: int | None, as_json: bool
) -> None:
    """Complete the job holding callback ID.

    The job, parked or waiting in its handler, ends completed; the --payload, if given,
    becomes its output. A handler waiting in job.wait_for_callback() gets
    CallbackWaitError. Fires nothing: no Completed event, no on_completed_enqueue
    follow-up.
    """
    with client.connection() as conn:
        row = awa.admin.complete_external(conn, callback_id, _payload(payload), run_lease)
    _report(row, as_json)


@callback.command("fail")
@click.argument("callback_id", metavar="ID")
@click.option("--error", "error", required=True, help="Why it failed (kept in the job's errors).")
@lease_option
@json_client
def fail(
    client: awa.Client, callback_id: str, error: str, run_lease: int | None, as_json: bool
) -> None:
    """Fail the job holding callback ID, for good.

    The job ends failed, with no further attempt; --error is recorded in its errors as a
    terminal error. Fires nothing: no Exhausted event, no on_exhausted_enqueue follow-up.
    """
    with client.connection() as conn:
        row = awa.admin.fail_external(conn, callback_id, error, run_lease)
    _report(row, as_json)


@callback.command("retry")
@click.argument("callback_id", metavar="ID")
@lease_option
@json_client
def retry(client: awa.Client, callback_id: str, run_lease: int | None, as_json: bool) -> None:
    """Run the job parked on callback ID again, from attempt 0.

    Parked jobs only: the job becomes available now with a fresh attempt budget, and its
    callback is dropped (the ID is no longer found). Fires nothing: no Retried event, no
    on_retried_enqueue follow-up.
    """
    with client.connection() as conn:
        row = awa.admin.retry_external(conn, callback_id, run_lease)
    _report(row, as_json)


@callback.command("resume")
@click.argument("callback_id", metavar="ID")
@_payload_answer
def resume(
    client: awa.Client, callback_id: str, payload: str | None, run_lease: int | None, as_json: bool
) -> None:
    """Hand a payload to the job holding callback ID; it goes on.

    A handler waiting in job.wait_for_callback() continues with the --payload. A job
    parked by WaitForCallback becomes available (the attempt is given back), runs again and
    finds the payload in job.callback_result. Resuming fires nothing itself; the job's next
    outcome fires its events in the worker as usual.
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
@json_client
def resolve(
    client: awa.Client,
    callback_id: str,
    payload: str | None,
    default_action: DefaultAction,
    run_lease: int | None,
    as_json: bool,
) -> None:
    """Let the callback's CEL expressions decide on the payload.

    Completes, fails or ignores the job holding callback ID. The expressions the job
    registered are evaluated against the --payload: a false filter ignores it, a true
    on_fail fails the job, a true on_complete completes it with transform(payload) as its
    output. When the job registered no expression, or none matched, --default-action
    decides; "ignore" leaves the job parked. Prints the outcome and why. Fires nothing: no
    event, no follow-up.
    """
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
    type=SECONDS,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="The new timeout, from now.",
)
@json_client
def heartbeat(client: awa.Client, callback_id: str, timeout_seconds: float, as_json: bool) -> None:
    """Move the callback's timeout to SECONDS from now.

    The timeout of the job parked on callback ID moves to --timeout SECONDS from now. For an
    answer known to be still coming: the job stays parked with the same callback,
    and is rescued only if no answer arrives by the new time. Parked jobs only. Fires
    nothing.
    """
    with client.connection() as conn:
        row = awa.admin.heartbeat_callback(conn, callback_id, timeout_seconds)
    _report(row, as_json, f"; its callback times out at {format_time(row.callback_timeout_at)}")


# awa callback serve ---------------------------------------------------------------------------


def _contract_secret(ctx: click.Context, param: click.Parameter, value: str | None) -> bytes | None:
    if not value:
        return None
    try:
        return callback_contract.parse_secret(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


@callback.command("serve")
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
@click.option(
    "--callback-hmac-secret",
    "contract_secret",
    envvar=callback_contract.SECRET_ENV_VAR,
    show_envvar=True,
    metavar="HEX",
    callback=_contract_secret,
    help="Also serve awa-pg's contract: POST CONTRACT_PREFIX/ID/complete|fail|heartbeat "
    "signed with X-Awa-Signature, the keyed BLAKE3 hash of ID under this 32-byte key "
    "(64 hex characters). Every such request must be signed.",
)
@click.option(
    "--contract-prefix",
    "--path-prefix",
    "contract_prefix",
    envvar=callback_contract.PATH_PREFIX_ENV_VAR,
    show_envvar=True,
    default=callback_contract.DEFAULT_PATH_PREFIX,
    show_default=True,
    help="Path prefix of awa-pg's contract routes.",
)
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
    contract_secret: bytes | None,
    contract_prefix: str,
    log_level: str,
) -> None:
    """Answer callbacks over HTTP (the receiver for webhooks).

    Needs the http extra: pip install 'awa-py[http]'.

    Runs until interrupted (Ctrl-C or SIGTERM). Serves POST
    PREFIX/ID/complete|fail|retry|resume|resolve|heartbeat (PREFIX is --prefix, /callbacks
    by default), each doing what the command of the same name does, with a JSON body such as
    {"payload": ...}.

    With MODULE:CLIENT (an awa.AsyncClient, e.g. myapp.jobs:client) answers go through that
    client: its lifecycle hooks run and its follow-up jobs are inserted in the answer's
    transaction. Without it a plain client makes the same transitions and fires nothing.

    Requests must be signed with the shared --secret (HMAC-SHA256; see
    docs/callbacks.md) unless --allow-unsigned is given.

    --callback-hmac-secret (or AWA_CALLBACK_HMAC_SECRET) adds the routes of awa-pg's HTTP
    workers, /api/callbacks/ID/complete|fail|heartbeat, always signed with that key; given
    without --secret or --allow-unsigned, the server answers those routes only.
    """
    if not secret and not allow_unsigned and contract_secret is None:
        raise click.UsageError(
            "give --secret (or AWA_CALLBACK_SECRET), or --allow-unsigned, or "
            "--callback-hmac-secret (or AWA_CALLBACK_HMAC_SECRET) for awa-pg's contract only"
        )
    require_extra("http", "awa callback serve")
    import uvicorn

    from awa.callbacks.http import create_app

    url = database_url_from_context(ctx)
    if target is not None:
        if url:
            os.environ["DATABASE_URL"] = url  # a client built without a URL reads it
        client = load_client(target)
    else:
        client = awa.AsyncClient(url, application_name="awa-callbacks")
    try:
        app = create_app(
            client,
            secret=secret or None,
            allow_unsigned=allow_unsigned,
            prefix=prefix,
            contract_secret=contract_secret,
            contract_prefix=contract_prefix,
        )
    except ValueError as error:
        raise CliError(str(error)) from error
    signing = "signed requests" if secret else "UNSIGNED requests"
    if secret and allow_unsigned:
        signing = "signed and unsigned requests"
    # create_app lists the native route first, then the contract's.
    served = [signing] if secret or allow_unsigned else []
    if contract_secret is not None:
        served.append("awa-pg contract, signed requests")
    for route, what in zip(app.routes, served, strict=True):
        path = route.path  # type: ignore[attr-defined]
        click.echo(f"awa callback receiver on http://{host}:{port}{path} ({what})", err=True)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off")
    asyncio.run(_serve(uvicorn.Server(config), client))


# The name of the first release, kept out of the help: `awa callbacks serve`.


@main.group(hidden=True)
def callbacks() -> None:
    """Deprecated: use `awa callback serve`."""


@callbacks.command("serve", params=list(serve.params), help="Deprecated: use `awa callback serve`.")
@click.pass_context
def deprecated_serve(ctx: click.Context, /, **options: Any) -> None:
    click.echo("awa: `awa callbacks serve` is deprecated; use `awa callback serve`", err=True)
    ctx.forward(serve)


async def _serve(server: Any, client: awa.AsyncClient) -> None:
    try:
        await client.pool()  # fail now, not on the first request, if the database is down
        await server.serve()
    finally:
        await client.close()
