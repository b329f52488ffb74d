"""``awa health``: is the queue healthy, who leads maintenance, which workers run which
queues, and how far behind each queue is. The exit code says the status (scripts and probes
can rely on it): 0 healthy, 1 unhealthy, 2 degraded (a queue or a kind is unserved),
3 unreachable."""

from __future__ import annotations

from typing import Any

import click

import awa
from awa.cli.group import (
    SECONDS,
    database_url_from_context,
    format_age,
    format_time,
    json_option,
    lag_seconds,
    main,
    print_json,
    print_table,
    to_jsonable,
)
from awa.model import JobState
from awa.observability.health import DEFAULT_UNSERVED_AFTER, HealthCheck

EXIT_CODES = {"healthy": 0, "unhealthy": 1, "degraded": 2, "unreachable": 3}

_COUNTED = [JobState.AVAILABLE, JobState.RUNNING, JobState.SCHEDULED, JobState.RETRYABLE]


def health_json(check: HealthCheck) -> dict[str, Any]:
    """The health check as JSON types (``to_jsonable`` plus each queue's lag)."""
    data: dict[str, Any] = to_jsonable(check)
    for entry, stats in zip(data["queues"], check.queues, strict=True):
        entry["lag_seconds"] = lag_seconds(stats)
    return data


def _print_text(check: HealthCheck) -> None:
    click.echo(check.status)
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
    if check.workers:
        click.echo(f"workers: {len(check.workers)} live")
        for worker in check.workers:
            queues = ", ".join(
                f"{name}={worker.concurrency.get(name, '?')}" for name in worker.queues
            )
            leads = " (leader)" if worker.is_leader else ""
            click.echo(
                f"  {worker.hostname} pid {worker.pid}{leads}: {queues}; "
                f"heartbeat {format_time(worker.heartbeat_at)}"
            )
    else:
        click.echo("workers: none")
    if not check.queues:
        click.echo("queues:  none yet")
        return
    click.echo("")
    headers = ["QUEUE", *(state.value.upper() for state in _COUNTED)]
    headers += ["LAG", "OLDEST AVAILABLE", "PAUSED", "SERVED"]
    served = {name for worker in check.workers for name in worker.queues}
    unserved = {item.queue for item in check.unserved}
    kinds_unserved = {item.queue for item in check.unserved_kinds}
    rows = [
        [
            stats.queue,
            *(stats.count(state) for state in _COUNTED),
            format_age(lag_seconds(stats)),
            format_time(stats.oldest_available_at),
            "yes" if stats.paused else "no",
            _served(stats.queue, served, unserved, kinds_unserved),
        ]
        for stats in check.queues
    ]
    print_table(headers, rows)


def _served(queue: str, served: set[str], unserved: set[str], kinds_unserved: set[str]) -> str:
    if queue in unserved:
        return "UNSERVED"
    if queue in kinds_unserved:
        return "NOT EVERY KIND"  # the problems above name the kinds
    return "yes" if queue in served else "no"


@main.command()
@click.option(
    "--unserved-after",
    type=SECONDS,
    default=DEFAULT_UNSERVED_AFTER,
    show_default=True,
    metavar="SECONDS",
    help="Report a queue unserved when its oldest available job has waited this long and "
    "no live worker runs it; a kind, when its oldest job on a queue has waited this long and "
    "no live worker of the queue has a handler for it.",
)
@json_option
@click.pass_context
def health(ctx: click.Context, unserved_after: float, as_json: bool) -> None:
    """Say whether awa is healthy: the database answers with the current schema, a worker
    holds the maintenance lock, and every queue with waiting jobs is run by a live worker
    that has a handler for their kinds.
    Shows the leader, the live workers and their queues and, per queue, the jobs waiting,
    the lag (how long the oldest available job has waited) and whether a worker serves it.

    Exit code: 0 healthy, 1 unhealthy (schema missing, no maintenance leader), 2 degraded
    (a queue or a kind is unserved), 3 the database is unreachable.
    """
    with awa.Client(
        database_url_from_context(ctx), max_connections=1, application_name="awa-cli"
    ) as client:
        check = client.health_check(unserved_after=unserved_after)
    if as_json:
        print_json(health_json(check))
    else:
        _print_text(check)
    ctx.exit(EXIT_CODES[check.status])
