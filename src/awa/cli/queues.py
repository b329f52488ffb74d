"""``awa queue``: queue depth; pause, resume and drain queues; their descriptors; live
overrides of their settings; depth limits."""

from __future__ import annotations

from typing import Any

import click

import awa
from awa.cli import group as cli
from awa.model import JobState
from awa.producer.backpressure import POLICIES


@cli.main.group()
def queue() -> None:
    """Show queue depth; pause, resume and drain queues; override their settings live;
    limit their depth."""


_STATS_STATES = [JobState.AVAILABLE, JobState.RUNNING, JobState.SCHEDULED, JobState.RETRYABLE]
_STATS_STATES += [JobState.WAITING_EXTERNAL, JobState.FAILED]


@queue.command("stats")
@cli.json_client
def queue_stats(client: awa.Client, as_json: bool) -> None:
    """Jobs per queue and state, the age of the oldest available job, pause status, and
    the fleet-wide flow limits with the due jobs each holds back now.

    WAITING counts jobs parked on a callback. LIMITS shows rate/burst per second, the cap
    on running jobs (cap) and the per-key limit (key); HELD BACK counts due jobs a limit
    keeps waiting. Completed and cancelled counts are in --json.
    """
    stats = client.queue_stats()
    if cli.json_or_empty(as_json, stats, "no queues yet"):
        return
    counted = [state.value.split("_")[0].upper() for state in _STATS_STATES]
    headers = ["QUEUE", *counted, "OLDEST AVAILABLE", "PAUSED"]
    limited = any(entry.limits is not None for entry in stats)
    if limited:
        headers += ["LIMITS", "HELD BACK"]
    rows = []
    for entry in stats:
        paused = "no"
        if entry.paused:
            paused = f"yes (by {entry.paused_by})" if entry.paused_by else "yes"
        counts = [entry.count(state) for state in _STATS_STATES]
        row = [entry.queue, *counts, cli.format_age(cli.lag_seconds(entry)), paused]
        if limited:
            row += [_describe_limits(entry.limits), _describe_held(entry.held_back)]
        rows.append(row)
    cli.print_table(headers, rows)


def _describe_limits(limits: awa.QueueLimits | None) -> str:
    if limits is None:
        return "-"
    parts = []
    if limits.rate is not None:
        parts.append(f"rate {limits.rate:g}/s burst {limits.burst}")
    if limits.global_max_running is not None:
        parts.append(f"cap {limits.global_max_running}")
    if limits.key_concurrency is not None:
        parts.append(f"key {limits.key_concurrency}")
    return ", ".join(parts)


def _describe_held(held: awa.HeldBack) -> str:
    parts = [
        f"{count} by {name}"
        for name, count in (("rate", held.rate), ("cap", held.cap), ("keys", held.keys))
        if count
    ]
    return ", ".join(parts) or "0"


@queue.command("pause")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@click.option(
    "--by",
    "paused_by",
    type=cli.TEXT,
    help="Who paused it (default: your user name; at most 200 characters).",
)
@cli.json_client
def pause_queue(client: awa.Client, name: str, paused_by: str | None, as_json: bool) -> None:
    """Stop workers from claiming jobs of QUEUE; running jobs finish. Inserts still work.

    A queue no job has used yet is paused too (ready for its first jobs), with a note to
    check the name; --json then says "known": false.
    """
    paused_by = paused_by or cli.current_user()
    with client.connection() as conn:
        known = awa.admin.queue_known(conn, name)
    client.pause_queue(name, paused_by=paused_by)
    if as_json:
        cli.print_json({"queue": name, "paused": True, "paused_by": paused_by, "known": known})
        return
    note = "" if known else " (no job has used this queue yet; check the name)"
    click.echo(f"queue {name} paused" + (f" by {paused_by}" if paused_by else "") + note)


@queue.command("resume")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@cli.json_client
def resume_queue(client: awa.Client, name: str, as_json: bool) -> None:
    """Let workers claim jobs of QUEUE again."""
    was_paused = client.resume_queue(name)
    if as_json:
        cli.print_json({"queue": name, "paused": False, "was_paused": was_paused})
    elif was_paused:
        click.echo(f"queue {name} resumed")
    else:
        click.echo(f"queue {name} was not paused")


@queue.command("drain")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@cli.json_client
def drain_queue(client: awa.Client, name: str, as_json: bool) -> None:
    """Cancel every job of QUEUE that waits to run or is parked on a callback.

    Running jobs finish their attempt.
    """
    count = client.drain_queue(name)
    cli.report(
        as_json, {"queue": name, "cancelled": count}, f"cancelled {count} job(s) in queue {name}"
    )


