"""Committing one attempt's outcome with its follow-ups, and the event it produces.

An outcome whose kind has follow-up specs for it, and a completion that staged follow-ups,
run in one transaction: the guarded transition, then the specs in registration order, then
the staged follow-ups, then commit. If a closure raises or a follow-up cannot be inserted (a
duplicate unique key excepted: it is skipped), everything rolls back and ``commit`` raises
FollowUpError; the runtime then records the attempt as failed (``follow_up_failure``), in a
transaction of its own. Other outcomes are a single guarded statement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg

from awa.errors import DatabaseError, SchemaNotMigrated, UniqueConflict
from awa.job import Job
from awa.lifecycle import finalization
from awa.lifecycle.events import (
    Cancelled,
    Completed,
    Exhausted,
    JobEvent,
    Retried,
    WaitingForCallback,
)
from awa.lifecycle.followups import (
    FollowUpError,
    FollowUpRegistry,
    Trigger,
    TriggerContext,
    count_follow_ups,
    follow_up_flow,
    insert_follow_ups,
)
from awa.model import JobRow, JobState
from awa.observability import metrics, tracing
from awa.producer.statements import SkippingInsert
from awa.sql import query
from awa.storage.db import Flow, Statement, drive_async, run_async
from awa.worker import results
from awa.worker.completer import outcome_statement, progress_param
from awa.worker.config import RetryPolicy
from awa.worker.outcome_log import job_fields

log = logging.getLogger("awa.worker")

SUPERSEDED_ERROR = "cancelled: a newer job holds its unique key, so this one cannot run again"

# The terminal failure of an attempt that returned WaitForCallback with a token it does not
# hold (never registered, or replaced).
UNREGISTERED_WAIT = (
    "WaitForCallback returned without a registered callback: call "
    "await job.register_callback() and return WaitForCallback(token)"
)


class _OutcomeCollision(Exception):
    """The transition would put the job into its unique mask while another job holds it."""


def possible_triggers(job: Job[Any], outcome: results.Outcome) -> tuple[Trigger, ...]:
    """The follow-up triggers an outcome may fire (which one depends on the committed row)."""
    match outcome:
        case results.Completed():
            return (Trigger.COMPLETED,)
        case results.Retry():
            return (Trigger.EXHAUSTED if job.attempt >= job.max_attempts else Trigger.RETRIED,)
        case results.Fail():
            return (Trigger.EXHAUSTED,)
        case results.Cancelled():
            return (Trigger.CANCELLED,)
        case results.Park():
            return (Trigger.WAITING_FOR_CALLBACK, Trigger.EXHAUSTED)
    return ()


def follow_up_failure(outcome: results.Outcome, error: FollowUpError) -> results.Outcome:
    """What an attempt becomes when its outcome's follow-ups failed and rolled it back: a
    failed attempt whose error names the spec and the exception, retried with backoff (or
    failed on its last attempt); a terminal failure stays terminal."""
    text = results.storable_text(f"follow-up failed, so the outcome was rolled back: {error}")
    cause = error.__cause__
    if cause is not None:
        # The closure's own traceback (the message already names its exception).
        _, _, traceback = results.format_error(cause).partition("\n")
        text = f"{text}\n{traceback}" if traceback else text
    if isinstance(outcome, results.Fail):
        return results.Fail(f"{outcome.error}\n{text}", outcome.exception)
    return results.Retry(error=text, exception=cause or error)


CommitOnce = Callable[[results.Outcome, bool], Awaitable["Committed | None"]]
"""Commits an outcome, with its follow-ups when the flag is true (the runtime's retries
while the database is unreachable included)."""


async def commit_or_record_failure(
    commit: CommitOnce,
    outcome: results.Outcome,
    on_failure: Callable[[FollowUpError], None],
    failed: FollowUpError | None = None,
) -> Committed | None:
    """Commit ``outcome``; when one of its follow-ups fails (rolling it back), commit the
    failed attempt instead (``follow_up_failure``) with the failure's own follow-ups
    (Retried, Exhausted), and if those fail too, without them. ``on_failure`` is told of
    each failed follow-up. ``failed``: the outcome's follow-ups already failed (in a batch),
    so start from the failure."""
    if failed is None:
        try:
            return await commit(outcome, True)
        except FollowUpError as error:
            failed = error
    on_failure(failed)
    outcome = follow_up_failure(outcome, failed)
    try:
        return await commit(outcome, True)
    except FollowUpError as error:
        on_failure(error)
        return await commit(outcome, False)


def trigger_of(outcome: results.Outcome, row: JobRow) -> Trigger | None:
    """The trigger a committed transition fires, decided by the row it produced."""
    state = row.state
    match outcome:
        case results.Completed():
            return Trigger.COMPLETED
        case results.Retry():
            return Trigger.EXHAUSTED if state is JobState.FAILED else Trigger.RETRIED
        case results.Fail():
            return Trigger.EXHAUSTED
        case results.Cancelled():
            return Trigger.CANCELLED
        case results.Park():
            if state is JobState.WAITING_EXTERNAL:
                return Trigger.WAITING_FOR_CALLBACK
            return Trigger.EXHAUSTED if state is JobState.FAILED else None
    return None


def transition_flow(
    job: Job[Any], outcome: results.Outcome, retry: RetryPolicy
) -> Flow[JobRow | None]:
    """The guarded statement(s) that commit ``outcome``; the new row, or None if stale.

    Returning WaitForCallback with a token the attempt does not hold fails the job."""
    row: JobRow | None = None
    if not isinstance(outcome, results.Park) or job._holds_callback(outcome.callback_id):
        row = yield outcome_statement(job, outcome, retry)
    if row is None and isinstance(outcome, results.Park):
        # A token this attempt did not register last: never registered, replaced, or one
        # an earlier attempt used. (The park statement alone cannot tell the last from a
        # token resumed in an earlier attempt, whose payload is still in the metadata.)
        params = {
            "id": job.id,
            "lease": job.run_lease,
            "progress": progress_param(job),
            "error": UNREGISTERED_WAIT,
        }
        row = yield Statement(query("fail_job_attempt"), params, _row)
    return row


def trigger_context(trigger: Trigger, row: JobRow, outcome: results.Outcome) -> TriggerContext:
    """The values the trigger's closures and events receive, from the committed row."""
    match trigger:
        case Trigger.CANCELLED:
            reason = outcome.reason if isinstance(outcome, results.Cancelled) else last_error(row)
            return TriggerContext(trigger, reason=reason)
        case Trigger.RETRIED:
            error = outcome.error if isinstance(outcome, results.Retry) else None
            return TriggerContext(
                trigger, error=error or "", attempt=row.attempt, next_run_at=row.run_at
            )
        case Trigger.EXHAUSTED:
            return TriggerContext(trigger, error=last_error(row), attempt=row.attempt)
    return TriggerContext(trigger)


