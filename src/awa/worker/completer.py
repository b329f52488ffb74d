"""Committing outcomes: guarded statements per attempt, and batched completion.

Completions go through a batcher that commits many jobs per statement. Every other outcome
(and a completion that needs its own transaction) is one guarded statement. A statement that
matches no row was stale: it changed nothing, and the caller gets None.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from awa.core.outage import FailureLog, one_line
from awa.core.tasks import cancel_and_wait
from awa.errors import DatabaseError
from awa.job import Job
from awa.lifecycle.staging import output_json
from awa.model import JobRow, JobState
from awa.sql import query
from awa.storage.db import Statement, run_async
from awa.worker import results
from awa.worker.config import RetryPolicy

log = logging.getLogger("awa.worker")

Connect = Callable[[], Awaitable[Any]]


def _row(rows: list[dict[str, Any]]) -> JobRow | None:
    return JobRow.from_record(rows[0]) if rows else None


def progress_param(job: Job[Any]) -> str | None:
    """The progress to store with an outcome: the handler's, or None to keep the row's."""
    if job._progress_version == 0:
        return None
    return json.dumps(job._progress, ensure_ascii=False, separators=(",", ":"), default=str)


def outcome_statement(
    job: Job[Any], outcome: results.Outcome, retry: RetryPolicy
) -> Statement[JobRow | None]:
    """The guarded statement that commits ``outcome``; decodes to the new row or None."""
    guard = {"id": job.id, "lease": job.run_lease}
    progress = progress_param(job)
    match outcome:
        case results.Completed():
            return Statement(query("complete_job"), {**guard, "output": output_json(job)}, _row)
        case results.Retry(error=error, delay=delay, exhausted_error=exhausted):
            params = {
                **guard,
                "error": error,
                "exhausted_error": exhausted,
                "delay_seconds": delay,
                "base": retry.base,
                "jitter": retry.jitter,
                "max_delay": retry.max_delay,
                "progress": progress,
            }
            return Statement(query("retry_job_attempt"), params, _row)
        case results.Fail(error=error):
            params = {**guard, "error": error, "progress": progress}
            return Statement(query("fail_job_attempt"), params, _row)
        case results.Cancelled(reason=reason):
            params = {**guard, "reason": reason, "progress": progress}
            return Statement(query("cancel_job_attempt"), params, _row)
        case results.Snoozed(delay=delay):
            params = {**guard, "delay_seconds": delay, "progress": progress}
            return Statement(query("snooze_job_attempt"), params, _row)
        case results.Interrupted(error=error):
            params = {**guard, "error": error, "progress": progress}
            return Statement(query("requeue_interrupted"), params, _row)
        case results.Park(callback_id=callback_id):
            params = {**guard, "callback_id": callback_id, "progress": progress}
            return Statement(query("park_job_attempt"), params, _row)
    raise AssertionError(f"unknown outcome {outcome!r}")


@dataclasses.dataclass(slots=True)
class Done:
    """What a flush did with one completion.

    ``finalized_at`` is the commit time of the completion as epoch seconds (None: the
    attempt was stale, or the completion was given up or not committed). A completion with
    follow-ups also has ``returned`` (to build its committed row with ``completed_row``) and
    ``row`` when its follow-up closures needed it already; one whose follow-ups failed has
    ``failure`` instead (nothing of it committed: the runtime records the failed attempt);
    ``alone`` asks the runtime to commit it by itself (its batch's follow-up insert was
    refused, and only a transaction of its own can tell whose fault it was).
    """

    job: Job[Any]
    duration: float
    finalized_at: float | None
    returned: tuple[Any, ...] | None = None
    row: JobRow | None = None
    failure: Exception | None = None
    alone: bool = False


Pending = tuple[Job[Any], float]
"""A completion waiting for its flush: the job and its handler's duration."""

Flush = Callable[[Any, list[Pending]], Awaitable[list[Done]]]
"""Commits a batch on a connection and says what became of each completion."""


async def flush_plain(conn: Any, batch: list[Pending]) -> list[Done]:
    """Complete a batch with one statement (no follow-ups)."""
    applied = await run_async(conn, complete_batch_statement([job for job, _ in batch]))
    return [Done(job, duration, applied.get((job.id, job.run_lease))) for job, duration in batch]


MAX_FLUSHES = 2
"""Flushes in flight at once, each on its own connection, when the next batch may overlap
(it has follow-ups): while one waits on the database, the next batch's follow-ups are
planned and encoded in this process. Plain batches go one at a time: their statements are
cheap to prepare, and two of them at once only compete for the server (the plain drain ran
about 20 % slower with two)."""


