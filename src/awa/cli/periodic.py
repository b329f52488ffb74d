"""``awa periodic`` (also ``awa cron``, its first name): list, pause, resume, trigger and
remove periodic jobs."""

from __future__ import annotations

import click

import awa
from awa.cli import group as cli


@cli.main.group()
def periodic() -> None:
    """List and operate the periodic jobs (awa cron is the same command).

    Periodic jobs are declared in code with client.periodic() and stored when a worker
    starts; the maintenance leader enqueues one job per fire of their cron expressions.
    """


cli.main.add_command(periodic, "cron")  # the first name, kept


@periodic.command("list")
@cli.json_client
def list_periodic(client: awa.Client, as_json: bool) -> None:
    """Every stored schedule: expression, zone, next and last fire, paused or not, and
    why it cannot fire (ERROR: an expression or zone this version refuses, or one that
    never fires; the leader skips it and fires the others)."""
    schedules = client.list_cron_jobs()
    if cli.json_or_empty(
        as_json, schedules, "no periodic jobs (declare them with client.periodic())"
    ):
        return
    headers = ["NAME", "CRON", "TIMEZONE", "KIND", "QUEUE", "NEXT FIRE", "LAST FIRE"]
    headers += ["PAUSED", "ERROR"]
    rows = [
        [
            entry.name,
            entry.cron_expr,
            entry.timezone,
            entry.kind,
            entry.queue,
            cli.format_time(entry.next_fire_at),
            cli.format_time(entry.last_enqueued_at),
            f"yes (by {entry.paused_by})"
            if entry.paused and entry.paused_by
            else ("yes" if entry.paused else "no"),
            entry.error,
        ]
        for entry in schedules
    ]
    cli.print_table(headers, rows)


@periodic.command("pause")
@click.argument("name")
@click.option("--by", "paused_by", help="Who paused it (default: your user name).")
@cli.json_client
def pause(client: awa.Client, name: str, paused_by: str | None, as_json: bool) -> None:
    """Stop NAME's fires until it is resumed (its history stays)."""
    paused_by = paused_by or cli.current_user()
    if not client.pause_cron_job(name, paused_by=paused_by):
        cli.fail(f"no periodic job named {name!r}")
    cli.report(
        as_json,
        {"name": name, "paused": True, "paused_by": paused_by},
        f"periodic job {name} paused",
    )


@periodic.command("resume")
@click.argument("name")
@cli.json_client
def resume(client: awa.Client, name: str, as_json: bool) -> None:
    """Let NAME fire again. The fires it missed while paused follow its missed-fire policy:
    coalesce enqueues the latest one, catch_up each of them."""
    if not client.resume_cron_job(name):
        cli.fail(f"no periodic job named {name!r}")
    cli.report(as_json, {"name": name, "paused": False}, f"periodic job {name} resumed")


@periodic.command("trigger")
@click.argument("name")
@cli.json_client
def trigger(client: awa.Client, name: str, as_json: bool) -> None:
    """Enqueue NAME's job now, even when paused, without moving its schedule."""
    job = client.trigger_cron_job(name)
    if job is None:
        cli.fail(f"no periodic job named {name!r}")
    cli.report(as_json, job, f"enqueued job {job.id} ({job.kind}) in queue {job.queue}")


@periodic.command("remove")
@click.argument("name")
@cli.json_client
def remove(client: awa.Client, name: str, as_json: bool) -> None:
    """Delete NAME's schedule. A worker whose code still declares it stores it again when
    it starts: remove it from the code too."""
    if not client.delete_cron_job(name):
        cli.fail(f"no periodic job named {name!r}")
    cli.report(as_json, {"name": name, "removed": True}, f"periodic job {name} removed")
