"""Operator actions on periodic jobs (``awa.cron_jobs``), on any psycopg connection.

Like the rest of ``awa.admin`` (which re-exports them), each takes a blocking or an asyncio
connection and runs inside the caller's transaction if there is one. Schedules are declared
in code with ``client.periodic()`` and stored when the client starts; these actions list,
pause, resume, trigger and delete them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from awa.core.arguments import check_text
from awa.model import JobRow, MappingAccess, check_name
from awa.periodic.jobs import failure_text, next_fire_of
from awa.sql import query
from awa.storage.db import Statement, operation


@dataclasses.dataclass(frozen=True, slots=True)
class CronJob(MappingAccess):
    """A stored schedule. ``next_fire_at`` is its next fire after now (None while paused,
    or when it cannot fire); ``last_enqueued_at`` its last fire. ``error`` says why the
    schedule cannot fire (an expression or zone stored by another version or by hand that
    this version refuses, an expression that never fires, a zone this system lacks), else
    None: the leader skips such a schedule and fires the others."""

    name: str
    cron_expr: str
    timezone: str
    kind: str
    queue: str
    args: Any
    priority: int
    max_attempts: int
    tags: list[str]
    metadata: dict[str, Any]
    missed_fire_policy: str
    last_enqueued_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    paused_at: dt.datetime | None
    paused_by: str | None
    next_fire_at: dt.datetime | None
    error: str | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


_COMPUTED = ("next_fire_at", "error")
_FIELDS = tuple(field.name for field in dataclasses.fields(CronJob) if field.name not in _COMPUTED)


def _cron_jobs(rows: list[dict[str, Any]]) -> list[CronJob]:
    found = []
    for row in rows:
        next_fire = error = None
        last = row["last_enqueued_at"] or row["created_at"]
        try:
            # A paused schedule is checked too: resuming it should not be the surprise.
            fire = next_fire_of(row["cron_expr"], row["timezone"], max(last, row["now"]))
        except Exception as failure:  # whatever was stored: one row never hides the others
            error = failure_text(failure)
        else:
            next_fire = fire if row["paused_at"] is None else None
        values = {name: row[name] for name in _FIELDS}
        found.append(CronJob(**values, next_fire_at=next_fire, error=error))
    return found


def _name(name: object) -> str:
    return check_name("periodic job name", name)


@operation
def list_cron_jobs() -> Statement[list[CronJob]]:
    """Every stored schedule, by name."""
    return Statement(query("periodic_list"), None, _cron_jobs)


@operation
def pause_cron_job(name: str, *, paused_by: str | None = None) -> Statement[bool]:
    """Stop a schedule's fires (its history stays); False when no schedule has the name."""
    by = None if paused_by is None else check_text("paused_by", paused_by)
    params = {"name": _name(name), "paused_by": by}
    return Statement(query("periodic_pause"), params, bool)


@operation
def resume_cron_job(name: str) -> Statement[bool]:
    """Let a schedule fire again; the fires it missed while paused follow its missed-fire
    policy (coalesce: the latest one; catch_up: each). False when no schedule has the
    name."""
    return Statement(query("periodic_resume"), {"name": _name(name)}, bool)


@operation
def trigger_cron_job(name: str) -> Statement[JobRow | None]:
    """Enqueue the schedule's job now, even when paused, without moving its fire history
    (metadata ``triggered_manually``); None when no schedule has the name."""
    params = {"name": _name(name), "at": dt.datetime.now(dt.UTC).isoformat()}
    return Statement(
        query("periodic_trigger"),
        params,
        lambda rows: JobRow.from_record(rows[0]) if rows else None,
    )


@operation
def delete_cron_job(name: str) -> Statement[bool]:
    """Delete a schedule (a runtime declaring it stores it again when it starts); False
    when no schedule has the name."""
    return Statement(query("periodic_remove"), {"name": _name(name)}, bool)