def last_error(row: JobRow) -> str:
    return str(row.errors[-1].get("error", "")) if row.errors else ""


def event_for(
    trigger: Trigger | None, row: JobRow, context: TriggerContext | None, duration: float
) -> JobEvent[Any] | None:
    """The lifecycle event of a committed transition (None: it has none)."""
    args = row.args
    match trigger:
        case Trigger.COMPLETED:
            return Completed(row, args, dt.timedelta(seconds=duration), row.output)
        case Trigger.RETRIED if context is not None:
            return Retried(row, args, context.error or "", row.attempt, row.run_at)
        case Trigger.EXHAUSTED if context is not None:
            return Exhausted(row, args, context.error or "", row.attempt)
        case Trigger.CANCELLED if context is not None:
            return Cancelled(row, args, str(context.reason or ""))
        case Trigger.WAITING_FOR_CALLBACK:
            return WaitingForCallback(row, args)
    return None


@functools.lru_cache(maxsize=16)
def _utc(epoch: float) -> dt.datetime:
    # Every job of a completion batch has the same finalized_at: convert it once.
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


def batched_completed_event(job: Job[Any], duration: float, finalized_at: float) -> Completed[Any]:
    """The Completed event of a job completed on the batched path (no row is read back:
    the claimed row, with what the completion changed)."""
    buffer = job._extras
    row = job.snapshot(
        JobState.COMPLETED,
        finalized_at=_utc(finalized_at),
        heartbeat_at=None,
        deadline_at=None,
        progress=None,
        output=buffer.output if buffer is not None else None,
    )
    # The args the handler got, already decoded into its args type.
    return Completed(row, job._args, dt.timedelta(seconds=duration), row.output)


