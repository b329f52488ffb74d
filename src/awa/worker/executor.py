"""Running one attempt: decode the args, call the handler, turn what it did into an Outcome."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from awa.core.kinds import decode_args
from awa.errors import TerminalError
from awa.job import Job
from awa.lifecycle import staging
from awa.observability import metrics, tracing
from awa.outcomes import OUTCOME_TYPES, Cancel, RetryAfter, Snooze, WaitForCallback
from awa.worker.registry import Task
from awa.worker.results import (
    Cancelled,
    Completed,
    Fail,
    Interrupted,
    Outcome,
    Park,
    Retry,
    Snoozed,
    format_error,
    storable_text,
)

log = logging.getLogger("awa.worker")

SHUTDOWN_ERROR = "interrupted: the worker shut down before the handler finished"


def classify(result: object, job: Job[Any], duration: float) -> Outcome:
    """The outcome a handler chose by returning ``result``."""
    if result is None:
        return Completed(duration)
    if not isinstance(result, OUTCOME_TYPES):
        if isinstance(result, type) and issubclass(result, OUTCOME_TYPES):
            return Fail(
                f"invalid handler return value: the class {result.__name__} was returned; "
                f"return an instance such as {result.__name__}(...)"
            )
        if asyncio.iscoroutine(result):
            result.close()
            return Fail("invalid handler return value: a coroutine was returned (a missing await?)")
        return Completed(duration)
    if isinstance(result, RetryAfter):
        return Retry(
            error=None,
            delay=result.seconds,
            exhausted_error=(
                f"max_attempts exhausted (handler requested retry after {result.seconds:g}s)"
            ),
        )
    if isinstance(result, Snooze):
        return Snoozed(result.seconds)
    if isinstance(result, Cancel):
        return Cancelled(storable_text(str(result.reason)))
    if isinstance(result, WaitForCallback):
        return Park(result.token.id)
    raise AssertionError(f"unhandled outcome type {type(result).__name__}")


_OUTCOME_NAMES = {
    Completed: "completed",
    Retry: "retry",
    Fail: "failed",
    Cancelled: "cancelled",
    Snoozed: "snoozed",
    Interrupted: "interrupted",
    Park: "waiting_external",
}


async def run_attempt(
    job: Job[Any],
    task: Task | None,
    threads: Executor | None,
    *,
    shutting_down: asyncio.Event,
    on_start: Callable[[], None] | None = None,
) -> Outcome:
    """Run the handler for ``job`` and return its outcome (never raises for handler errors),
    in the attempt's consumer span when tracing is configured (``awa.observability.tracing``)."""
    traced = tracing.start_attempt(job.id, job.kind, job.queue, job.attempt, job._metadata)
    if traced is None:
        return await _attempt(job, task, threads, shutting_down, on_start)
    span, job._trace_context = traced
    token = tracing.activate(span)
    outcome: Outcome | None = None
    try:
        outcome = await _attempt(job, task, threads, shutting_down, on_start)
        return outcome
    finally:
        tracing.deactivate(token)
        error = getattr(outcome, "exception", None)
        name = _OUTCOME_NAMES.get(type(outcome), "crashed")
        tracing.end_attempt(span, name, error, isinstance(outcome, Retry | Fail | None))


async def _attempt(
    job: Job[Any],
    task: Task | None,
    threads: Executor | None,
    shutting_down: asyncio.Event,
    on_start: Callable[[], None] | None,
) -> Outcome:
    if job.is_cancelled():
        # Cancelled while it waited in the prefetch buffer: the handler must not start. The
        # row has left 'running' already, so this outcome's guarded write changes nothing.
        return Cancelled("cancelled before the handler started")
    if task is None:
        return Fail(f"unknown job kind: {job.kind} (no handler is registered for it here)")
    try:
        job._args = decode_args(task.args_type, job.raw_args)
    except Exception as error:
        type_name = getattr(task.args_type, "__name__", str(task.args_type))
        return Fail(f"failed to decode args of kind {job.kind!r} into {type_name}: {error}", error)
    if on_start is not None:
        on_start()  # the handler is about to run, with its args decoded
    started = time.perf_counter()
    outcome: Outcome
    try:
        if task.is_async:
            job._handler_task = asyncio.current_task()
            try:
                result = await task.handler(job)
            finally:
                job._handler_task = None
        else:
            loop = asyncio.get_running_loop()
            # The thread runs in this task's context (the attempt's span, for its inserts).
            run = functools.partial(contextvars.copy_context().run, task.handler, job)
            result = await loop.run_in_executor(threads, run)
    except asyncio.CancelledError as error:
        if shutting_down.is_set():
            outcome = Interrupted(SHUTDOWN_ERROR)
        elif job._interrupt_reason is not None:
            # The runtime interrupted it: its attempt is over (cancelled or rescued), so
            # this outcome's guarded write will be stale.
            outcome = Interrupted(job._interrupt_reason)
        else:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            # Nobody cancelled this attempt: the handler raised CancelledError itself. That
            # is a crash like any other; re-raising it would kill the slot and strand the job.
            outcome = Retry(error=format_error(error), exception=error)
    except TerminalError as error:
        outcome = Fail(format_error(error), error)
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt | SystemExit) and shutting_down.is_set():
            outcome = Interrupted(SHUTDOWN_ERROR)
        else:
            outcome = Retry(error=format_error(error), exception=error)
    else:
        outcome = classify(result, job, time.perf_counter() - started)
    if job._interrupt_reason is not None and not shutting_down.is_set():
        # Consume the interruption's cancel request (delivered, or swallowed by the
        # handler), so that the slot's later awaits and timeouts are not disturbed.
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            current.uncancel()
    # The handler has returned: staging closes. Jobs that staged and recorded nothing have
    # no buffer (the common case costs this one check).
    job._sealed = True
    if job._extras is not None:
        outcome = settle_staged(job, outcome)
    return outcome


def settle_staged(job: Job[Any], outcome: Outcome) -> Outcome:
    """Apply the staging rules to an outcome: staged follow-ups and output survive only a
    completion, and a completion after a failed stage fails the job terminally."""
    buffer = staging.freeze(job)
    if buffer is None:
        return outcome
    if isinstance(outcome, Completed):
        if buffer.error is not None:
            buffer.discard()
            return Fail(
                "awa.StagingError: the handler completed after a follow-up could not be "
                f"staged (it would complete without its follow-up): {buffer.error}"
            )
        return outcome
    dropped = buffer.discard()
    if dropped and isinstance(outcome, Park):
        log.warning(
            "job %s (kind %s) parked on a callback: its %d staged follow-up(s) are discarded "
            "(only a completion inserts them; to build a follow-up from the callback's payload, "
            "wait with job.wait_for_callback() in the handler, then stage)",
            job.id,
            job.kind,
            dropped,
        )
        metrics.staged_follow_ups_discarded.add(
            dropped, {metrics.KIND: job.kind, metrics.QUEUE: job.queue}
        )
    return outcome