@queue.command("descriptors")
@click.argument("name", metavar="[QUEUE]", type=cli.QUEUE, required=False)
@cli.json_client
def queue_descriptors(client: awa.Client, name: str | None, as_json: bool) -> None:
    """What each queue is for: the descriptors workers declared (client.queue_descriptor)
    and stored when they started, blank for queues run without one.

    LIVE says whether a live worker runs the queue; LAST SEEN is when a worker last started
    with it or the leader saw it run. Descriptions, docs URLs and extra are in --json.
    """
    rows = client.list_queue_descriptors(queue=name)
    empty = "no queue descriptors yet (workers store them when they start)"
    cli.print_descriptors(rows, as_json, empty, ["QUEUE"], lambda row: [row.queue])


@queue.group("overrides")
def overrides() -> None:
    """Change a running fleet's settings of a queue without a restart (live overrides).

    Every worker running the queue applies them within seconds; clearing returns it to the
    settings it was started with. Each change is logged with who made it.
    """


NO_LIMIT = "none"
"""What the limit options take to remove the queue's configured limit."""


class _LimitOrNone(click.ParamType):  # type: ignore[type-arg]
    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower() == NO_LIMIT:
            return NO_LIMIT
        try:
            return int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not an integer or 'none'", param, ctx)


def _rate_limit_text(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[float, int] | str | None:
    if value is None:
        return None
    if value.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    rate, _, burst = value.partition("/")
    try:
        return float(rate), int(burst) if burst else 0
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not RATE, RATE/BURST (jobs per second, an integer burst) or 'none'"
        ) from None


def _describe_settings(settings: dict[str, object]) -> str:
    parts = []
    for name, value in settings.items():
        if name == "rate_limit" and isinstance(value, list):
            value = f"{value[0]:g}/s burst {value[1]}"
        elif value is None:
            value = "none (removed)"
        parts.append(f"{name}={value}")
    return ", ".join(parts) or "-"


@overrides.command("set")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@click.option(
    "--rate-limit",
    metavar="RATE[/BURST]|none",
    callback=_rate_limit_text,
    help="Jobs started per second (burst: at once); none: no rate limit.",
)
@click.option(
    "--global-max-running",
    type=_LimitOrNone(),
    metavar="N|none",
    help="Cap on running jobs; none: no cap.",
)
@click.option(
    "--key-concurrency",
    type=_LimitOrNone(),
    metavar="N|none",
    help="Running jobs per concurrency key; none: no per-key limit.",
)
@click.option("--claim-batch-size", type=int, metavar="N", help="Jobs one claim takes at most.")
@click.option("--poll-interval", type=float, metavar="SECONDS", help="Fallback poll.")
@click.option("--deadline", type=float, metavar="SECONDS", help="Attempt deadline (0: none).")
@click.option("--paused/--resumed", default=None, help="Pause the queue, or resume it.")
@click.option("--by", "changed_by", type=cli.TEXT, help="Who changes it (default: your user name).")
@cli.json_client
def set_overrides(
    client: awa.Client,
    name: str,
    rate_limit: tuple[float, int] | str | None,
    global_max_running: int | str | None,
    key_concurrency: int | str | None,
    claim_batch_size: int | None,
    poll_interval: float | None,
    deadline: float | None,
    paused: bool | None,
    changed_by: str | None,
    as_json: bool,
) -> None:
    """Override settings of QUEUE; the ones not given keep their current override."""
    given = {
        "rate_limit": rate_limit,
        "global_max_running": global_max_running,
        "key_concurrency": key_concurrency,
        "claim_batch_size": claim_batch_size,
        "poll_interval": poll_interval,
        "deadline_duration": deadline,
        "paused": paused,
    }
    settings = {
        key: None if value == NO_LIMIT else value
        for key, value in given.items()
        if value is not None
    }
    if not settings:
        raise click.UsageError("give at least one setting to override (see --help)")
    result = client.set_queue_overrides(name, settings, changed_by=changed_by or cli.current_user())
    _report_overrides(as_json, result)


@overrides.command("clear")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@click.argument("settings", metavar="[SETTING]...", nargs=-1)
@click.option("--by", "changed_by", type=cli.TEXT, help="Who changes it (default: your user name).")
@cli.json_client
def clear_overrides(
    client: awa.Client, name: str, settings: tuple[str, ...], changed_by: str | None, as_json: bool
) -> None:
    """Clear overridden settings of QUEUE (by name: rate_limit, global_max_running,
    key_concurrency, claim_batch_size, poll_interval, deadline_duration, paused; none: all
    of them), returning its workers to their configured settings. Clearing paused resumes
    the queue."""
    result = client.clear_queue_overrides(
        name, list(settings) or None, changed_by=changed_by or cli.current_user()
    )
    _report_overrides(as_json, result)


