"""``awa workflow``: show a workflow (or batch) with its jobs' states and dependencies, and
cancel what is unfinished of it."""

from __future__ import annotations

import click

import awa
from awa.cli import group as cli


@cli.main.group()
def workflow() -> None:
    """Workflows and batches: jobs inserted together with dependencies between them."""


@workflow.command("get")
@click.argument("workflow_id")
@cli.json_client
def get(client: awa.Client, workflow_id: str, as_json: bool) -> None:
    """Show every job of WORKFLOW_ID (a UUID) with its state and the jobs it waits for."""
    info = client.get_workflow(workflow_id)
    if as_json:
        cli.print_json(
            {
                "id": str(info.id),
                "name": info.name,
                "states": info.states(),
                "jobs": [
                    {**cli.to_jsonable(entry.job), "depends_on": entry.depends_on}
                    for entry in info.jobs
                ],
            }
        )
        return
    if not info.jobs:
        raise click.ClickException(f"no workflow {workflow_id} (or its jobs left after retention)")
    click.echo(
        f"workflow {info.name or ''} {info.id}: "
        + ", ".join(f"{n} {state}" for state, n in info.states().items())
    )
    cli.print_table(
        ["ID", "KIND", "QUEUE", "STATE", "AFTER"],
        [
            [
                str(entry.job.id),
                entry.job.kind,
                entry.job.queue,
                entry.job.state.value,
                ", ".join(str(parent) for parent in entry.depends_on),
            ]
            for entry in info.jobs
        ],
    )


@workflow.command("cancel")
@click.argument("workflow_id")
@cli.json_client
def cancel(client: awa.Client, workflow_id: str, as_json: bool) -> None:
    """Cancel every unfinished job of WORKFLOW_ID (blocked ones included)."""
    count = client.cancel_workflow(workflow_id)
    cli.report(as_json, {"cancelled": count}, f"cancelled {count} job(s)")
