"""Operator actions on jobs and queues, usable on any psycopg connection.

Each function takes a ``psycopg.Connection`` (and blocks) or a ``psycopg.AsyncConnection``
(and returns a coroutine), so it also runs inside a caller's transaction::

    job = await awa.admin.cancel(conn, 42)      # asyncio connection
    job = awa.admin.cancel(sync_conn, 42)       # blocking connection

They change rows only; they never fire lifecycle hooks or follow-up jobs. Actions that do not
apply (an unknown id, a finished job) return None rather than raising (the batch operations,
from ``awa.batch.operations``, raise ValidationError as the reference package's do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from awa.batch.operations import (
    cancel_batch_operation,
    get_batch_operation,
    list_batch_operations,
    preview_batch_operation,
    purge_batch_operations,
    submit_batch_operation,
)
from awa.callbacks import (
    complete_external,
    fail_external,
    heartbeat_callback,
    resolve_callback,
    resume_external,
    retry_external,
)
from awa.core.arguments import check_id, check_ids, check_limit, check_text, optional_name
from awa.core.kinds import args_to_json_value, dump_json
from awa.descriptors.operations import (
    JobKindDescriptor,
    QueueDescriptor,
    list_job_kind_descriptors,
    list_queue_descriptors,
)
from awa.dlq.operations import (
    DlqEntry,
    bulk_move_failed_to_dlq,
    bulk_retry_from_dlq,
    dlq_depth,
    dlq_depth_by_queue,
    get_dlq_job,
    list_dlq,
    move_failed_to_dlq,
    purge_dlq,
    purge_dlq_job,
    retry_from_dlq,
)
from awa.errors import ValidationError
from awa.model import (
    BIGINT_MAX,
    JobRow,
    JobState,
    check_int_range,
    check_name,
    parse_state,
)
from awa.observability.queue_stats import HeldBack, QueueLimits, QueueStats, queue_stats
from awa.overrides.operations import (
    OverrideChange,
    QueueOverrides,
    clear_queue_overrides,
    list_queue_overrides,
    queue_override_log,
    set_queue_overrides,
)
from awa.periodic.operations import (
    CronJob,
    delete_cron_job,
    list_cron_jobs,
    pause_cron_job,
    resume_cron_job,
    trigger_cron_job,
)
from awa.producer.backpressure import (
    QueuePressure,
    clear_queue_depth_limit,
    list_queue_depth_limits,
    set_queue_depth_limit,
)
from awa.producer.insert import unique_key
from awa.sql import query
from awa.storage.db import Flow, Statement, operation
from awa.storage.engine import flush_admin_metadata

__all__ = [
    "CronJob",
    "DlqEntry",
    "HeldBack",
    "JobKindDescriptor",
    "OverrideChange",
    "QueueDescriptor",
    "QueueLimits",
    "QueueOverrides",
    "QueuePressure",
    "QueueStats",
    "RetryFailedResult",
    "bulk_move_failed_to_dlq",
    "bulk_retry_from_dlq",
    "cancel",
    "cancel_batch_operation",
    "cancel_by_unique_key",
    "clear_queue_depth_limit",
    "clear_queue_overrides",
    "complete_external",
    "delete_cron_job",
    "discard",
    "discard_failed",
    "dlq_depth",
    "dlq_depth_by_queue",
    "drain_queue",
    "fail_external",
    "flush_admin_metadata",
    "get_batch_operation",
    "get_dlq_job",
    "get_job",
    "heartbeat_callback",
    "list_batch_operations",
    "list_cron_jobs",
    "list_dlq",
    "list_job_kind_descriptors",
    "list_jobs",
    "list_queue_depth_limits",
    "list_queue_descriptors",
    "list_queue_overrides",
    "move_failed_to_dlq",
    "pause_cron_job",
    "pause_queue",
    "preview_batch_operation",
    "purge_batch_operations",
    "purge_dlq",
    "purge_dlq_job",
    "queue_known",
    "queue_override_log",
    "queue_stats",
    "resolve_callback",
    "resume_cron_job",
    "resume_external",
    "resume_queue",
    "retry",
    "retry_external",
    "retry_failed",
    "retry_from_dlq",
    "run_now",
    "set_queue_depth_limit",
    "set_queue_overrides",
    "submit_batch_operation",
    "trigger_cron_job",
]


def _one_job(rows: list[dict[str, Any]]) -> JobRow | None:
    return JobRow.from_record(rows[0]) if rows else None


def _jobs(rows: list[dict[str, Any]]) -> list[JobRow]:
    return JobRow.from_records(rows)


def _count(rows: list[dict[str, Any]]) -> int:
    return int(rows[0]["count"])


def _job_id(job_id: object) -> int:
    return check_id("job id", job_id)


@operation
def get_job(job_id: int) -> Statement[JobRow | None]:
    """The job with this id, or None."""
    return Statement(query("get_job"), {"id": _job_id(job_id)}, _one_job)


@operation
def list_jobs(
    *,
    state: JobState | str | None = None,
    kind: str | None = None,
    queue: str | None = None,
    limit: int = 100,
) -> Statement[list[JobRow]]:
    """Jobs matching every given filter, newest first; ``limit`` 1 to 1000."""
    params = {
        "state": parse_state(state).value if state is not None else None,
        "kind": optional_name("kind", kind),
        "queue": optional_name("queue", queue),
        "limit": check_limit("limit", limit),
    }
    return Statement(query("list_jobs"), params, _jobs)


@operation
def cancel(job_id: int) -> Statement[JobRow | None]:
    """Cancel a job that has not finished; None when it is unknown or already finished."""
    return Statement(query("cancel_job"), {"id": _job_id(job_id)}, _one_job)


@operation
def cancel_by_unique_key(
    kind: str,
    *,
    args: Any = None,
    queue: str | None = None,
    period_bucket: int | None = None,
) -> Statement[JobRow | None]:
    """Cancel the oldest unfinished job holding a unique key.

    Pass what the job's unique key covers: ``args`` unless it was inserted with
    ``by_args=False``, ``queue`` only if ``by_queue=True``, and for ``by_period`` the period
    number (``awa.producer.insert.period_bucket(period_seconds, run_at)``).
    """
    check_name("kind", kind)
    optional_name("queue", queue)
    if period_bucket is not None:
        check_int_range("period_bucket", period_bucket, -BIGINT_MAX - 1, BIGINT_MAX)
    args_json = (
        dump_json(args_to_json_value(args), "args", sort_keys=True) if args is not None else None
    )
    key = unique_key(kind, queue, args_json, period_bucket)
    return Statement(query("cancel_by_unique_key"), {"key": key}, _one_job)


@operation
def retry(job_id: int) -> Statement[JobRow | None]:
    """Run a failed, cancelled or parked job again (attempt reset); None if not eligible."""
    return Statement(query("retry_job"), {"id": _job_id(job_id)}, _one_job)


def _job_ids(ids: Sequence[int] | None) -> list[int] | None:
    """``ids=``: 1 to 10,000 job ids."""
    return None if ids is None else check_ids("ids", ids)


class RetryFailedResult(list[JobRow]):
    """The jobs ``retry_failed`` moved back to available (a list), with the reference
    package's fields: ``jobs`` (the same list), ``matched`` (failed jobs the filter matched,
    moved or left because another job holds their unique key) and ``pruned_failed_count``
    (always None: retention here is the leader's business)."""

    def __init__(self, jobs: list[JobRow], matched: int) -> None:
        super().__init__(jobs)
        self.matched = matched
        self.pruned_failed_count: int | None = None

    @property
    def jobs(self) -> list[JobRow]:
        return list(self)


def _retry_failed_flow(params: dict[str, Any]) -> Flow[RetryFailedResult]:
    matched = yield Statement(query("retry_failed_matched"), params, _count)
    moved = yield Statement(query("retry_failed"), params, _jobs)
    return RetryFailedResult(moved, matched)


@operation
def retry_failed(
    *, kind: str | None = None, queue: str | None = None, ids: Sequence[int] | None = None
) -> Flow[RetryFailedResult]:
    """Run every failed job of one kind, of one queue, or of a list of ids again; returns
    the jobs it moved (ids that are not failed jobs are left alone).

    A job whose unique key another job holds now stays failed (running it again would give
    the key two holders), and of failed jobs sharing a key only the newest runs again."""
    if [kind, queue, ids].count(None) != 2:
        raise ValidationError("retry_failed() needs exactly one of kind=, queue= or ids=")
    params = {
        "kind": optional_name("kind", kind),
        "queue": optional_name("queue", queue),
        "ids": _job_ids(ids),
    }
    return _retry_failed_flow(params)


@operation
def discard_failed(kind: str | None = None, *, ids: Sequence[int] | None = None) -> Statement[int]:
    """Delete every failed job of a kind, or of a list of ids; returns how many."""
    if (kind is None) == (ids is None):
        raise ValidationError("discard_failed() needs exactly one of kind or ids=")
    params = {"kind": check_name("kind", kind) if kind is not None else None, "ids": _job_ids(ids)}
    return Statement(query("discard_failed"), params, _count)


@operation
def discard(job_id: int) -> Statement[bool]:
    """Delete a job that no attempt holds (not running, not waiting on a callback: cancel
    those first); False when it is unknown or held."""
    return Statement(query("discard_job"), {"id": _job_id(job_id)}, lambda rows: bool(rows))


@operation
def run_now(job_id: int) -> Statement[JobRow | None]:
    """Make a scheduled or retryable job available at once; None if it is neither."""
    return Statement(query("run_job_now"), {"id": _job_id(job_id)}, _one_job)


@operation
def pause_queue(queue: str, *, paused_by: str | None = None) -> Statement[None]:
    """Stop workers from claiming jobs of this queue (running jobs finish); ``paused_by``
    (who, for operators) is at most 200 characters."""
    params = {
        "queue": check_name("queue", queue),
        "paused_by": None if paused_by is None else check_text("paused_by", paused_by),
    }
    return Statement(query("pause_queue"), params, lambda rows: None)


@operation
def queue_known(queue: str) -> Statement[bool]:
    """Whether any job has used this queue or it was paused before (a check for typos:
    pausing a queue ahead of its first job is legitimate)."""
    params = {"queue": check_name("queue", queue)}
    return Statement(query("queue_known"), params, lambda rows: bool(rows[0]["known"]))


@operation
def resume_queue(queue: str) -> Statement[bool]:
    """Let workers claim this queue again; False if it was not paused."""
    params = {"queue": check_name("queue", queue)}
    return Statement(query("resume_queue"), params, lambda rows: bool(rows))


@operation
def drain_queue(queue: str) -> Statement[int]:
    """Cancel every waiting or parked job of a queue; returns how many."""
    return Statement(query("drain_queue"), {"queue": check_name("queue", queue)}, _count)
