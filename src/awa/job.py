"""The job object handed to a handler: the claimed row plus what the attempt can do."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import math
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, Unpack

from awa.errors import CallbackWaitError, ValidationError
from awa.lifecycle import finalization, staging
from awa.lifecycle.claimed_row import ROW_INDEX, ClaimedRow
from awa.model import JobRow, JobState
from awa.observability.tracing import TRACEPARENT
from awa.outcomes import CallbackToken
from awa.producer.bridge import statement_runner_async, statement_runner_sync
from awa.producer.insert import DEFAULT_RULES, InsertKwargs, InsertRules
from awa.storage.db import Statement

if TYPE_CHECKING:
    from awa.lifecycle.finalization import Finalization
    from awa.lifecycle.staging import AttemptBuffer, StagedFollowUp

A = TypeVar("A")
R = TypeVar("R")
P = ParamSpec("P")


class AttemptServices(finalization.FinalizeServices, Protocol):
    """What a running Job needs from the runtime."""

    @property
    def insert_rules(self) -> InsertRules:
        """The client's rules for follow-ups the handler stages (queues, size limits)."""
        ...

    async def flush_progress(self, job: Job[Any]) -> None: ...

    async def execute(self, statement: Statement[R]) -> R:
        """Run one statement on a pooled connection."""
        ...

    async def wait_signal(self, job_id: int, timeout: float) -> None:
        """Sleep until the job's callback is resumed or it is cancelled (or ``timeout``)."""
        ...


CALLBACK_RESULT_KEY = "_awa_callback_result"
_STATE = ROW_INDEX["state"]
_NO_REST: tuple[Any, ...] = (None,) * 11