async def _first_of(wakeup: Awaitable[Any], flushes: set[asyncio.Task[None]]) -> None:
    """Until ``wakeup`` returns or one of ``flushes`` ends."""
    waiter = asyncio.ensure_future(wakeup)
    try:
        await asyncio.wait({waiter, *flushes}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


CLOSE_TIMEOUT = 5.0
"""Seconds ``close()`` keeps retrying a flush while the database is unreachable."""


class CompletionBatcher:
    """Collects completions and commits them many at a time.

    A flush starts when ``batch_size`` completions are waiting or ``linger`` seconds after
    the first one arrived. A flush that fails for a database reason is retried (the jobs stay
    in flight and keep their heartbeat), so a short outage loses nothing. A flush that fails
    for any other reason, or is still failing when ``close()`` gives up, is dropped: its jobs
    leave the in-flight set, stay ``running`` without a heartbeat, and rescue retries them.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        batch_size: int,
        linger: float,
        on_done: Callable[[list[Done]], None],
        flush: Flush = flush_plain,
        may_overlap: Callable[[list[Pending]], bool] | None = None,
    ) -> None:
        self._connect = connect
        self._flush_batch = flush
        self._may_overlap = may_overlap
        self._batch_size, self._linger = batch_size, linger  # how large, how long to wait
        self._on_done = on_done
        self._pending: list[Pending] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._urgent = False
        self._give_up_at = math.inf
        self._failures = FailureLog(log, "completing jobs")
        self._task: asyncio.Task[None] | None = None
        self._delay = 0.05

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="awa-completer")

    def add(self, job: Job[Any], duration: float, *, urgent: bool = False) -> None:
        """Queue a completion; ``urgent``: flush without lingering for others (its job holds
        a place under a cap until the completion commits)."""
        self._pending.append((job, duration))
        self._urgent = self._urgent or urgent
        self._idle.clear()
        self._wakeup.set()

    async def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Flush everything pending, then stop. While the database is unreachable a flush
        is retried for ``timeout`` seconds at most; what is left then is given up."""
        self._closing = True
        self._give_up_at = time.monotonic() + timeout
        self._wakeup.set()
        if self._task is None:
            return
        # A flush that started before close() may be waiting on the pool for a connection
        # (30 s while the database is down): past the deadline it is cancelled.
        _, unfinished = await asyncio.wait([self._task], timeout=timeout + 0.5)
        if unfinished:
            await cancel_and_wait(self._task)
            if self._pending:
                log.warning(
                    "shutting down: gave up completing %d jobs (the database did not answer "
                    "within %gs); they stay running and rescue retries them",
                    len(self._pending),
                    timeout,
                )
                self._drop(len(self._pending))

    async def _run(self) -> None:
        flushes: set[asyncio.Task[None]] = set()
        try:
            while True:
                if flushes and not self._overlaps(len(flushes)):
                    await asyncio.wait(flushes, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if not self._pending:
                    if not flushes:
                        self._idle.set()
                        if self._closing:
                            return
                    self._wakeup.clear()
                    await _first_of(self._wakeup.wait(), flushes)
                    continue
                if (
                    len(self._pending) < self._batch_size
                    and not (self._closing or self._urgent)
                    and self._linger
                ):
                    await asyncio.sleep(self._linger)
                self._urgent = False
                batch = self._pending[: self._batch_size]
                del self._pending[: len(batch)]
                task = asyncio.create_task(self._flush_or_requeue(batch))
                flushes.add(task)
                task.add_done_callback(flushes.discard)
        finally:
            for task in list(flushes):
                task.cancel()
            if flushes:
                await asyncio.gather(*flushes, return_exceptions=True)

    def _overlaps(self, in_flight: int) -> bool:
        """Whether the next batch may start beside the ``in_flight`` flushes."""
        if in_flight >= MAX_FLUSHES or not self._pending or self._may_overlap is None:
            return False
        return self._may_overlap(self._pending[: self._batch_size])

    async def _flush_or_requeue(self, batch: list[Pending]) -> None:
        """Commit ``batch``; on a database error put it back at the head of the queue and
        back off (the jobs stay in flight and keep their heartbeat)."""
        try:
            async with asyncio.timeout_at(self._deadline()):
                done = await self._flush(batch)
        except asyncio.CancelledError:
            self._pending[:0] = batch
            raise
        except (DatabaseError, psycopg.Error, TimeoutError) as error:
            self._pending[:0] = batch
            if self._closing and time.monotonic() >= self._give_up_at:
                log.warning(
                    "shutting down: gave up completing %d jobs (%s); they stay running "
                    "and rescue retries them",
                    len(self._pending),
                    one_line(error),
                )
                self._drop(len(self._pending))
                return
            self._failures.failed(error, then="retrying; the jobs keep their heartbeat")
            await asyncio.sleep(min(self._delay, max(0.0, self._give_up_at - time.monotonic())))
            self._delay = min(self._delay * 2, 5.0)
            self._wakeup.set()
            return
        except Exception:
            # Not an outage but a bug: retrying would fail forever and hold up every
            # later completion. Drop this batch and go on.
            log.exception(
                "completing %d jobs failed unexpectedly; they stay running and rescue retries them",
                len(batch),
            )
            self._report([Done(job, duration, None) for job, duration in batch])
            return
        self._failures.succeeded()
        self._delay = 0.05
        self._report(done)

    def _deadline(self) -> float | None:
        """When a flush in progress is abandoned: only while closing."""
        if not self._closing:
            return None
        return asyncio.get_running_loop().time() + max(0.0, self._give_up_at - time.monotonic())

    def _drop(self, count: int) -> None:
        """Give up the first ``count`` pending completions (reported as not applied)."""
        dropped = self._pending[:count]
        del self._pending[:count]
        self._report([Done(job, duration, None) for job, duration in dropped])

    def _report(self, done: list[Done]) -> None:
        try:
            self._on_done(done)
        except Exception:
            log.exception("handling %d committed completions failed", len(done))

    async def _flush(self, batch: list[Pending]) -> list[Done]:
        async with self._connect() as conn:
            return await self._flush_batch(conn, batch)


def _batch_params(jobs: list[Job[Any]]) -> dict[str, Any]:
    """ids, leases and outputs of a batch, in id order. Outputs travel as one NULL unless a
    job of the batch recorded one, so a batch without outputs pays a single attribute check
    per job for them."""
    jobs = sorted(jobs, key=lambda job: job.id)
    outputs = None
    if any(job._extras is not None for job in jobs):
        outputs = [output_json(job) for job in jobs]
    # Integer arrays as literals: psycopg's list adapter costs microseconds per element.
    return {
        "ids": "{" + ",".join([str(job.id) for job in jobs]) + "}",
        "leases": "{" + ",".join([str(job.run_lease) for job in jobs]) + "}",
        "outputs": outputs,
    }


def complete_batch_statement(jobs: list[Job[Any]]) -> Statement[dict[tuple[int, int], float]]:
    """Complete many attempts in one statement; decodes to the commit time (epoch seconds)
    of each applied ``(id, run_lease)`` (the missing ones were stale)."""
    return Statement(
        query("complete_batch"),
        _batch_params(jobs),
        lambda rows: {(row["id"], row["run_lease"]): row["finalized_at"] for row in rows},
    )


Returned = tuple[Any, ...]
"""What ``complete_batch_rows`` returns of one completion (after the id): the commit time,
metadata and the callback columns, the columns that may differ from the claimed row."""


def complete_returning_statement(jobs: list[Job[Any]]) -> Statement[dict[int, Returned]]:
    """``complete_batch_statement`` returning, by job id, what ``completed_row`` needs to
    build each committed row (stale attempts are missing)."""
    return Statement(
        query("complete_batch_rows"),
        _batch_params(jobs),
        lambda rows: {row[0]: row[1:] for row in rows},
        tuples=True,
    )


def completed_row(job: Job[Any], returned: Returned) -> JobRow:
    """The committed row of ``job``'s completion: the claimed row, the completion's changes,
    and what the completion statement returned."""
    finalized_at, metadata, callback_id, *callback = returned
    buffer = job._extras
    return job.snapshot(
        JobState.COMPLETED,
        finalized_at=finalized_at,
        heartbeat_at=None,
        deadline_at=None,
        progress=None,
        output=buffer.output if buffer is not None else None,
        metadata=metadata,
        callback_id=str(callback_id) if callback_id is not None else None,
        callback_timeout_at=callback[0],
        callback_filter=callback[1],
        callback_on_complete=callback[2],
        callback_on_fail=callback[3],
        callback_transform=callback[4],
        callback_in_handler=callback[5],
    )
