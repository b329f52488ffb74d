"""Testing helpers: run jobs through the real outcome path, or call handlers without a
database.

- ``AwaTestClient(client).work_one(ArgsType, handler)`` claims one due job of that kind and
  runs it the way a worker does: the same claim columns, the same executor and the same
  finalizer, so the outcome is written exactly as the runtime writes it. Staged follow-ups
  and the client's registered follow-ups are inserted in the completion's transaction, and
  the client's lifecycle hooks have run when it returns. ``drain()`` repeats that until
  nothing is due.
- ``HandlerJob(args)`` is an ``awa.Job`` for calling a handler directly in a unit test: it
  records staged follow-ups (``job.staged``), progress, output and callback registrations,
  and ``wait_for_callback`` returns canned payloads.

Importable without pytest; the pytest fixtures live in ``awa.testing_fixtures``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, Unpack

from psycopg.rows import tuple_row

from awa import admin, callbacks
from awa.callbacks import cel
from awa.core.kinds import args_to_json_value, derive_kind
from awa.errors import CallbackWaitError, ValidationError
from awa.job import CALLBACK_RESULT_KEY, Job
from awa.lifecycle import finalization
from awa.lifecycle.events import JobEvent, Started
from awa.lifecycle.followups import FollowUpError, FollowUpRegistry
from awa.lifecycle.hooks import is_async_callable
from awa.model import JobRow, JobState, check_name
from awa.outcomes import CallbackToken
from awa.producer.insert import DEFAULT_RULES, InsertKwargs, InsertRules
from awa.sql import query
from awa.storage.db import Statement, run_async, translate_errors
from awa.worker import results
from awa.worker.completer import complete_batch_statement, progress_param
from awa.worker.config import RetryPolicy
from awa.worker.executor import run_attempt
from awa.worker.finalizer import (
    Committed,
    Finalizer,
    batched_completed_event,
    commit_or_record_failure,
    settle_own_transaction,
)
from awa.worker.maintenance import promotion_duty
from awa.worker.registry import Task

if TYPE_CHECKING:
    from awa.client.asyncio_client import AsyncClient

__all__ = ["AwaTestClient", "HandlerJob", "NoJob", "RegisteredCallback", "WorkResult"]

A = TypeVar("A")
Handler = Callable[..., Any]

_OUTCOMES = {
    JobState.COMPLETED: "completed",
    JobState.RETRYABLE: "retryable",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.SCHEDULED: "snoozed",
    JobState.WAITING_EXTERNAL: "waiting",
}


class _NoJob:
    """The job of a ``no_job`` result: falsy, and one object (test it with ``is NoJob``)."""

    _instance: _NoJob | None = None

    def __new__(cls) -> _NoJob:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoJob"


NoJob = _NoJob()
"""What ``WorkResult.job`` is when no job was due (the reference package's sentinel)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkResult:
    """What ``work_one`` did.

    ``outcome`` is "completed", "retryable", "failed", "cancelled", "snoozed", "waiting"
    (parked on a callback), "no_job" (nothing due) or "stale" (the row changed under the
    attempt, so its outcome wrote nothing). A follow-up that fails rolls its outcome back and
    the attempt is recorded as failed, as on a worker: "retryable" (or "failed" on the last
    attempt) with an error naming the follow-up. ``job`` is the row as committed; ``error``
    the error this attempt added to it (for "cancelled", the reason as the handler gave it);
    ``event`` the lifecycle event the outcome produced; ``follow_ups`` the jobs inserted
    with it (registered specs' first, then staged ones).
    """

    outcome: str
    job: JobRow | _NoJob | None
    error: str | None = None
    event: JobEvent[Any] | None = None
    follow_ups: tuple[JobRow, ...] = ()

    @property
    def output(self) -> Any:
        """The output the job's completion stored (None: none)."""
        return self.job.output if isinstance(self.job, JobRow) else None

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_retryable(self) -> bool:
        return self.outcome == "retryable"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_cancelled(self) -> bool:
        return self.outcome == "cancelled"

    def is_snoozed(self) -> bool:
        return self.outcome == "snoozed"

    def is_waiting(self) -> bool:
        return self.outcome == "waiting"

    def is_no_job(self) -> bool:
        return self.outcome == "no_job"

    def is_stale(self) -> bool:
        return self.outcome == "stale"


class _Services:
    """What a running Job needs from its runtime, for jobs run by AwaTestClient."""

    def __init__(self, client: AsyncClient, poll: float) -> None:
        self._client = client
        self._poll = poll
        self._loop = asyncio.get_running_loop()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def insert_rules(self) -> InsertRules:
        return self._client._follow_ups.insert_rules

    @property
    def follow_ups(self) -> FollowUpRegistry:
        return self._client._follow_ups

    def transaction(self) -> Any:
        return self._client.transaction()

    async def flush_progress(self, job: Job[Any]) -> None:
        progress = progress_param(job)
        if progress is None:
            return
        params = {"id": job.id, "lease": job.run_lease, "progress": progress}
        await self.execute(Statement(query("flush_progress"), params, lambda rows: None))

    async def execute(self, statement: Statement[Any]) -> Any:
        async with self._client.connection() as conn:
            return await run_async(conn, statement)

    async def wait_signal(self, job_id: int, timeout: float) -> None:
        # No listener here: a waiting handler polls its row quickly instead.
        await asyncio.sleep(min(timeout, self._poll))


class AwaTestClient:
    """Runs jobs of an ``AsyncClient``'s database one at a time, in the calling task.

    The client's lifecycle hooks and follow-up specs are honoured (hooks are awaited, so
    they have run when a call returns); its worker runtime need not (and should not) run.
    ``retry`` and ``deadline_duration`` play the part of the queue's settings.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        retry: RetryPolicy | None = None,
        deadline_duration: float = 300.0,
    ) -> None:
        self._client = client
        self._retry = retry if retry is not None else RetryPolicy()
        self._deadline = dt.timedelta(seconds=deadline_duration)
        self._finalizer = Finalizer(client._follow_ups)
        self._never = asyncio.Event()
        self._services: _Services | None = None

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def migrate(self) -> None:
        await self._client.migrate()

    async def clean(self) -> None:
        """Delete every job and queue setting. For test databases only."""
        async with self._client.connection() as conn:
            await conn.execute(query("testing_clean"))

    async def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        """Insert a job (``AsyncClient.insert``)."""
        return await self._client.insert(args, **kwargs)

    async def get_job(self, job_id: int) -> JobRow | None:
        return await self._client.get_job(job_id)

    async def work_one(
        self,
        args_type: type[Any] | None,
        handler: Handler | None = None,
        *,
        kind: str | None = None,
        queue: str | None = None,
    ) -> WorkResult:
        """Claim the next due job of ``args_type``'s kind (in ``queue``, when given; paused
        queues are skipped) and run ``handler`` on it (default: the handler registered on
        the client for that kind). Returns ``WorkResult("no_job", NoJob)`` when none is due.
        """
        task = self._task(args_type, handler, kind)
        job = await self._claim([task.kind], queue)
        if job is None:
            return WorkResult("no_job", NoJob)
        return await self._run(job, task)

    async def drain(
        self,
        handlers: Mapping[type[Any] | str, Handler] | None = None,
        *,
        queue: str | None = None,
        max_jobs: int = 1000,
    ) -> list[WorkResult]:
        """Run due jobs until none is left: the kinds in ``handlers`` (keys are args
        classes, or kind strings for dict args), else every kind registered on the client.
        Scheduled and retryable jobs are promoted when their time has come, as maintenance
        would; jobs due later are left alone. Stops after ``max_jobs``."""
        tasks = self._tasks(handlers)
        if not tasks:
            raise ValidationError("drain() has no handlers: pass some or register tasks")
        done: list[WorkResult] = []
        while len(done) < max_jobs:
            async with self._client.connection() as conn:
                await promotion_duty(0.0, 1000).run(conn)
            job = await self._claim(list(tasks), queue)
            if job is None:
                break
            done.append(await self._run(job, tasks[job.kind]))
        return done

    # Internals ----------------------------------------------------------------------------

    def _task(self, args_type: type[Any] | None, handler: Handler | None, kind: str | None) -> Task:
        if kind is None:
            if args_type is None or not isinstance(args_type, type) or args_type is dict:
                raise ValidationError("work_one() needs an args class, or kind= for dict args")
            kind = derive_kind(args_type.__name__)
        check_name("kind", kind)
        if handler is None:
            registered = self._client._tasks.get(kind)
            if registered is None:
                raise ValidationError(
                    f"no handler given and none registered on the client for kind {kind!r}"
                )
            return registered
        if not callable(handler):
            raise ValidationError(f"the handler for {kind!r} is not callable")
        return Task(kind, args_type, handler, "default", is_async_callable(handler))

    def _tasks(self, handlers: Mapping[type[Any] | str, Handler] | None) -> dict[str, Task]:
        if handlers is None:
            return {task.kind: task for task in self._client._tasks}
        tasks = {}
        for key, handler in handlers.items():
            if isinstance(key, str):
                task = self._task(None, handler, key)
            else:
                task = self._task(key, handler, None)
            tasks[task.kind] = task
        return tasks

    async def _claim(self, kinds: list[str], queue: str | None) -> Job[Any] | None:
        if self._services is None:
            self._services = _Services(self._client, callbacks.WAIT_POLL_SECONDS / 20)
        params = {"kinds": kinds, "queue": queue, "deadline": self._deadline}
        with translate_errors():
            async with (
                self._client.connection() as conn,
                conn.cursor(row_factory=tuple_row, binary=True) as cursor,
            ):
                await cursor.execute(query("claim_one"), params)
                row = await cursor.fetchone()
        return Job.from_claim(row, self._services) if row is not None else None

    async def _run(self, job: Job[Any], task: Task) -> WorkResult:
        hooks = self._client.hook_dispatcher
        if hooks.wants(job.kind):
            await hooks.dispatch_and_wait(Started(job.snapshot(), job.raw_args))
        errors_before = len(job.errors)
        outcome = await run_attempt(job, task, None, shutting_down=self._never)
        if job._finalization is not None:
            settled = await self._settle_own_transaction(job, outcome)
            if isinstance(settled, WorkResult):
                return settled
            outcome = settled
        failures: list[FollowUpError] = []

        async def commit(outcome: results.Outcome, follow_ups: bool) -> Committed | None:
            return await self._commit(job, outcome, follow_ups)

        committed = await commit_or_record_failure(commit, outcome, failures.append)
        if committed is None:
            return WorkResult("stale", await self.get_job(job.id))
        if committed.event is not None:
            await hooks.dispatch_and_wait(committed.event)
        row = committed.row
        error = _last_error(row) if len(row.errors) > errors_before else None
        if isinstance(committed.outcome, results.Cancelled) and row.state is JobState.CANCELLED:
            # The reason as the handler gave it (the row's error says "cancelled: <reason>").
            error = committed.outcome.reason
        return WorkResult(
            _OUTCOMES.get(row.state, row.state.value),
            row,
            error,
            committed.event,
            tuple(committed.follow_ups),
        )

    async def _settle_own_transaction(
        self, job: Job[Any], outcome: results.Outcome
    ) -> WorkResult | results.Outcome:
        """As the runtime settles it (``settle_own_transaction``): a result when the attempt
        is over, else the outcome left to commit."""
        record = job._finalization
        assert record is not None
        row: JobRow | None = record.row
        if not record.committed:
            async with self._client.connection() as conn:
                row = await run_async(conn, finalization.evidence_statement(job.id))
        settled = settle_own_transaction(job, outcome, row)
        if isinstance(settled, results.Outcome):
            return settled
        if settled is None:
            return WorkResult("stale", await self.get_job(job.id))
        if settled.event is not None and self._client.hook_dispatcher.wants(job.kind):
            await self._client.hook_dispatcher.dispatch_and_wait(settled.event)
        return WorkResult("completed", settled.row, None, settled.event, tuple(settled.follow_ups))

    async def _commit(
        self, job: Job[Any], outcome: results.Outcome, follow_ups: bool
    ) -> Committed | None:
        """Commit the way the runtime does: a completion without follow-ups on the batched
        completion statement, everything else through the finalizer."""
        async with self._client.connection() as conn:
            if isinstance(outcome, results.Completed) and not (
                self._finalizer.needs_own_transaction(job, outcome, follow_ups=follow_ups)
            ):
                applied = await run_async(conn, complete_batch_statement([job]))
                finalized_at = applied.get((job.id, job.run_lease))
                if finalized_at is None:
                    return None
                row = await admin.get_job(conn, job.id)
                assert row is not None
                return Committed(row, batched_completed_event(job, outcome.duration, finalized_at))
            return await self._finalizer.commit(
                conn, job, outcome, self._retry, follow_ups=follow_ups
            )


def _last_error(row: JobRow) -> str | None:
    return str(row.errors[-1].get("error", "")) if row.errors else None


@dataclasses.dataclass(slots=True)
class RegisteredCallback:
    """A callback a HandlerJob's handler registered."""

    token: CallbackToken
    timeout_seconds: float
    filter: str | None = None
    on_complete: str | None = None
    on_fail: str | None = None
    transform: str | None = None
    waited: bool = False