@dataclasses.dataclass(slots=True)
class Committed:
    """A committed transition: the row, the event it produces (if any), the follow-ups
    inserted with it (the registered specs' first, then the staged ones), and the outcome
    committed (the handler's, or the failure that replaced it)."""

    row: JobRow
    event: JobEvent[Any] | None
    follow_ups: list[JobRow] = dataclasses.field(default_factory=list)
    staged: SkippingInsert | None = None
    outcome: results.Outcome | None = None


@dataclasses.dataclass(slots=True)
class _Transition:
    row: JobRow | None
    follow_ups: list[JobRow]
    staged: SkippingInsert | None


def commits_staged(job: Job[Any], outcome: results.Outcome) -> bool:
    """Whether ``outcome`` commits follow-ups the handler staged."""
    buffer = job._extras
    return buffer is not None and bool(buffer.staged) and isinstance(outcome, results.Completed)


class Finalizer:
    def __init__(self, follow_ups: FollowUpRegistry) -> None:
        self._follow_ups = follow_ups

    @property
    def follow_ups(self) -> FollowUpRegistry:
        return self._follow_ups

    def needs_own_transaction(
        self, job: Job[Any], outcome: results.Outcome, *, follow_ups: bool = True
    ) -> bool:
        """Whether the outcome commits with follow-ups (its kind has specs for it, or the
        handler staged some); otherwise it is one statement, or a batched completion.
        ``follow_ups=False``: the follow-ups are left out (they failed already)."""
        if not follow_ups:
            return False
        if job._extras is not None and commits_staged(job, outcome):
            return True
        if not self._follow_ups.has_kind(job.kind):
            return False
        return any(
            self._follow_ups.has(trigger, job.kind) for trigger in possible_triggers(job, outcome)
        )

    async def commit(
        self,
        conn: psycopg.AsyncConnection[Any],
        job: Job[Any],
        outcome: results.Outcome,
        retry: RetryPolicy,
        *,
        follow_ups: bool = True,
    ) -> Committed | None:
        """Commit ``outcome`` (and its follow-ups, unless ``follow_ups`` is false); None
        when the attempt was stale.

        Raises FollowUpError when a follow-up fails (a closure raised or returned the wrong
        type, or its insert failed), DatabaseError when the database is unreachable; nothing
        is committed then.
        """
        try:
            done = await self._transition(conn, job, outcome, retry, follow_ups)
        except _OutcomeCollision:
            log.warning(
                "job %s (%s): a newer job holds its unique key; cancelling this one",
                job.id,
                job.kind,
            )
            params = {"id": job.id, "lease": job.run_lease, "error": SUPERSEDED_ERROR}
            row = await run_async(conn, Statement(query("cancel_duplicate_attempt"), params, _row))
            if row is None:
                return None
            superseded = TriggerContext(Trigger.CANCELLED, reason=SUPERSEDED_ERROR)
            event = event_for(Trigger.CANCELLED, row, superseded, 0.0)
            return Committed(row, event, outcome=results.Cancelled(SUPERSEDED_ERROR))
        row = done.row
        if row is None:
            return None
        if done.staged is not None:
            staged = done.staged
            count_staged(job.kind, job.queue, len(staged.inserted), len(staged.duplicates))
        duration = outcome.duration if isinstance(outcome, results.Completed) else 0.0
        trigger = trigger_of(outcome, row)
        context = trigger_context(trigger, row, outcome) if trigger is not None else None
        event = event_for(trigger, row, context, duration)
        return Committed(row, event, done.follow_ups, done.staged, outcome)

    async def _transition(
        self,
        conn: psycopg.AsyncConnection[Any],
        job: Job[Any],
        outcome: results.Outcome,
        retry: RetryPolicy,
        follow_ups_wanted: bool,
    ) -> _Transition:
        flow = transition_flow(job, outcome, retry)
        if not self.needs_own_transaction(job, outcome, follow_ups=follow_ups_wanted):
            return _Transition(await _guarded(conn, flow), [], None)
        follow_ups: list[JobRow] = []
        staged: SkippingInsert | None = None
        async with conn.transaction():
            row = await _guarded(conn, flow)
            trigger = trigger_of(outcome, row) if row is not None else None
            if row is None or trigger is None:
                return _Transition(row, [], None)
            specs = self._follow_ups.specs(trigger, job.kind)
            if specs:
                context = trigger_context(trigger, row, outcome)
                rules = self._follow_ups.insert_rules
                names = ", ".join(spec.name for spec in specs)
                with (
                    _insert_failures(f"inserting the follow-ups of {names}"),
                    tracing.continuing(job._trace_context),  # in the attempt's trace
                ):
                    inserted = await insert_follow_ups(conn, specs, row, context, rules)
                follow_ups.extend(inserted.inserted)
            # Staged follow-ups go in after the registered specs, with the same rules for
            # duplicates. Only a completion has any left (settle_staged dropped the rest).
            buffer = job._extras
            if trigger is Trigger.COMPLETED and buffer is not None and buffer.staged:
                with _insert_failures("inserting the follow-ups staged by the handler"):
                    jobs = buffer.prepared(row.id, row.kind)
                    staged = await drive_async(conn, follow_up_flow(jobs))
                follow_ups.extend(staged.inserted)
        return _Transition(row, follow_ups, staged)


