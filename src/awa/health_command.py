"""``awa health``: is the queue healthy, who leads maintenance, and how far behind each
queue is. Exit code 0 when healthy, 1 otherwise (scripts and probes can rely on it)."""

from __future__ import annotations

from typing import Any

import click

import awa
from awa.cli import (
    database_url_from_context,
    format_age,
    format_time,
    json_option,
    main,
    print_json,
    print_table,
    to_jsonable,
)
from awa.health import HealthCheck
from awa.model import JobState

_COUNTED = [JobState.AVAILABLE, JobState.RUNNING, JobState.SCHEDULED, JobState.RETRYABLE]


def health_json(check: HealthCheck) -> dict[str, Any]:
    """The health check as JSON types (``to_jsonable`` plus each queue's lag)."""
    data: dict[str, Any] = to_jsonable(check)
    for entry, stats in zip(data["queues"], check.queues, strict=True):
        entry["lag_seconds"] = _lag(stats)
    return data


def _lag(stats: awa.QueueStats) -> float | None:
    """How long the oldest available job has waited (None: nothing available)."""
    return stats.oldest_available_age if stats.oldest_available_at is not None else None


def _print_text(check: HealthCheck) -> None:
    click.echo("healthy" if check.healthy else "unhealthy")
    for problem in check.problems:
        click.echo(f"  problem: {problem}")
    if not check.postgres_connected:
        return
    click.echo(
        f"schema:  version {check.schema_version} (expected {check.expected_schema_version})"
    )
    leader = check.leader
    if leader is None:
        click.echo("leader:  none")
    else:
        where = f" from {leader.client_addr}" if leader.client_addr else ""
        click.echo(
            f"leader:  backend pid {leader.pid} ({leader.application_name or 'no name'}{where}),"
            f" connected since {format_time(leader.since)}"
        )
    if not check.queues:
        click.echo("queues:  none yet")
        return
    click.echo("")
    headers = ["QUEUE", *(state.value.upper() for state in _COUNTED)]
    headers += ["LAG", "OLDEST AVAILABLE", "PAUSED"]
    rows = [
        [
            stats.queue,
            *(stats.count(state) for state in _COUNTED),
            format_age(_lag(stats)),
            format_time(stats.oldest_available_at),
            "yes" if stats.paused else "no",
        ]
        for stats in check.queues
    ]
    print_table(headers, rows)


@main.command()
@json_option
@click.pass_context
def health(ctx: click.Context, as_json: bool) -> None:
    """Say whether awa is healthy: the database answers with the current schema and a worker
    holds the maintenance lock. Shows the leader and, per queue, the jobs waiting, the lag
    (how long the oldest available job has waited) and when that job became due.

    Exits with code 1 when unhealthy.
    """
    with awa.Client(
        database_url_from_context(ctx), max_connections=1, application_name="awa-cli"
    ) as client:
        check = client.health_check()
    if as_json:
        print_json(health_json(check))
    else:
        _print_text(check)
    if not check.healthy:
        ctx.exit(1)