def _from_epoch(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _check_storable(value: object, path: str) -> None:
    """Raise ValidationError for what a jsonb column cannot hold: NUL characters (in strings
    or keys) and NaN or infinite numbers."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationError(f"{path} contains a NUL byte, which Postgres cannot store")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(f"{path} is NaN or infinite, which JSON cannot represent")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                raise ValidationError(f"{path} key {key!r} contains a NUL byte")
            _check_storable(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_storable(item, f"{path}[{index}]")


def _refuse_loop_thread(name: str) -> None:
    """A blocking form called on the event loop's thread would hang the loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # a worker thread, as it should be
    raise RuntimeError(f"{name}() is for def handlers; await the async form instead")


def _from_thread(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], R]:
    """The blocking twin of a coroutine method of ``Job``, for plain ``def`` handlers running
    in a worker thread (it runs the coroutine on the worker's event loop)."""
    name = f"{method.__name__}_sync"

    def call(job: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return job._run_from_thread(name, method(job, *args, **kwargs))  # type: ignore[no-any-return]

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{method.__name__}()`` for plain ``def`` handlers running in a worker thread."
    call.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return call


class Job(Generic[A]):
    """One attempt of a job, as seen by its handler.

    Attributes mirror the claimed row (``attempt`` counts this attempt). The methods report
    progress, stage follow-ups for the completion (``enqueue_on_completion``), record the
    job's output, and ``is_cancelled()`` tells a long handler to stop early: it turns true
    when an operator cancels the job, its deadline passes, or the worker shuts down.
    """

    __slots__ = (
        "_args",
        "_attempted_at",
        "_callback_id",
        "_cancelled",
        "_created_at",
        "_deadline",
        "_errors",
        "_extras",
        "_finalization",
        "_handler_task",
        "_interrupt_reason",
        "_metadata",
        "_progress",
        "_progress_version",
        "_rest",
        "_row_base",
        "_run_at",
        "_sealed",
        "_services",
        "_trace_context",
        "attempt",
        "id",
        "kind",
        "max_attempts",
        "priority",
        "queue",
        "raw_args",
        "run_lease",
        "tags",
    )

    def __init__(
        self,
        *,
        id: int,
        kind: str,
        queue: str,
        raw_args: Any,
        priority: int,
        attempt: int,
        max_attempts: int,
        run_lease: int,
        run_at: dt.datetime,
        created_at: dt.datetime,
        attempted_at: dt.datetime | None,
        deadline: dt.datetime | None,
        errors: list[dict[str, Any]],
        metadata: dict[str, Any],
        tags: list[str],
        progress: dict[str, Any] | None,
        services: AttemptServices | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.queue = queue
        self.raw_args = raw_args
        self.priority = priority
        self.attempt, self.max_attempts = attempt, max_attempts
        self.run_lease = run_lease
        self._run_at: dt.datetime | float = run_at
        self._created_at: dt.datetime | float = created_at
        self._attempted_at: dt.datetime | float | None = attempted_at
        self._deadline: dt.datetime | float | None = deadline
        self._errors: list[dict[str, Any]] | None = errors
        self._metadata: dict[str, Any] | None = metadata
        self.tags = tags
        self._progress = progress
        self._progress_version = 0
        self._cancelled = False
        self._services = services
        self._callback_id: str | None = None
        self._args: Any = None
        self._rest: tuple[Any, ...] = _NO_REST
        self._row_base: list[Any] | None = None
        self._extras: AttemptBuffer | None = None
        self._sealed = False
        # The task running the async handler, while it runs: what the runtime cancels to
        # interrupt a handler that ignored is_cancelled() (see Runtime._interrupt). The
        # reason is set then, so that the CancelledError it gets is no crash.
        self._handler_task: asyncio.Task[Any] | None = None
        self._interrupt_reason: str | None = None
        # The traceparent of this attempt's span, while tracing: its follow-ups' parent.
        self._trace_context: str | None = None
        # The completion written in the handler's own transaction (finalize, complete_in).
        self._finalization: Finalization | None = None

    @classmethod
    def from_claim(cls, row: tuple[Any, ...], services: AttemptServices | None) -> Job[Any]:
        """Build from a row of the ``claim_jobs`` query (column order as listed there).

        The claim path builds thousands of these per second, so it skips ``__init__`` and
        keeps timestamps as epoch seconds until someone reads them.
        """
        job: Job[Any] = cls.__new__(cls)
        (
            job.id,
            job.kind,
            job.queue,
            job.raw_args,
            job.priority,
            job.attempt,
            job.max_attempts,
            job.run_lease,
            job._run_at,
            job._created_at,
            job._attempted_at,
            job._deadline,
            job._errors,
            job._metadata,
            job.tags,
            job._progress,
        ) = row[:16]
        job._rest = row[16:]
        job._row_base = None
        job._progress_version = 0
        job._cancelled = False
        job._services = services
        job._callback_id = None
        job._args = None
        job._extras = None
        job._sealed = False
        job._handler_task = None
        job._interrupt_reason = None
        job._trace_context = None
        job._finalization = None
        return job

    @property
    def args(self) -> A:
        """The job's args, decoded into the handler's args type."""
        return self._args  # type: ignore[no-any-return]

    def snapshot(self, state: JobState = JobState.RUNNING, **changes: Any) -> JobRow:
        """This attempt's row as claimed, with ``changes`` applied (for lifecycle events).

        The row fills its other columns on first use: a hook that reads only the job's id,
        kind, queue, state or attempt costs no conversion of timestamps and JSON."""
        return ClaimedRow.of(self, state, changes)

    def _row_values(self, state: JobState, changes: dict[str, Any]) -> list[Any]:
        base = self._row_base
        if base is None:
            base = self._row_base = self._claimed_row_values()
        values = list(base)
        values[_STATE] = state
        for name, value in changes.items():
            values[ROW_INDEX[name]] = value
        return values

    def _claimed_row_values(self) -> list[Any]:
        (
            deadline_duration,
            unique_key,
            unique_states,
            ordering_key,
            callback_id,
            callback_timeout_at,
            callback_filter,
            callback_on_complete,
            callback_on_fail,
            callback_transform,
            concurrency_key,
        ) = self._rest[:11]  # the lane position follows: the dispatcher's, not the row's
        return [
            self.id,
            self.kind,
            self.queue,
            self.raw_args,
            JobState.RUNNING,
            self.priority,
            self.attempt,
            self.max_attempts,
            self.run_lease,
            self.run_at,
            self.created_at,
            self.attempted_at,
            None,
            self.attempted_at,
            self.deadline,
            deadline_duration,
            list(self.errors),
            dict(self.metadata),
            list(self.tags),
            unique_key,
            unique_states,
            ordering_key,
            str(callback_id) if callback_id is not None else None,
            _from_epoch(callback_timeout_at) if callback_timeout_at is not None else None,
            callback_filter,
            callback_on_complete,
            callback_on_fail,
            callback_transform,
            self._progress,
            None,
            False,  # callback_in_handler: a claimed attempt is not waiting in its handler
            concurrency_key,
            False,  # has_dependents: the claim does not read it (see JobRow)
            None,  # workflow_id: likewise
        ]

    @property
    def run_at(self) -> dt.datetime:
        return self._timestamp("_run_at")  # type: ignore[no-any-return]

    @property
    def _claim_order(self) -> tuple[int, float, int]:
        """The order jobs are claimed in: priority, then run_at, then id."""
        run_at = self._run_at
        return (self.priority, run_at if isinstance(run_at, float) else run_at.timestamp(), self.id)

    @property
    def concurrency_key(self) -> str | None:
        """The key whose running jobs the queue's ``key_concurrency`` limits (None: none)."""
        key: str | None = self._rest[10]
        return key

    @property
    def created_at(self) -> dt.datetime:
        return self._timestamp("_created_at")  # type: ignore[no-any-return]

    @property
    def attempted_at(self) -> dt.datetime | None:
        return self._timestamp("_attempted_at")  # type: ignore[no-any-return]

    @property
    def deadline(self) -> dt.datetime | None:
        """When this attempt's deadline passes (None: no deadline)."""
        return self._timestamp("_deadline")  # type: ignore[no-any-return]

    def _timestamp(self, slot: str) -> Any:
        # Claimed rows carry epoch seconds; convert on first read and keep the datetime.
        value = getattr(self, slot)
        if isinstance(value, float):
            value = _from_epoch(value)
            setattr(self, slot, value)
        return value

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Error history of earlier attempts, oldest first."""
        if self._errors is None:
            self._errors = []
        return self._errors

    @property
    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent of the context the job was inserted in
        (``awa.observability.tracing``)."""
        value = self._metadata.get(TRACEPARENT) if self._metadata else None
        return value if isinstance(value, str) else None

    @property
    def state(self) -> JobState:
        return JobState.RUNNING

    @property
    def progress(self) -> dict[str, Any] | None:
        """The latest progress: what this attempt set, else what earlier attempts left."""
        return self._progress

    def is_cancelled(self) -> bool:
        return self._cancelled

    def set_progress(self, percent: float, message: str | None = None) -> None:
        """Record progress (percent clamped to 0-100); stored by the next heartbeat, at the
        end of the attempt, or by ``flush_progress()``. Survives retries; cleared on
        completion."""
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise TypeError("percent must be a number")
        progress = dict(self._progress or {})
        progress["percent"] = max(0, min(100, int(percent)))
        if message is None:
            progress.pop("message", None)
        else:
            progress["message"] = str(message)
        self._replace_progress(progress)

    def update_metadata(self, updates: Mapping[str, Any]) -> None:
        """Merge keys into ``progress["metadata"]`` (a shallow merge)."""
        if not isinstance(updates, Mapping):
            raise TypeError("update_metadata() takes a dict")
        progress = dict(self._progress or {})
        current = progress.get("metadata") or {}
        if not isinstance(current, dict):
            raise TypeError("progress metadata is not an object and cannot be merged into")
        progress["metadata"] = {**current, **updates}
        self._replace_progress(progress)

    def enqueue_on_completion(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> StagedFollowUp:
        """Stage a follow-up job, inserted in the same transaction as this attempt's
        completion (after the registered ``Completed`` follow-ups, duplicates of a held
        unique key skipped). Takes the keyword arguments of ``Transaction.insert``.

        Only a completion inserts it: any other outcome discards it, and a retried attempt
        starts with nothing staged. Validated now: raises ``awa.StagingError`` for what the
        insert would reject, beyond ``MAX_STAGED_FOLLOW_UPS`` or ``MAX_STAGED_BYTES``, or
        once the handler has returned. A handler that catches it and completes anyway fails
        terminally.
        """
        return staging.stage(self, args, kwargs)

    @property
    def staged(self) -> tuple[StagedFollowUp, ...]:
        """The follow-ups this attempt has staged so far."""
        buffer = self._extras
        return tuple(buffer.staged) if buffer is not None else ()

    def record_output(self, value: Any) -> None:
        """Record the job's output: a JSON value (or dataclass / pydantic model), stored on
        the completed row (``get_job``, ``awa job get``) and carried by the ``Completed``
        event; None clears it. Only a completion stores it. Raises ValidationError when it is
        not JSON or larger than ``awa.MAX_OUTPUT_BYTES`` as JSON. Follow-ups get what they
        need in their args: a job must not read another job's output."""
        staging.record_output(self, value)

    @property
    def output(self) -> Any:
        """The output recorded so far by this attempt (as JSON round-trips it), or None."""
        buffer = self._extras
        return buffer.output if buffer is not None else None

    def _replace_progress(self, progress: dict[str, Any]) -> None:
        # Refused here, where the handler sees it: once buffered, a value jsonb cannot hold
        # would fail the heartbeat of every running job of the process, and the outcome.
        _check_storable(progress, "progress")
        # Swapping the reference (never mutating in place) lets the heartbeat thread read a
        # consistent snapshot without a lock.
        self._progress = progress
        self._progress_version += 1

    async def register_callback(
        self,
        timeout_seconds: float = 3600.0,
        filter: str | None = None,
        on_complete: str | None = None,
        on_fail: str | None = None,
        transform: str | None = None,
    ) -> CallbackToken:
        """Register a callback for an outside system to answer; returns its token, already
        stored in the database (send ``token.id`` out only after this returns).

        Then return ``awa.WaitForCallback(token)`` to park the job, or
        ``await job.wait_for_callback(token)`` to wait here. Registering again replaces the
        earlier callback. The optional CEL expressions over ``payload`` drive
        ``resolve_callback``; they are checked now, so a bad one raises ValidationError.
        """
        from awa import callbacks

        services = self._require_services("register_callback")
        token = callbacks.new_token()
        expressions = {
            "filter": filter,
            "on_complete": on_complete,
            "on_fail": on_fail,
            "transform": transform,
        }
        statement = callbacks.register_statement(
            self.id, self.run_lease, token, timeout_seconds, expressions
        )
        if not await services.execute(statement):
            raise CallbackWaitError(
                f"job {self.id} is no longer running this attempt; cannot register a callback"
            )
        self._callback_id = token.id
        return token

    def _holds_callback(self, callback_id: str) -> bool:
        """Whether ``callback_id`` is the callback this attempt registered last (the only
        one it may park or wait on; an earlier one was replaced)."""
        return self._callback_id is not None and self._callback_id == callback_id

    async def wait_for_callback(self, token: CallbackToken) -> Any:
        """Wait, keeping this handler's slot, until ``resume_external(token.id, payload)``;
        returns the payload. Raises CallbackWaitError when the token is stale or the job is
        cancelled, rescued or resolved otherwise meanwhile. Can be repeated with new tokens.
        """
        from awa import callbacks

        services = self._require_services("wait_for_callback")
        return await callbacks.wait_for_callback(services, self, token)

    def finalize(self) -> AbstractAsyncContextManager[finalization.OwnTransaction]:
        """``async with job.finalize() as tx:`` a transaction on the client's pool in which
        the business writes and this attempt's completion commit together (with its
        follow-ups, registered and staged, and its workflow releases). The completion is
        written as the block ends normally, then it commits; a block that raises rolls both
        back. Raises ``awa.AttemptLost`` when the attempt was rescued, cancelled or
        re-claimed meanwhile: the writes roll back. Hooks fire after the commit. Keep the
        block short: do network calls before it. See docs/finalize.md."""
        return finalization.owned(self, self._require_services("finalize"))

    async def complete_in(self, conn: Any) -> None:
        """Write this attempt's completion in the transaction open on ``conn`` (psycopg
        ``AsyncConnection``, asyncpg, SQLAlchemy ``AsyncConnection`` / ``AsyncSession``);
        it commits or rolls back with the caller's transaction. Raises ``awa.AttemptLost``
        (the server aborts the transaction) when the attempt is no longer running."""
        services = self._require_services("complete_in")
        run = statement_runner_async(conn, "job.complete_in")
        finalization.require_transaction(conn, "complete_in")
        await finalization.complete_async(run, self, services.follow_ups)

    def complete_in_sync(self, conn: Any) -> None:
        """``complete_in()`` for ``def`` handlers on a blocking connection (psycopg
        ``Connection``, SQLAlchemy ``Connection`` / ``Session``, a Django connection)."""
        services = self._require_services("complete_in_sync")
        _refuse_loop_thread("complete_in_sync")
        run = statement_runner_sync(conn, "job.complete_in_sync")
        finalization.require_transaction(conn, "complete_in_sync")
        finalization.complete_sync(run, self, services.follow_ups, services.loop)

    register_callback_sync = _from_thread(register_callback)
    wait_for_callback_sync = _from_thread(wait_for_callback)

    def _run_from_thread(self, name: str, coroutine: Any) -> Any:
        try:
            services = self._require_services(name)
            _refuse_loop_thread(name)
        except RuntimeError:
            coroutine.close()
            raise
        return asyncio.run_coroutine_threadsafe(coroutine, services.loop).result()

    @property
    def callback_result(self) -> Any:
        """The payload ``resume_external`` handed to a job parked by WaitForCallback (it
        runs again with it); None when there is none."""
        return self.metadata.get(CALLBACK_RESULT_KEY)

    def _insert_rules(self) -> InsertRules:
        """The rules of follow-ups staged by the handler (queues, size limits)."""
        return self._services.insert_rules if self._services is not None else DEFAULT_RULES

    def _require_services(self, name: str) -> AttemptServices:
        if self._services is None:
            raise RuntimeError(f"{name}() is only available while the job runs")
        return self._services

    async def flush_progress(self) -> None:
        """Write pending progress now (a no-op once the attempt is no longer running)."""
        if self._services is None:
            raise RuntimeError("flush_progress() is only available while the job runs")
        await self._services.flush_progress(self)

    def flush_progress_sync(self) -> None:
        """``flush_progress()`` for plain ``def`` handlers running in a worker thread. On the
        event loop's own thread it raises RuntimeError (waiting there would hang the loop):
        an async handler awaits ``flush_progress()``."""
        if self._services is None:
            raise RuntimeError("flush_progress_sync() is only available while the job runs")
        self._run_from_thread("flush_progress_sync", self._services.flush_progress(self))

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id}, kind={self.kind!r}, queue={self.queue!r}, "
            f"attempt={self.attempt}/{self.max_attempts})"
        )