def settle_own_transaction(
    job: Job[Any], outcome: results.Outcome, row: JobRow | None
) -> Committed | results.Outcome | None:
    """What a completion written in the handler's own transaction (``job.finalize()``,
    ``job.complete_in()``) came to, told by the job's row now: Committed when it committed
    under this lease (accepted whatever the handler did next); the outcome left to commit
    when the attempt still runs under it (the transaction did not commit: a normal return
    becomes a retry saying so); None when a rescue or a cancel took the attempt first."""
    record = job._finalization
    assert record is not None
    found = finalization.verdict(row, job.run_lease)
    result = "not_committed" if found == "open" else found
    attributes = {metrics.KIND: job.kind, metrics.QUEUE: job.queue}
    metrics.own_transaction_completions.add(1, {**attributes, metrics.FINALIZE_RESULT: result})
    if found == "open":
        job._finalization = None
        if isinstance(outcome, results.Completed):
            return results.Retry(error=finalization.NOT_COMMITTED)
        return outcome
    if row is None or found == "lost":
        return None
    if not isinstance(outcome, results.Completed):
        log.warning(
            "job %s (kind %s): its completion committed in the handler's transaction, then "
            "the handler ended with %s; the job stays completed",
            job.id,
            job.kind,
            type(outcome).__name__,
            extra=job_fields(job),
        )
    duration = outcome.duration if isinstance(outcome, results.Completed) else 0.0
    registered = record.registered
    if registered.inserted or registered.duplicates:
        count_follow_ups(
            job.kind, Trigger.COMPLETED, len(registered.inserted), len(registered.duplicates)
        )
    if record.staged is not None:
        staged = record.staged
        count_staged(job.kind, job.queue, len(staged.inserted), len(staged.duplicates))
    event = Completed(row, job._args, dt.timedelta(seconds=duration), row.output)
    done = results.Completed(duration)
    return Committed(row, event, record.follow_ups, record.staged, done)


def count_staged(kind: str, queue: str, inserted: int, duplicates: int) -> None:
    """Count a committed completion's staged follow-ups (after the commit)."""
    attributes = {metrics.KIND: kind, metrics.QUEUE: queue}
    counter = metrics.staged_follow_ups_committed
    metrics.count_inserted(counter, attributes, inserted, duplicates)


@contextlib.contextmanager
def _insert_failures(what: str) -> Iterator[None]:
    """Turn a follow-up insert that the database refused (a value it cannot store, a
    constraint, an error in a trigger) into FollowUpError, so the attempt takes the failure
    path. An unreachable database stays DatabaseError: the whole commit is retried."""
    try:
        yield
    except (FollowUpError, DatabaseError, SchemaNotMigrated, psycopg.OperationalError):
        raise
    except Exception as error:
        raise FollowUpError(f"{what} failed: {type(error).__name__}: {error}") from error


async def _guarded(conn: psycopg.AsyncConnection[Any], flow: Flow[JobRow | None]) -> JobRow | None:
    try:
        return await drive_async(conn, flow)
    except UniqueConflict as error:
        raise _OutcomeCollision from error


def _row(rows: list[dict[str, Any]]) -> JobRow | None:
    return JobRow.from_record(rows[0]) if rows else None
