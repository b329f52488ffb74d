"""Logging each committed outcome of an attempt, by the worker that ran it.

A retry is a WARNING (kind, id, attempt/max, the exception, when it runs next); exhaustion
and terminal failures are ERRORs with the handler's traceback; a cancellation is INFO;
snoozes, parks and requeues at shutdown are DEBUG. Completions are not logged (a busy worker
completes thousands a second; metrics and hooks count them). Every record carries the job's
``job_id``, ``kind``, ``queue`` and ``attempt`` as attributes, which the JSON log format
prints as fields.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from awa.job import Job
from awa.model import JobRow, JobState
from awa.observability import metrics
from awa.worker import results

log = logging.getLogger("awa.worker")


def job_fields(job: Job[Any] | JobRow) -> dict[str, Any]:
    """The attributes a log record about ``job`` carries (``extra=``)."""
    return {"job_id": job.id, "kind": job.kind, "queue": job.queue, "attempt": job.attempt}


def _headline(error: str) -> str:
    """The first line of a stored error: ``Type: message`` without the traceback."""
    return error.partition("\n")[0]


def _when(at: dt.datetime) -> str:
    delay = (at - dt.datetime.now(dt.UTC)).total_seconds()
    stamp = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} (in {max(delay, 0.0):.1f}s)"


def _exc_info(
    exception: BaseException | None,
) -> tuple[type[BaseException], BaseException, Any] | None:
    if exception is None:
        return None
    return (type(exception), exception, exception.__traceback__)


def log_outcome(job: Job[Any], outcome: results.Outcome | None, row: JobRow) -> None:
    """Log the committed ``row`` of ``job``'s attempt, which ended with ``outcome``."""
    fields = job_fields(job)
    attempts = f"{job.attempt}/{job.max_attempts}"
    who = f"job {job.id} (kind {job.kind}, queue {job.queue})"
    state = row.state
    error = str(row.errors[-1].get("error", "")) if row.errors else ""
    match outcome:
        case results.Retry(exception=exception) if state is JobState.RETRYABLE:
            if outcome.error is None:
                log.info(
                    "%s attempt %s asked to retry; next run at %s",
                    who,
                    attempts,
                    _when(row.run_at),
                    extra=fields,
                )
            else:
                log.warning(
                    "%s attempt %s failed: %s; retrying at %s",
                    who,
                    attempts,
                    _headline(outcome.error),
                    _when(row.run_at),
                    extra=fields,
                )
        case results.Retry(exception=exception) if state is JobState.FAILED:
            log.error(
                "%s attempt %s failed and the job has no attempts left: %s",
                who,
                attempts,
                _headline(error),
                exc_info=_exc_info(exception),
                extra=fields,
            )
        case results.Fail() | results.Park() if state is JobState.FAILED:
            exception = outcome.exception if isinstance(outcome, results.Fail) else None
            log.error(
                "%s attempt %s failed for good: %s",
                who,
                attempts,
                _headline(error),
                exc_info=_exc_info(exception),
                extra=fields,
            )
        case results.Cancelled(reason=reason) if state is JobState.CANCELLED:
            log.info("%s was cancelled: %s", who, reason, extra=fields)
        case _:
            log.debug("%s attempt %s: now %s", who, attempts, state.value, extra=fields)


def count_outcome(row: JobRow, outcome: results.Outcome | None) -> None:
    """Count a committed outcome by the state it left the job in."""
    attributes = {metrics.KIND: row.kind, metrics.QUEUE: row.queue}
    match row.state:
        case JobState.COMPLETED:
            metrics.completed.add(1, attributes)
            if isinstance(outcome, results.Completed):
                metrics.duration.record(outcome.duration, attributes)
        case JobState.RETRYABLE:
            metrics.retried.add(1, attributes)
        case JobState.FAILED:
            metrics.failed.add(1, {**attributes, "awa.job.terminal": True})
        case JobState.CANCELLED:
            metrics.cancelled.add(1, attributes)
        case JobState.SCHEDULED:
            metrics.snoozed.add(1, attributes)
