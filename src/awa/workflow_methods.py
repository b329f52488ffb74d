"""Workflow, batch and waiting methods of ``AsyncClient`` and ``Client`` (mixins).

Waiting uses a notification, not polling: ``wait`` marks the job watched (its final state is
then announced on the ``awa_finished`` channel, by the trigger of migration 11) after it has
started listening, and returns as soon as the job is completed, failed or cancelled.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg

from awa.db import Statement, drive_async, drive_sync, run_async, run_sync
from awa.errors import AwaError, ValidationError
from awa.insert import InsertRules
from awa.model import TERMINAL_STATES, JobRow
from awa.sql import query
from awa.workflows import (
    BatchRun,
    Workflow,
    WorkflowInfo,
    WorkflowRun,
    batch_workflow,
    cancel_workflow_statement,
    get_workflow_statement,
    workflow_id,
)

CHANNEL = "awa_finished"


class WaitTimeout(AwaError, TimeoutError):
    """``wait`` gave up before the job finished (the job is untouched)."""


def _watch_statement(job_id: int) -> Statement[JobRow | None]:
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise ValidationError(f"job id must be an integer, not {type(job_id).__name__}")
    return Statement(
        query("watch_job"),
        {"id": job_id},
        lambda rows: JobRow.from_record(rows[0]) if rows else None,
    )


def _timeout(timeout: float | None) -> float | None:
    if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
        raise ValidationError("timeout must be a number of seconds >= 0, or None")
    return timeout


def _ids(job_ids: Iterable[int]) -> list[int]:
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        raise ValidationError("wait_many() needs at least one job id")
    return ids


class AsyncWorkflowMethods:
    """Mixin of ``AsyncClient``."""

    _insert_rules: InsertRules

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError  # provided by AsyncClient

    async def insert_workflow(self, workflow: Workflow) -> WorkflowRun:
        """Insert every job of ``workflow`` atomically, with its dependencies."""
        async with self.connection() as conn, conn.transaction():
            return await drive_async(conn, workflow.flow(self._insert_rules))

    async def insert_batch(
        self, members: Iterable[Any], *, on_complete: Any, **options: Any
    ) -> BatchRun:
        """Insert ``members`` and a fan-in job ``on_complete`` (args or an
        ``awa.EnqueueRequest``) that runs once after all of them finished, whatever their
        outcomes; ``options`` apply to each member."""
        workflow, fan_in = batch_workflow(members, on_complete, options)
        run = await self.insert_workflow(workflow)
        return BatchRun(run.id, run.jobs[: fan_in.index], run[fan_in])

    async def get_workflow(self, workflow: uuid.UUID | str) -> WorkflowInfo:
        """Every job of a workflow (or batch) with its state and dependencies."""
        statement = get_workflow_statement(workflow)
        async with self.connection() as conn:
            return WorkflowInfo(workflow_id(workflow), await run_async(conn, statement))

    async def cancel_workflow(self, workflow: uuid.UUID | str) -> int:
        """Cancel every unfinished job of a workflow; returns how many."""
        statement = cancel_workflow_statement(workflow)
        async with self.connection() as conn:
            return await run_async(conn, statement)

    async def wait(self, job_id: int, *, timeout: float | None = None) -> JobRow:
        """The job's row once it is completed, failed or cancelled (with its output).
        Raises WaitTimeout after ``timeout`` seconds, ValidationError for an unknown id."""
        return (await self.wait_many([job_id], timeout=timeout))[job_id]

    async def wait_many(
        self, job_ids: Iterable[int], *, timeout: float | None = None
    ) -> dict[int, JobRow]:
        """``wait`` for several jobs: their final rows by id, once all have finished."""
        ids = _ids(job_ids)
        deadline = None if _timeout(timeout) is None else time.monotonic() + (timeout or 0)
        finished: dict[int, JobRow] = {}
        async with self.connection() as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            try:
                pending = set()
                for job_id in ids:
                    row = await run_async(conn, _watch_statement(job_id))
                    if row is None:
                        raise ValidationError(f"no job {job_id} to wait for")
                    if row.state in TERMINAL_STATES:
                        finished[job_id] = row
                    else:
                        pending.add(job_id)
                while pending:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise WaitTimeout(
                            f"job(s) {sorted(pending)} did not finish within {timeout} s"
                        )
                    announced: set[int] = set()
                    gen = conn.notifies(timeout=left, stop_after=1)
                    async for notify in gen:
                        if notify.payload.isdigit() and int(notify.payload) in pending:
                            announced.add(int(notify.payload))
                    for job_id in announced:
                        row = await run_async(conn, _watch_statement(job_id))
                        if row is None or row.state in TERMINAL_STATES:
                            # Deleted after finishing (retention, a DLQ move): the last
                            # state we can report is gone; report what we saw.
                            if row is None:
                                raise ValidationError(f"job {job_id} was deleted")
                            finished[job_id] = row
                            pending.discard(job_id)
            finally:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(f"UNLISTEN {CHANNEL}")
        return finished


class WorkflowMethods:
    """Mixin of the blocking ``Client``."""

    _insert_rules: InsertRules

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError  # provided by Client

    def insert_workflow(self, workflow: Workflow) -> WorkflowRun:
        with self.connection() as conn, conn.transaction():
            return drive_sync(conn, workflow.flow(self._insert_rules))

    def insert_batch(self, members: Iterable[Any], *, on_complete: Any, **options: Any) -> BatchRun:
        workflow, fan_in = batch_workflow(members, on_complete, options)
        run = self.insert_workflow(workflow)
        return BatchRun(run.id, run.jobs[: fan_in.index], run[fan_in])

    def get_workflow(self, workflow: uuid.UUID | str) -> WorkflowInfo:
        statement = get_workflow_statement(workflow)
        with self.connection() as conn:
            return WorkflowInfo(workflow_id(workflow), run_sync(conn, statement))

    def cancel_workflow(self, workflow: uuid.UUID | str) -> int:
        statement = cancel_workflow_statement(workflow)
        with self.connection() as conn:
            return run_sync(conn, statement)

    def wait(self, job_id: int, *, timeout: float | None = None) -> JobRow:
        return self.wait_many([job_id], timeout=timeout)[job_id]

    def wait_many(
        self, job_ids: Iterable[int], *, timeout: float | None = None
    ) -> dict[int, JobRow]:
        ids = _ids(job_ids)
        deadline = None if _timeout(timeout) is None else time.monotonic() + (timeout or 0)
        finished: dict[int, JobRow] = {}
        with self.connection() as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            try:
                pending = set()
                for job_id in ids:
                    row = run_sync(conn, _watch_statement(job_id))
                    if row is None:
                        raise ValidationError(f"no job {job_id} to wait for")
                    if row.state in TERMINAL_STATES:
                        finished[job_id] = row
                    else:
                        pending.add(job_id)
                while pending:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise WaitTimeout(
                            f"job(s) {sorted(pending)} did not finish within {timeout} s"
                        )
                    announced = {
                        int(notify.payload)
                        for notify in conn.notifies(timeout=left, stop_after=1)
                        if notify.payload.isdigit() and int(notify.payload) in pending
                    }
                    for job_id in announced:
                        row = run_sync(conn, _watch_statement(job_id))
                        if row is None:
                            raise ValidationError(f"job {job_id} was deleted")
                        if row.state in TERMINAL_STATES:
                            finished[job_id] = row
                            pending.discard(job_id)
            finally:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(f"UNLISTEN {CHANNEL}")
        return finished


__all__ = ["AsyncWorkflowMethods", "WaitTimeout", "WorkflowMethods"]
