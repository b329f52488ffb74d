"""The dead-letter queue: failed jobs held apart from ``awa.jobs`` for an operator to look at,
retry or purge.

A queue opts in with ``dlq_enabled`` (per queue in ``start()``, or for every queue with
``start(dlq_enabled=True)``). A job of such a queue that fails for good moves to
``awa.dlq_entries`` in the transaction that failed it (a trigger of migration 0007); hooks
and follow-ups still see the failed row. Operators can also move failed jobs of any queue
there by hand.

Like ``awa.admin``, each function takes a ``psycopg.Connection`` (and blocks) or a
``psycopg.AsyncConnection`` (and returns a coroutine), and changes rows only::

    entries = await awa.admin.list_dlq(conn, queue="email")
    job = awa.admin.retry_from_dlq(sync_conn, entries[0].job.id)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from awa.core.arguments import check_id, check_limit
from awa.errors import UniqueConflict, ValidationError
from awa.model import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    JobRow,
    check_int_range,
    check_name,
    check_run_at,
    check_tags,
)
from awa.sql import query
from awa.storage.db import Statement, operation

__all__ = [
    "DlqEntry",
    "bulk_move_failed_to_dlq",
    "bulk_retry_from_dlq",
    "dlq_depth",
    "dlq_depth_by_queue",
    "get_dlq_job",
    "list_dlq",
    "move_failed_to_dlq",
    "purge_dlq",
    "purge_dlq_job",
    "retry_from_dlq",
]


@dataclasses.dataclass(frozen=True, slots=True)
class DlqEntry:
    """One job in the dead-letter queue: its row as it failed (``job``, state ``failed``),
    why it was moved (``reason``: ``max_attempts_exhausted``, ``terminal_error``,
    ``callback_failed``, a rescue reason such as ``stale_heartbeat``, or an operator's text),
    when (``dlq_at``), and the ``run_lease`` of the attempt that failed."""

    job: JobRow
    reason: str
    dlq_at: dt.datetime
    original_run_lease: int

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> DlqEntry:
        """Build from a row of ``awa.dlq_entries`` fetched with a dict row factory."""
        return cls(
            JobRow.from_record(record),
            str(record["reason"]),
            record["dlq_at"],
            int(record["original_run_lease"]),
        )

    def __repr__(self) -> str:
        job = self.job
        return (
            f"DlqEntry(id={job.id}, kind={job.kind!r}, queue={job.queue!r}, "
            f"reason={self.reason!r}, dlq_at={self.dlq_at.isoformat()})"
        )


def _entry(rows: list[dict[str, Any]]) -> DlqEntry | None:
    return DlqEntry.from_record(rows[0]) if rows else None


def _entries(rows: list[dict[str, Any]]) -> list[DlqEntry]:
    return [DlqEntry.from_record(row) for row in rows]


def _count(rows: list[dict[str, Any]]) -> int:
    return int(rows[0]["count"])


def _job_id(value: object, field: str = "job id") -> int:
    return check_id(field, value)


def _optional_name(field: str, value: str | None) -> str | None:
    return None if value is None else check_name(field, value)


def _filters(kind: str | None, queue: str | None, tag: str | None) -> dict[str, Any]:
    return {
        "kind": _optional_name("kind", kind),
        "queue": _optional_name("queue", queue),
        "tag": None if tag is None else _tag(tag),
    }


def _tag(value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"tag must be a string, not {type(value).__name__}")
    check_tags([value])
    return value


def _cursor(before_id: int | None, before_dlq_at: dt.datetime | None) -> dict[str, Any]:
    return {
        "before_id": None if before_id is None else _job_id(before_id, "before_id"),
        "before_dlq_at": None if before_dlq_at is None else _aware(before_dlq_at, "before_dlq_at"),
    }


def _aware(value: object, field: str) -> dt.datetime:
    try:
        return check_run_at(value)
    except ValidationError as error:
        raise ValidationError(str(error).replace("run_at", field)) from None


def _require_scope(operation_name: str, allow_all: bool, **filters: object) -> None:
    """Bulk operations need a filter, or ``allow_all=True`` to mean every entry."""
    if not allow_all and all(value is None for value in filters.values()):
        names = " or ".join(f"{name}=" for name in filters)
        raise ValidationError(
            f"{operation_name}() needs at least one of {names} (or allow_all=True to act on "
            "every entry)"
        )


@operation
def list_dlq(
    *,
    kind: str | None = None,
    queue: str | None = None,
    tag: str | None = None,
    before_id: int | None = None,
    before_dlq_at: dt.datetime | None = None,
    limit: int = 100,
) -> Statement[list[DlqEntry]]:
    """Entries matching every given filter, newest first (``dlq_at``, then id). For the next
    page pass the last entry's ``dlq_at`` and ``job.id`` as ``before_dlq_at`` and
    ``before_id``. ``limit``: 1 to 1000."""
    params = {
        **_filters(kind, queue, tag),
        **_cursor(before_id, before_dlq_at),
        "limit": check_limit("limit", limit),
    }
    return Statement(query("dlq_list"), params, _entries)


@operation
def get_dlq_job(job_id: int) -> Statement[DlqEntry | None]:
    """The entry of this job, or None when it is not in the DLQ."""
    return Statement(query("dlq_get"), {"id": _job_id(job_id)}, _entry)


@operation
def dlq_depth(*, queue: str | None = None) -> Statement[int]:
    """How many entries the DLQ holds (of one queue, when given)."""
    return Statement(query("dlq_depth"), {"queue": _optional_name("queue", queue)}, _count)


@operation
def dlq_depth_by_queue() -> Statement[list[tuple[str, int]]]:
    """``(queue, entries)`` for every queue with entries, the deepest first."""
    return Statement(
        query("dlq_depth_by_queue"),
        None,
        lambda rows: [(str(row["queue"]), int(row["count"])) for row in rows],
    )


def _revived(job_id: int, rows: list[dict[str, Any]]) -> JobRow | None:
    if not rows:
        return None
    row = rows[0]
    if row["revived_id"] is None:
        holder = row["holder_id"]
        held_by = f"job {holder}" if holder is not None else "another job"
        raise UniqueConflict(
            f"job {job_id} stays in the dead-letter queue: {held_by} holds its unique key",
            job_id=holder,
            constraint="jobs_unique_key_idx",
        )
    return JobRow.from_record(row)


@operation
def retry_from_dlq(
    job_id: int,
    *,
    run_at: dt.datetime | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> Statement[JobRow | None]:
    """Put the job back into ``awa.jobs`` under its id, from a fresh attempt budget
    (attempt 0): available now, or scheduled for a future ``run_at``; ``priority`` and
    ``queue`` override its own. Its error history is kept. None when it is not in the DLQ;
    ``UniqueConflict`` (naming the holder) when another job holds its unique key, and the
    entry stays."""
    checked = _job_id(job_id)
    params = {
        "id": checked,
        "run_at": None if run_at is None else check_run_at(run_at),
        "priority": None
        if priority is None
        else check_int_range("priority", priority, MIN_PRIORITY, MAX_PRIORITY),
        "queue": _optional_name("queue", queue),
    }
    return Statement(query("dlq_retry"), params, lambda rows: _revived(checked, rows))


@operation
def bulk_retry_from_dlq(
    *,
    kind: str | None = None,
    queue: str | None = None,
    tag: str | None = None,
    allow_all: bool = False,
) -> Statement[int]:
    """Put every matching entry back into ``awa.jobs``, available now; returns how many.
    An entry whose unique key a job holds stays (as do older entries sharing a key with
    one revived). Needs a filter, or ``allow_all=True``."""
    _require_scope("bulk_retry_from_dlq", allow_all, kind=kind, queue=queue, tag=tag)
    return Statement(query("dlq_bulk_retry"), _filters(kind, queue, tag), _count)


@operation
def move_failed_to_dlq(job_id: int, reason: str) -> Statement[DlqEntry | None]:
    """Move a failed job (of any queue) into the DLQ with ``reason``; None when it is not
    a failed job."""
    params = {"id": _job_id(job_id), "reason": check_name("reason", reason)}
    return Statement(query("dlq_move_failed"), params, _entry)


@operation
def bulk_move_failed_to_dlq(
    *,
    kind: str | None = None,
    queue: str | None = None,
    reason: str = "manual",
    allow_all: bool = False,
) -> Statement[int]:
    """Move every failed job of a kind and/or queue into the DLQ; returns how many. Needs
    a filter, or ``allow_all=True`` for every failed job."""
    _require_scope("bulk_move_failed_to_dlq", allow_all, kind=kind, queue=queue)
    params = {
        "kind": _optional_name("kind", kind),
        "queue": _optional_name("queue", queue),
        "reason": check_name("reason", reason),
    }
    return Statement(query("dlq_bulk_move_failed"), params, _count)


@operation
def purge_dlq_job(job_id: int) -> Statement[bool]:
    """Delete the job's entry for good; False when it is not in the DLQ."""
    return Statement(query("dlq_purge_job"), {"id": _job_id(job_id)}, lambda rows: bool(rows))


@operation
def purge_dlq(
    *,
    kind: str | None = None,
    queue: str | None = None,
    tag: str | None = None,
    before_id: int | None = None,
    before_dlq_at: dt.datetime | None = None,
    allow_all: bool = False,
) -> Statement[int]:
    """Delete every matching entry for good (older than the cursor, when given: e.g.
    ``before_dlq_at`` alone purges what was moved before then); returns how many. Needs
    ``kind``, ``queue`` or ``tag``, or ``allow_all=True`` (a cursor alone can match every
    entry)."""
    _require_scope("purge_dlq", allow_all, kind=kind, queue=queue, tag=tag)
    params = {**_filters(kind, queue, tag), **_cursor(before_id, before_dlq_at)}
    return Statement(query("dlq_purge"), params, _count)


def store_settings_statement(enabled: Mapping[str, bool]) -> Statement[list[tuple[str, Any]]]:
    """What a worker runs at start: the DLQ setting of each queue it runs. Decodes to the
    queues whose setting changed, with the previous one (None: never stored)."""
    params = {"queues": list(enabled), "enabled": [bool(value) for value in enabled.values()]}
    return Statement(
        query("dlq_store_settings"),
        params,
        lambda rows: [(str(row["queue"]), row["was"]) for row in rows],
    )
