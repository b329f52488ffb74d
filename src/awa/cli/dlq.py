"""``awa dlq``: list, show, retry and purge dead-letter queue entries, and count them."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

import awa
from awa.cli import group as cli
from awa.dlq.operations import DlqEntry


@cli.main.group()
def dlq() -> None:
    """The dead-letter queue: jobs of DLQ-enabled queues that failed for good.

    Retrying puts a job back into its queue under the same id; purging deletes it. These
    commands change rows only: no lifecycle hooks or follow-up jobs fire.
    """


class Timestamp(click.ParamType[dt.datetime]):
    """An ISO 8601 time with its timezone (``2024-05-01T12:00:00Z``)."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            parsed = dt.datetime.fromisoformat(str(value))
        except ValueError:
            raise cli.CliUsageError(f"{value!r} is not an ISO 8601 time") from None
        if parsed.tzinfo is None:
            raise cli.CliUsageError(
                f"{value!r} has no timezone; add one, e.g. {value}Z for UTC or {value}+02:00"
            )
        return parsed


TIME = Timestamp()


@dlq.command("list")
@click.option("--kind", type=cli.KIND, help="Only entries of this kind.")
@click.option("--queue", type=cli.QUEUE, help="Only entries of this queue.")
@click.option("--tag", type=cli.TAG, help="Only entries with this tag.")
@click.option("--before-id", type=cli.JOB_ID, metavar="ID", help="Page cursor: the last id shown.")
@click.option(
    "--before-dlq-at", type=TIME, metavar="TIME", help="Page cursor: the last DLQ_AT shown."
)
@cli.limit_option("entries")
@cli.json_client
def list_entries(
    client: awa.Client,
    kind: str | None,
    queue: str | None,
    tag: str | None,
    before_id: int | None,
    before_dlq_at: dt.datetime | None,
    limit: int,
    as_json: bool,
) -> None:
    """List entries, newest first."""
    entries = client.list_dlq(
        kind=kind,
        queue=queue,
        tag=tag,
        before_id=before_id,
        before_dlq_at=before_dlq_at,
        limit=limit,
    )
    if cli.json_or_empty(as_json, entries, "the dead-letter queue holds no matching jobs"):
        return
    headers = ["ID", "KIND", "QUEUE", "REASON", "ATTEMPT/MAX", "DLQ_AT", "ERROR"]
    cli.print_table(headers, [_cells(entry) for entry in entries])
    if len(entries) == limit:
        last = entries[-1]
        click.echo(
            f"(showing {limit}; next page: --before-id {last.job.id} "
            f"--before-dlq-at {last.dlq_at.isoformat()})",
            err=True,
        )


def _last_error(job: awa.JobRow) -> str:
    if not job.errors:
        return "-"
    line = str(job.errors[-1].get("error", "")).splitlines()
    text = line[0] if line else ""
    return text if len(text) <= 60 else text[:59] + "…"


def _cells(entry: DlqEntry) -> list[object]:
    job = entry.job
    attempts = f"{job.attempt}/{job.max_attempts}"
    return [
        job.id,
        job.kind,
        job.queue,
        entry.reason,
        attempts,
        cli.format_time(entry.dlq_at),
        _last_error(job),
    ]


@dlq.command("get", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="ID", type=cli.JOB_ID)
@cli.json_client
def get_entry(client: awa.Client, job_id: int, as_json: bool) -> None:
    """Show one entry in full: why and when it was moved, the job and its errors."""
    entry = client.get_dlq_job(job_id)
    if entry is None:
        cli.fail(f"job {job_id} is not in the dead-letter queue")
    if as_json:
        cli.print_json(entry)
        return
    job = entry.job
    fields: list[tuple[str, object]] = [
        ("id", job.id),
        ("kind", job.kind),
        ("queue", job.queue),
        ("reason", entry.reason),
        ("dlq at", cli.format_time(entry.dlq_at)),
        ("attempt", f"{job.attempt}/{job.max_attempts}"),
        ("priority", job.priority),
        ("run lease", entry.original_run_lease),
        ("tags", ", ".join(job.tags) or "-"),
        ("created at", cli.format_time(job.created_at)),
        ("failed at", cli.format_time(job.finalized_at)),
    ]
    for label, value in fields:
        click.echo(f"{label:<12}{value}")
    for label, data in (("args", job.args), ("metadata", job.metadata)):
        text = json.dumps(cli.to_jsonable(data), indent=2, ensure_ascii=False, default=str)
        click.echo(f"{label}:\n  " + text.replace("\n", "\n  "))
    click.echo(f"errors ({len(job.errors)}):" if job.errors else "errors: none")
    for error in job.errors:
        terminal = " (terminal)" if error.get("terminal") else ""
        message = str(error.get("error", "")).replace("\n", "\n      ")
        click.echo(f"  attempt {error.get('attempt', '?')}{terminal}:\n      {message}")


def _bulk_scope(kind: str | None, queue: str | None, tag: str | None) -> str:
    filters = (("kind", kind), ("queue", queue), ("tag", tag))
    return ", ".join(f"{name} {value}" for name, value in filters if value) or "every entry"