def _report_overrides(as_json: bool, result: awa.QueueOverrides) -> None:
    paused = ", paused" if result.paused else ""
    cli.report(
        as_json,
        result,
        f"queue {result.queue}: overrides {_describe_settings(result.settings)}{paused}",
    )


@overrides.command("show")
@click.argument("name", metavar="[QUEUE]", type=cli.QUEUE, required=False)
@cli.json_client
def show_overrides(client: awa.Client, name: str | None, as_json: bool) -> None:
    """The overridden (or paused) queues: their settings, and who changed them when."""
    rows = client.list_queue_overrides(name)
    if cli.json_or_empty(as_json, rows, "no queue overrides"):
        return
    cli.print_table(
        ["QUEUE", "OVERRIDES", "PAUSED", "CHANGED", "BY"],
        [
            [
                row.queue,
                _describe_settings(row.settings),
                "yes" if row.paused else "no",
                cli.format_time(row.updated_at),
                row.updated_by,
            ]
            for row in rows
        ],
    )


@overrides.command("log")
@click.argument("name", metavar="[QUEUE]", type=cli.QUEUE, required=False)
@cli.limit_option("changes")
@cli.json_client
def override_log(client: awa.Client, name: str | None, limit: int, as_json: bool) -> None:
    """The latest changes of overrides, newest first: who, when, before and after."""
    rows = client.queue_override_log(name, limit=limit)
    if cli.json_or_empty(as_json, rows, "no changes of queue overrides yet"):
        return
    cli.print_table(
        ["WHEN", "QUEUE", "BY", "ACTION", "BEFORE", "AFTER"],
        [
            [
                cli.format_time(row.changed_at),
                row.queue,
                row.changed_by,
                row.action,
                _describe_settings(row.old),
                _describe_settings(row.new),
            ]
            for row in rows
        ],
    )


_POLICY_HELP = (
    "signal (the default): inserts succeed and producers are told the queue is over its "
    "limit; reject: inserts raise QueueOverLimit (and roll back the producer's transaction)."
)


@queue.command("limit-depth")
@click.argument("name", metavar="QUEUE", type=cli.QUEUE)
@click.option(
    "--max-depth",
    type=int,
    help="Jobs waiting or running (available, scheduled, retryable, running) the queue may "
    "hold; a positive integer.",
)
@click.option("--policy", type=click.Choice(POLICIES), default="signal", help=_POLICY_HELP)
@click.option("--clear", is_flag=True, help="Remove the queue's depth limit.")
@cli.json_client
def limit_depth(
    client: awa.Client,
    name: str,
    max_depth: int | None,
    policy: str,
    clear: bool,
    as_json: bool,
) -> None:
    """Set (--max-depth) or remove (--clear) QUEUE's depth limit (backpressure).

    Producers read the depth from the maintenance leader's sample, so a limit acts within
    a few seconds and may be passed by what is inserted meanwhile; see docs/backpressure.md.
    """
    if clear == (max_depth is not None):
        raise click.UsageError("give either --max-depth N or --clear")
    if clear:
        cleared = client.clear_queue_depth_limit(name)
        text = (
            f"queue {name}: depth limit removed" if cleared else f"queue {name} had no depth limit"
        )
        cli.report(as_json, {"queue": name, "cleared": cleared}, text)
        return
    client.set_queue_depth_limit(name, max_depth, policy=policy)  # type: ignore[arg-type]
    text = f"queue {name}: depth limit {max_depth} ({policy})"
    cli.report(as_json, {"queue": name, "max_depth": max_depth, "policy": policy}, text)


@queue.command("depth-limits")
@cli.json_client
def depth_limits(client: awa.Client, as_json: bool) -> None:
    """Each queue's depth limit, its policy and its depth in the leader's last sample.

    OVER says whether the sampled depth is at or over the limit; SAMPLED is how long ago the
    leader counted it (-: no live job in the queue when it last looked, or no leader).
    """
    rows = client.list_queue_depth_limits()
    if cli.json_or_empty(as_json, rows, "no depth limits"):
        return
    table = [
        [
            row.queue,
            row.limit,
            row.policy,
            row.depth,
            "yes" if row.over else "no",
            cli.format_age(row.sample_age),
        ]
        for row in rows
    ]
    cli.print_table(["QUEUE", "MAX DEPTH", "POLICY", "DEPTH", "OVER", "SAMPLED"], table)