class HandlerJob(Job[A], Generic[A]):
    """An ``awa.Job`` for calling a handler in a unit test, without a database.

    Everything the handler does is recorded: ``staged`` (follow-ups, validated exactly as
    the runtime validates them), ``progress``, ``output``, ``callbacks`` (registrations;
    each returns a token) and ``progress_flushes``. ``wait_for_callback`` returns the
    ``callback_payloads`` in order, and raises CallbackWaitError when none is left or the
    token is not the latest one registered. ``request_cancel()`` makes ``is_cancelled()``
    true. ``await job.run(handler)`` calls the handler and then closes staging, as the
    runtime does when a handler returns. With ``client``, follow-ups staged without
    ``queue=`` go to their kind's task queue on that client, as in the worker.
    """

    def __init__(
        self,
        args: A,
        *,
        id: int = 1,
        kind: str | None = None,
        queue: str = "default",
        priority: int = 2,
        attempt: int = 1,
        max_attempts: int = 25,
        metadata: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        errors: Sequence[dict[str, Any]] = (),
        progress: dict[str, Any] | None = None,
        deadline: dt.datetime | None = None,
        callback_payloads: Iterable[Any] = (),
        callback_result: Any = None,
        client: AsyncClient | None = None,
    ) -> None:
        if kind is None:
            kind = "job" if isinstance(args, Mapping) else derive_kind(type(args).__name__)
        now = dt.datetime.now(dt.UTC)
        meta = dict(metadata or {})
        if callback_result is not None:
            meta[CALLBACK_RESULT_KEY] = callback_result
        super().__init__(
            id=id,
            kind=check_name("kind", kind),
            queue=check_name("queue", queue),
            raw_args=args_to_json_value(args),
            priority=priority,
            attempt=attempt,
            max_attempts=max_attempts,
            run_lease=attempt,
            run_at=now,
            created_at=now,
            attempted_at=now,
            deadline=deadline,
            errors=list(errors),
            metadata=meta,
            tags=list(tags),
            progress=progress,
        )
        self._args = args
        self._rules = client._follow_ups.insert_rules if client is not None else DEFAULT_RULES
        self.callbacks: list[RegisteredCallback] = []
        self.progress_flushes: list[dict[str, Any] | None] = []
        self._payloads = collections.deque(callback_payloads)

    def _insert_rules(self) -> InsertRules:
        return self._rules

    @property
    def staging_error(self) -> str | None:
        """Why a stage failed (the first failure), or None. A real attempt that completes
        after one fails terminally."""
        buffer = self._extras
        return buffer.error if buffer is not None else None

    def request_cancel(self) -> None:
        """Make ``is_cancelled()`` true, as an operator's cancel or shutdown would."""
        self._cancelled = True

    async def run(self, handler: Handler) -> Any:
        """Call ``handler(self)`` (a def handler on a thread), then seal staging; returns
        what the handler returned."""
        try:
            if is_async_callable(handler):
                return await handler(self)
            result = await asyncio.to_thread(handler, self)
            if inspect.isawaitable(result):
                return await result
            return result
        finally:
            self._sealed = True

    async def register_callback(
        self,
        timeout_seconds: float = 3600.0,
        filter: str | None = None,
        on_complete: str | None = None,
        on_fail: str | None = None,
        transform: str | None = None,
    ) -> CallbackToken:
        """Record the registration (expressions are checked as the runtime checks them)."""
        registration = RegisteredCallback(
            callbacks.new_token(),
            callbacks.check_timeout(timeout_seconds),
            cel.check_expression("filter", filter),
            cel.check_expression("on_complete", on_complete),
            cel.check_expression("on_fail", on_fail),
            cel.check_expression("transform", transform),
        )
        self.callbacks.append(registration)
        return registration.token

    async def wait_for_callback(self, token: CallbackToken) -> Any:
        """The next canned payload (``callback_payloads``)."""
        if not isinstance(token, CallbackToken):
            raise TypeError("wait_for_callback() takes the token returned by register_callback()")
        latest = self.callbacks[-1] if self.callbacks else None
        if latest is None or latest.token != token or latest.waited:
            raise CallbackWaitError(f"callback token {token.id} is stale for job {self.id}")
        if self._cancelled:
            raise CallbackWaitError(f"job {self.id} was cancelled while waiting for its callback")
        if not self._payloads:
            raise CallbackWaitError(
                "HandlerJob has no canned callback payload left: pass "
                "HandlerJob(..., callback_payloads=[...])"
            )
        latest.waited = True
        return self._payloads.popleft()

    async def flush_progress(self) -> None:
        self.progress_flushes.append(self._progress)

    def flush_progress_sync(self) -> None:
        self.progress_flushes.append(self._progress)

    def _require_services(self, name: str) -> Any:
        if name in ("finalize", "complete_in", "complete_in_sync"):
            raise RuntimeError(
                f"{name}() writes the completion in a database transaction, which a "
                "HandlerJob does not have: run the handler with AwaTestClient"
            )
        return super()._require_services(name)