@dlq.command("retry", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="[ID]", type=cli.JOB_ID, required=False)
@click.option("--run-at", type=TIME, metavar="TIME", help="With ID: run it then, not now.")
@click.option("--priority", type=click.IntRange(1, 4), help="With ID: run it at this priority.")
@click.option(
    "--to-queue", type=cli.QUEUE, metavar="QUEUE", help="With ID: run it in this queue instead."
)
@click.option("--kind", type=cli.KIND, help="Without ID: retry every entry of this kind.")
@click.option("--queue", type=cli.QUEUE, help="Without ID: retry every entry of this queue.")
@click.option("--tag", type=cli.TAG, help="Without ID: retry every entry with this tag.")
@click.option("--all", "every", is_flag=True, help="Without ID: retry every entry.")
@cli.json_client
def retry(
    client: awa.Client,
    job_id: int | None,
    run_at: dt.datetime | None,
    priority: int | None,
    to_queue: str | None,
    kind: str | None,
    queue: str | None,
    tag: str | None,
    every: bool,
    as_json: bool,
) -> None:
    """Put jobs back into their queue, from a fresh attempt budget.

    Give an ID (with --run-at, --priority, --to-queue if you like), or filters (--kind,
    --queue, --tag) or --all to retry many. A job whose unique key another job holds stays
    in the dead-letter queue.
    """
    if job_id is not None:
        if kind or queue or tag or every:
            raise cli.CliUsageError(
                "give an ID or filters (--kind, --queue, --tag, --all), not both"
            )
        row = client.retry_from_dlq(job_id, run_at=run_at, priority=priority, queue=to_queue)
        if row is None:
            cli.fail(f"job {job_id} is not in the dead-letter queue")
        cli.report(as_json, row, f"job {row.id} is {row.state.value} again in queue {row.queue}")
        return
    if run_at is not None or priority is not None or to_queue is not None:
        raise cli.CliUsageError("--run-at, --priority and --to-queue apply to one ID")
    if not (kind or queue or tag or every):
        raise cli.CliUsageError("give an ID, or --kind, --queue, --tag or --all")
    count = client.bulk_retry_from_dlq(kind=kind, queue=queue, tag=tag, allow_all=every)
    cli.report(
        as_json, {"retried": count}, f"retried {count} job(s) ({_bulk_scope(kind, queue, tag)})"
    )


@dlq.command("purge", context_settings=cli.TAKES_JOB_ID)
@click.argument("job_id", metavar="[ID]", type=cli.JOB_ID, required=False)
@click.option("--kind", type=cli.KIND, help="Purge the entries of this kind.")
@click.option("--queue", type=cli.QUEUE, help="Purge the entries of this queue.")
@click.option("--tag", type=cli.TAG, help="Purge the entries with this tag.")
@click.option("--before", type=TIME, metavar="TIME", help="Only entries moved before TIME.")
@click.option("--all", "every", is_flag=True, help="Purge every entry (with --before: older).")
@cli.json_client
def purge(
    client: awa.Client,
    job_id: int | None,
    kind: str | None,
    queue: str | None,
    tag: str | None,
    before: dt.datetime | None,
    every: bool,
    as_json: bool,
) -> None:
    """Delete entries for good: one ID, or every entry matching the filters (--all for
    every entry)."""
    if job_id is not None:
        if kind or queue or tag or every or before is not None:
            raise cli.CliUsageError(
                "give an ID or filters (--kind, --queue, --tag, --all), not both"
            )
        if not client.purge_dlq_job(job_id):
            cli.fail(f"job {job_id} is not in the dead-letter queue")
        cli.report(as_json, {"purged": 1, "job_id": job_id}, f"purged job {job_id}")
        return
    if not (kind or queue or tag or every):
        raise cli.CliUsageError("give an ID, or --kind, --queue, --tag or --all")
    count = client.purge_dlq(kind=kind, queue=queue, tag=tag, before_dlq_at=before, allow_all=every)
    cli.report(
        as_json, {"purged": count}, f"purged {count} job(s) ({_bulk_scope(kind, queue, tag)})"
    )


@dlq.command("depth")
@click.option("--queue", type=cli.QUEUE, help="Count the entries of this queue only.")
@cli.json_client
def depth(client: awa.Client, queue: str | None, as_json: bool) -> None:
    """Count the entries, by queue."""
    if queue is not None:
        count = client.dlq_depth(queue=queue)
        cli.report(
            as_json,
            {"queue": queue, "depth": count},
            f"{count} job(s) in the dead-letter queue of {queue}",
        )
        return
    by_queue = client.dlq_depth_by_queue()
    total = sum(count for _, count in by_queue)
    if as_json:
        cli.print_json({"total": total, "queues": dict(by_queue)})
        return
    if not by_queue:
        click.echo("the dead-letter queue is empty")
        return
    cli.print_table(["QUEUE", "DEPTH"], [[name, count] for name, count in by_queue])
    click.echo(f"total {total}")
