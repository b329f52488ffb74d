"""Completing an attempt in the handler's own transaction (exactly-once state effects).

``job.finalize()`` opens a transaction on the client's pool, ``job.complete_in(conn)`` and
``job.complete_in_sync(conn)`` join one the application already holds (psycopg, asyncpg,
SQLAlchemy, Django). Either way the completion of this exact attempt is written by the same
guarded statement the worker uses, keyed by ``(job_id, run_lease)``, followed by the
registered ``Completed`` follow-ups and the staged ones; workflow and batch releases come
with it (triggers on the completed row). Nothing here commits: the caller's commit makes the
business writes and the completion visible together, and a rollback removes both.

When the guard finds the attempt gone (rescued, cancelled, re-claimed), a server function
raises, so the transaction is aborted by Postgres itself and its writes cannot commit
without the completion (``awa.AttemptLost``). The runtime learns the result afterwards: a
completion awa committed itself is final; any other is checked against the database
(``attempt_evidence``) before the runtime counts it, fires hooks or retries the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, Literal, Protocol, cast

from awa.errors import AttemptLost, AwaError, StagingError, ValidationError
from awa.lifecycle import staging
from awa.lifecycle.followups import (
    FollowUpRegistry,
    FollowUpSpec,
    Trigger,
    TriggerContext,
    follow_up_flow,
    prepare_follow_ups,
)
from awa.model import JobRow, JobState
from awa.producer.bridge import outside_transaction, statement_runner_async
from awa.producer.insert import InsertRules
from awa.producer.statements import SkippingInsert
from awa.sql import query
from awa.storage.db import CopyStatement, Notifications, Statement


@dataclasses.dataclass(slots=True)
class Finalization:
    """A completion of one attempt written in a transaction the handler controls.

    ``row``: the completed row the statement returned; ``follow_ups``: the registered specs'
    follow-ups (``registered``) then the staged ones (``staged``); ``committed``: awa
    committed the transaction itself (``job.finalize()``), so no check is needed."""

    row: JobRow
    registered: SkippingInsert
    staged: SkippingInsert | None
    committed: bool = False

    @property
    def follow_ups(self) -> list[JobRow]:
        staged = self.staged.inserted if self.staged is not None else []
        return [*self.registered.inserted, *staged]


class FinalizingJob(staging.StagingJob, Protocol):
    """What completing in the caller's transaction needs of an ``awa.Job``."""

    kind: str
    run_lease: int
    _args: Any
    _finalization: Finalization | None


class FinalizeServices(Protocol):
    """What the runtime lends a job for it: its follow-up specs, its event loop (a ``def``
    handler's spec closures run there) and transactions on its pool."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def follow_ups(self) -> FollowUpRegistry: ...

    def transaction(self) -> Any:
        """A new transaction on the client's pool (``awa.Transaction``)."""
        ...


def require_transaction(conn: Any, name: str) -> None:
    """Refuse a connection that would commit the completion at once, apart from the writes."""
    if outside_transaction(conn):
        raise ValidationError(
            f"job.{name}() needs a transaction open on the connection: it is in autocommit "
            "mode, so the completion would commit at once, apart from the writes it must "
            "commit with (open one: conn.transaction(), transaction.atomic(), ...)"
        )


class OwnTransaction:
    """The transaction ``job.finalize()`` opens: an ``awa.Transaction`` (``execute``,
    ``fetch_all``, ``fetch_optional``, ``fetch_one``, ``insert``, ``insert_many``,
    ``insert_workflow``, ``insert_batch``, ``connection``) whose end belongs to the block:
    ``commit()`` and ``rollback()`` raise, since committing early would commit the writes
    without the completion."""

    __slots__ = ("_tx",)

    def __init__(self, tx: Any) -> None:
        self._tx = tx

    @property
    def connection(self) -> Any:
        """The underlying psycopg ``AsyncConnection``, for statements beyond this API."""
        return self._tx.connection

    async def execute(self, query: str, *params: Any) -> int:
        """Run a statement; the number of rows it affected (as ``Transaction.execute``)."""
        return int(await self._tx.execute(query, *params))

    async def fetch_all(self, query: str, *params: Any) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._tx.fetch_all(query, *params))

    async def fetch_optional(self, query: str, *params: Any) -> dict[str, Any] | None:
        return cast(dict[str, Any] | None, await self._tx.fetch_optional(query, *params))

    async def fetch_one(self, query: str, *params: Any) -> dict[str, Any]:
        return cast(dict[str, Any], await self._tx.fetch_one(query, *params))

    async def insert(self, args: Any, **kwargs: Any) -> JobRow:
        """Insert a job in this transaction (an outbox job: it exists once this commits)."""
        return cast(JobRow, await self._tx.insert(args, **kwargs))

    async def insert_many(self, jobs: Any, **kwargs: Any) -> list[JobRow]:
        return cast(list[JobRow], await self._tx.insert_many(jobs, **kwargs))

    async def insert_workflow(self, workflow: Any) -> Any:
        return await self._tx.insert_workflow(workflow)

    async def insert_batch(self, members: Any, *, on_complete: Any, **options: Any) -> Any:
        return await self._tx.insert_batch(members, on_complete=on_complete, **options)

    async def commit(self) -> None:
        raise AwaError(
            "job.finalize() commits when its block ends, with the completion: a commit "
            "inside the block would commit the writes without it"
        )

    async def rollback(self) -> None:
        raise AwaError("job.finalize() rolls back when its block raises: raise instead")


