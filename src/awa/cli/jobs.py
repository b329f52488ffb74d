"""``awa job``: list, show, cancel and retry jobs."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

import awa
from awa.cli import group as cli
from awa.model import JobRow, JobState, parse_state


@cli.main.group()
def job() -> None:
    """Inspect, cancel and retry jobs.

    These commands change rows only: no lifecycle hooks or follow-up jobs fire.
    """


_STATE_CHOICE = cli.Checked(
    "state", lambda value: parse_state(value.lower() if isinstance(value, str) else value).value
)
_STATE_NAMES = ", ".join(state.value for state in JobState)


@job.command("list")
@click.option(
    "--state", type=_STATE_CHOICE, metavar="STATE", help=f"Only jobs in this state: {_STATE_NAMES}."
)
@click.option("--kind", type=cli.KIND, help="Only jobs of this kind.")
@click.option("--queue", type=cli.QUEUE, help="Only jobs in this queue.")
@cli.limit_option("jobs")
@cli.json_client
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
    if cli.json_or_empty(as_json, jobs, "no jobs found"):
        return
    headers = ["ID", "KIND", "QUEUE", "STATE", "ATTEMPT/MAX", "PRIORITY", "RUN_AT"]
    cli.print_table(headers, [_job_cells(row) for row in jobs])
    if len(jobs) == limit:
        click.echo(f"(showing the newest {limit}; raise --limit to see more)", err=True)


def _job_cells(row: JobRow) -> list[object]:
    attempts, run_at = f"{row.attempt}/{row.max_attempts}", cli.format_time(row.run_at)
    return [row.id, row.kind, row.queue, row.state.value, attempts, row.priority, run_at]


def _json_block(value: Any) -> str:
    text = json.dumps(cli.to_jsonable(value), indent=2, ensure_ascii=False, default=str)
    return text.replace("\n", "\n  ")


def _error_time(value: object) -> str:
    try:
        return cli.format_time(dt.datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def _describe(row: JobRow) -> None:
    now = dt.datetime.now(dt.UTC)

    def when(value: dt.datetime | None) -> str:
        if value is None:
            return "-"
        delta = (value - now).total_seconds()
        relative = f"in {cli.format_age(delta)}" if delta > 0 else f"{cli.format_age(-delta)} ago"
        return f"{cli.format_time(value)} ({relative})"

    deadline = "-"
    if row.deadline_duration is not None:
        deadline = cli.format_age(row.deadline_duration.total_seconds())
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
        ("unique key", cli.to_jsonable(row.unique_key)),
        ("unique states", row.unique_states),
        ("ordering key", cli.to_jsonable(row.ordering_key)),
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
        click.echo(f"{label:<17}{'-' if value is None else cli.visible(str(value))}")
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
            message = cli.visible(str(entry["error"]), keep="\n").replace("\n", "\n      ")
            click.echo(f"  attempt {entry.get('attempt', '?')} at {stamp}{terminal}:")
            click.echo(f"      {message}")
        else:
            click.echo(f"  {_json_block(entry)}")


@job.command("get", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=cli.JOB_ID)
@cli.json_client
def get_job(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Show one job in full.

    Every field, the error history of its attempts, progress and metadata.
    """
    row = client.get_job(job_id)
    if row is None:
        cli.fail(f"job {job_id} not found")
    if as_json:
        cli.print_json(row)
    else:
        _describe(row)


def _report_change(
    client: awa.Client, job_id: int, row: JobRow | None, as_json: bool, rule: str, note: str = ""
) -> None:
    """Print the changed row, or say why there is none (unknown id, or the rule it broke)."""
    if row is None:
        current = client.get_job(job_id)
        if current is None:
            cli.fail(f"job {job_id} not found")
        cli.fail(f"job {job_id} is {current.state.value}; {rule}")
    cli.report(as_json, row, f"job {row.id} is now {row.state.value}{note}")


@job.command("cancel", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=cli.JOB_ID)
@cli.json_client
def cancel_job(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Cancel a job that has not finished.

    A running attempt is told to stop; whatever it writes afterwards is ignored.
    """
    row = client.cancel(job_id)
    _report_change(client, job_id, row, as_json, "only unfinished jobs can be cancelled")


@job.command("retry", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=cli.JOB_ID)
@cli.json_client
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
@click.option("--kind", type=cli.KIND, help="Retry the failed jobs of this kind.")
@click.option("--queue", type=cli.QUEUE, help="Retry the failed jobs of this queue.")
@cli.json_option
@click.pass_context
def retry_failed(ctx: click.Context, kind: str | None, queue: str | None, as_json: bool) -> None:
    """Retry every failed job of a kind or a queue.

    Give exactly one of --kind and --queue.
    """
    if (kind is None) == (queue is None):
        raise click.UsageError("give exactly one of --kind or --queue")
    jobs = cli.client_from_context(ctx).retry_failed(kind=kind, queue=queue)
    if as_json:
        cli.print_json({"retried": len(jobs), "job_ids": [row.id for row in jobs]})
    else:
        scope = f"kind {kind}" if kind is not None else f"queue {queue}"
        click.echo(f"retried {len(jobs)} failed job(s) of {scope}")


@job.command("discard")
@click.option(
    "--kind", type=cli.KIND, required=True, help="The kind whose failed jobs are deleted."
)
@cli.json_client
def discard_failed(client: awa.Client, kind: str, as_json: bool) -> None:
    """Delete every failed job of a kind, for good."""
    count = client.discard_failed(kind)
    cli.report(
        as_json, {"discarded": count, "kind": kind}, f"deleted {count} failed job(s) of kind {kind}"
    )


@job.command("kinds")
@click.argument("kind", metavar="[KIND]", type=cli.KIND, required=False)
@cli.json_client
def job_kinds(client: awa.Client, kind: str | None, as_json: bool) -> None:
    """The job kinds workers registered or described (client.job_kind_descriptor), with
    their descriptors and the queue of their task.

    LIVE says whether a live worker runs that queue; LAST SEEN is when a worker last started
    with the kind or the leader saw its queue run. Descriptions, docs URLs and extra are in
    --json.
    """
    rows = client.list_job_kind_descriptors(kind=kind)
    empty = "no job kinds yet (workers store them when they start)"
    cli.print_descriptors(
        rows, as_json, empty, ["KIND", "QUEUE"], lambda row: [row.kind, row.queue]
    )
