"""Committing outcomes, the runtime's half that follows an attempt: one outcome in a
statement or transaction of its own (retried while the database is unreachable), and the
completions a batch committed (counted, hooks dispatched). Mixed into ``Runtime``."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

import psycopg

from awa.core.outage import FailureLog
from awa.errors import AwaError, DatabaseError
from awa.job import Job
from awa.lifecycle.dependents import fire_cancelled_dependents, may_have_cancelled_dependents
from awa.lifecycle.events import Completed, JobEvent
from awa.lifecycle.finalization import evidence_statement
from awa.lifecycle.followups import FollowUpError
from awa.lifecycle.hooks import HookDispatcher
from awa.model import JobRow, JobState
from awa.observability import metrics
from awa.storage.db import run_async
from awa.worker import results
from awa.worker.attempts import InFlight
from awa.worker.completer import CompletionBatcher, Done, completed_row
from awa.worker.config import QueueConfig, RuntimeConfig
from awa.worker.dispatcher import QueueDispatcher
from awa.worker.finalizer import (
    Committed,
    Finalizer,
    batched_completed_event,
    commit_or_record_failure,
    settle_own_transaction,
)
from awa.worker.outcome_log import count_outcome, job_fields, log_outcome
from awa.worker.registry import TaskRegistry
from awa.worker.results import Outcome

log = logging.getLogger("awa.worker")
T = TypeVar("T")


class _Connections(Protocol):
    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...


class OutcomeCommits:
    """The commit side of ``Runtime`` (its attributes are the runtime's)."""

    config: RuntimeConfig
    registry: TaskRegistry
    inflight: InFlight
    completed: int
    _host: _Connections
    _hooks: HookDispatcher
    _finalizer: Finalizer
    _completer: CompletionBatcher
    _dispatchers: dict[str, QueueDispatcher]
    _interrupting: asyncio.Event
    _late_commits: set[asyncio.Task[None]]
    _save_failures: FailureLog

    def _queue(self, job: Job[Any]) -> QueueConfig:
        return self._dispatchers[job.queue].config

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a commit apart from the completion batcher (shutdown waits for it)."""
        task = asyncio.create_task(work, name="awa-commit")
        self._late_commits.add(task)
        task.add_done_callback(self._late_commits.discard)

    async def _commit_alone(
        self,
        job: Job[Any],
        outcome: Outcome,
        queue: QueueConfig,
        failed: FollowUpError | None = None,
    ) -> None:
        """Commit one outcome in a statement or transaction of its own, then count, log and
        dispatch it. ``failed``: its follow-ups failed already, in a completion batch."""
        committed = await self._commit(job, outcome, queue, failed)
        self._settled(job, committed)

    def _settled(self, job: Job[Any], committed: Committed | None) -> None:
        """The attempt is over: free its room, then count, log and dispatch what committed
        (None: nothing, the attempt was stale or its outcome could not be saved)."""
        self.inflight.remove(job)
        dispatcher = self._dispatchers.get(job.queue)
        if dispatcher is not None and dispatcher.counts_until_commit:
            dispatcher.room_freed()
        if committed is None:
            metrics.stale.add(1, {metrics.KIND: job.kind, metrics.QUEUE: job.queue})
            log.debug(
                "job %s lease %s: stale outcome ignored (the attempt was rescued, cancelled "
                "or superseded meanwhile)",
                job.id,
                job.run_lease,
                extra=job_fields(job),
            )
            return
        log_outcome(job, committed.outcome, committed.row)
        count_outcome(committed.row, committed.outcome)
        if committed.row.state is JobState.COMPLETED:
            self.completed += 1
        if committed.event is not None:
            self._hooks.dispatch(committed.event)
        if may_have_cancelled_dependents(committed.row):
            connection = self._host.connection
            self._later(fire_cancelled_dependents(connection, self._hooks, committed.row))

    async def _settle_own_transaction(
        self, job: Job[Any], outcome: Outcome, queue: QueueConfig
    ) -> None:
        """End an attempt whose handler wrote its completion in its own transaction: the
        job's row decides (``settle_own_transaction``). A completion awa committed itself
        needs no read."""
        record = job._finalization
        assert record is not None
        row = record.row if record.committed else await self._evidence(job)
        settled = settle_own_transaction(job, outcome, row)
        if isinstance(settled, results.Outcome):
            await self._commit_alone(job, settled, queue)
        else:
            self._settled(job, settled)  # None: stale, or unknown at shutdown (rescue decides)

    async def _evidence(self, job: Job[Any]) -> JobRow | None:
        """The job's row now (None: deleted, or unknown because the worker shut down while
        the database was unreachable)."""

        async def read(conn: psycopg.AsyncConnection[Any]) -> JobRow | None:
            return await run_async(conn, evidence_statement(job.id))

        return await self._while_unreachable(job, read, "its completion is unconfirmed")

    async def _commit(
        self,
        job: Job[Any],
        outcome: Outcome,
        queue: QueueConfig,
        failed: FollowUpError | None = None,
    ) -> Committed | None:
        """Commit an outcome; None when the attempt turned out stale or the outcome could
        not be saved (rescue recovers it). A failing follow-up rolls the outcome back with
        it, and the attempt is committed as failed instead."""

        def follow_up_failed(error: FollowUpError) -> None:
            metrics.follow_up_failures.add(1, {metrics.KIND: job.kind})
            log.error(
                "job %s (kind %s): a follow-up failed (%s); the outcome was rolled back with "
                "it and the attempt is recorded as failed",
                job.id,
                job.kind,
                error,
            )

        async def commit(outcome: Outcome, follow_ups: bool) -> Committed | None:
            return await self._commit_once(job, outcome, queue, follow_ups)

        try:
            return await commit_or_record_failure(commit, outcome, follow_up_failed, failed)
        except AwaError:
            log.exception("job %s (kind %s): saving its outcome failed", job.id, job.kind)
            return None

    async def _commit_once(
        self, job: Job[Any], outcome: Outcome, queue: QueueConfig, follow_ups: bool
    ) -> Committed | None:
        """One commit, retried while the database is unreachable (the attempt keeps its
        heartbeat meanwhile); None when stale or given up at shutdown. A failing follow-up
        raises FollowUpError."""
        task = self.registry.get(job.kind)
        retry = task.retry if task is not None and task.retry is not None else queue.retry

        async def commit(conn: psycopg.AsyncConnection[Any]) -> Committed | None:
            return await self._finalizer.commit(conn, job, outcome, retry, follow_ups=follow_ups)

        return await self._while_unreachable(job, commit, "outcome not saved")

    async def _while_unreachable(
        self,
        job: Job[Any],
        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        given_up: str,
    ) -> T | None:
        """``work`` on a pooled connection, retried with backoff while the database is
        unreachable (the attempt keeps its heartbeat meanwhile); None when the worker is
        shutting down meanwhile (rescue finishes the attempt)."""
        delay = 0.05
        while True:
            try:
                async with self._host.connection() as conn:
                    done = await work(conn)
                self._save_failures.succeeded()
                return done
            except DatabaseError as error:
                if self._interrupting.is_set():
                    log.warning("job %s: %s (%s); rescue will retry it", job.id, given_up, error)
                    return None
                self._save_failures.failed(error, then="retrying; the jobs keep their heartbeat")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _completions_backlogged(self) -> bool:
        return self._completer.pending > 4 * self.config.completion_batch_size

    def _completions_done(self, done: list[Done]) -> None:
        self._room_freed(done)
        completed = []
        hooks = self._hooks
        for item in done:
            job = item.job
            if item.failure is not None or item.alone:
                # Not committed: its follow-ups failed (it is recorded as a failed attempt)
                # or must be told apart from its batch's. It stays in flight meanwhile.
                outcome = results.Completed(item.duration)
                failure = item.failure if isinstance(item.failure, FollowUpError) else None
                self._later(self._commit_alone(job, outcome, self._queue(job), failure))
                continue
            self.inflight.remove(job)
            if item.finalized_at is None:
                metrics.stale.add(1, {metrics.KIND: job.kind, metrics.QUEUE: job.queue})
                log.debug("job %s lease %s: stale completion ignored", job.id, job.run_lease)
                continue
            completed.append((job.kind, job.queue))
            metrics.duration.record(
                item.duration, {metrics.KIND: job.kind, metrics.QUEUE: job.queue}
            )
            if hooks.wants(job.kind):
                task = self.registry.get(job.kind)
                event: JobEvent[Any]
                if item.returned is not None:  # it inserted follow-ups: the row came back
                    row = item.row or completed_row(job, item.returned)
                    duration = dt.timedelta(seconds=item.duration)
                    event = Completed(row, job._args, duration, row.output)
                else:
                    event = batched_completed_event(job, item.duration, item.finalized_at)
                hooks.dispatch(event, task.args_type if task is not None else None)
        self.completed += len(completed)
        metrics.count_by_kind(metrics.completed, completed)

    def _room_freed(self, done: list[Done]) -> None:
        """Tell the dispatchers of queues whose jobs count until they commit (a cap, a
        per-key limit) how many of theirs left the batcher."""
        by_queue = collections.Counter(item.job.queue for item in done)
        for name, count in by_queue.items():
            dispatcher = self._dispatchers.get(name)
            if dispatcher is not None and dispatcher.counts_until_commit:
                dispatcher.room_freed(count)