@dataclasses.dataclass(frozen=True, slots=True)
class _Closures:
    """A step that runs the registered specs' closures (they may await; no SQL)."""

    specs: list[FollowUpSpec]
    row: JobRow
    rules: InsertRules
    decoded: Any


_Step = Statement[Any] | CopyStatement | Notifications | _Closures

Verdict = Literal["committed", "open", "lost"]

NOT_COMMITTED = (
    "the handler wrote its completion in its own transaction (job.finalize() / "
    "job.complete_in()), but that transaction did not commit (rolled back, or still open "
    "when the handler returned); the attempt is retried"
)


def verdict(row: JobRow | None, run_lease: int) -> Verdict:
    """What the job's row now says of a completion written in the handler's transaction:
    ``committed`` (completed under this lease), ``open`` (still running under it: the
    transaction rolled back) or ``lost`` (rescued, cancelled or deleted meanwhile)."""
    if row is not None and row.run_lease == run_lease:
        if row.state is JobState.COMPLETED:
            return "committed"
        if row.state is JobState.RUNNING:
            return "open"
    return "lost"


def evidence_statement(job_id: int) -> Statement[JobRow | None]:
    """The job's row now, to decide the ``verdict``."""
    return Statement(query("attempt_evidence"), {"id": job_id}, _row)


def _steps(job: FinalizingJob, registry: FollowUpRegistry) -> Generator[_Step, Any, Finalization]:
    buffer = staging.freeze(job)  # nothing can be staged or recorded after the completion
    if buffer is not None and buffer.error is not None:
        raise StagingError(
            "the attempt cannot complete: a follow-up could not be staged (it would complete "
            f"without it): {buffer.error}"
        )
    guard = {"id": job.id, "lease": job.run_lease}
    output = staging.output_json(job)
    row = yield Statement(query("complete_job"), {**guard, "output": output}, _row)
    if row is None:
        # The attempt is gone: make the server abort the transaction (the statement raises).
        try:
            yield Statement(query("attempt_lost"), guard, lambda rows: None)
        except Exception as error:
            raise AttemptLost(job.id, job.run_lease) from error
        raise AttemptLost(job.id, job.run_lease)
    registered = SkippingInsert([], [])
    specs = registry.specs(Trigger.COMPLETED, job.kind)
    if specs:
        # Closures see the row without its output, as on the worker's own path.
        trigger_row = dataclasses.replace(row, output=None)
        prepared = yield _Closures(specs, trigger_row, registry.insert_rules, job._args)
        registered = yield from follow_up_flow(prepared)
    staged = None
    if buffer is not None and buffer.staged:
        staged = yield from follow_up_flow(buffer.prepared(row.id, row.kind))
    job._finalization = record = Finalization(row, registered, staged)
    return record


def _row(rows: list[dict[str, Any]]) -> JobRow | None:
    return JobRow.from_record(rows[0]) if rows else None


def _closures(step: _Closures) -> Coroutine[Any, Any, Any]:
    context = TriggerContext(Trigger.COMPLETED)
    return prepare_follow_ups(step.specs, step.row, context, step.rules, step.decoded)


async def complete_async(
    run: Callable[[Any], Awaitable[Any]], job: FinalizingJob, registry: FollowUpRegistry
) -> Finalization:
    """Write this attempt's completion with ``run`` (statements on the caller's open
    transaction); raises AttemptLost when the attempt is gone. A step's error is thrown
    back into the flow, which decides what it means."""
    flow = _steps(job, registry)
    step = next(flow)
    try:
        while True:
            try:
                result = await (_closures(step) if isinstance(step, _Closures) else run(step))
            except Exception as error:
                step = flow.throw(error)
            else:
                step = flow.send(result)
    except StopIteration as stop:
        return cast(Finalization, stop.value)


def complete_sync(
    run: Callable[[Any], Any],
    job: FinalizingJob,
    registry: FollowUpRegistry,
    loop: asyncio.AbstractEventLoop,
) -> Finalization:
    """Blocking twin of :func:`complete_async`, for ``def`` handlers in a worker thread (the
    specs' closures run on the event loop, as they do for the worker)."""
    flow = _steps(job, registry)
    step = next(flow)
    try:
        while True:
            try:
                if isinstance(step, _Closures):
                    result = asyncio.run_coroutine_threadsafe(_closures(step), loop).result()
                else:
                    result = run(step)
            except Exception as error:
                step = flow.throw(error)
            else:
                step = flow.send(result)
    except StopIteration as stop:
        return cast(Finalization, stop.value)


@contextlib.asynccontextmanager
async def owned(job: FinalizingJob, services: FinalizeServices) -> AsyncIterator[OwnTransaction]:
    """``job.finalize()``: a transaction on the client's pool that writes the completion
    when the block ends normally, then commits (a block that raises rolls back)."""
    async with services.transaction() as tx:
        yield OwnTransaction(tx)
        run = statement_runner_async(tx.connection, "job.finalize")
        await complete_async(run, job, services.follow_ups)
    record = job._finalization
    if record is not None:
        record.committed = True
