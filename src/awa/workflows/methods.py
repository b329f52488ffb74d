"""Workflow, batch and waiting methods of both clients (``AsyncClient`` and ``Client``).

Waiting uses a notification, not polling: ``wait`` marks the job watched (its final state is
then announced on the ``awa_finished`` channel, by the trigger of migration 11) after it has
started listening, and returns as soon as the job is completed, failed or cancelled.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from awa.core.arguments import check_id, check_ids, check_seconds
from awa.errors import AwaError, ValidationError
from awa.model import TERMINAL_STATES, JobRow
from awa.producer.insert import InsertRules
from awa.sql import query
from awa.storage.calls import client_method
from awa.storage.db import Call, Flow, Listening, Notifications, Statement
from awa.workflows.operations import (
    BatchRun,
    Step,
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


class _Waiting:
    """What ``wait_many`` waits for: the jobs not finished yet, the rows of those that are,
    and the time left. The async and blocking clients drive it with their own LISTEN."""

    def __init__(self, job_ids: Iterable[int], timeout: float | None) -> None:
        self.ids = check_ids("job_ids", job_ids)
        self.timeout = _timeout(timeout)
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self.pending = set(self.ids)
        self.finished: dict[int, JobRow] = {}
        self.watching = False

    def watch(self, ids: Iterable[int]) -> Statement[None]:
        """Mark these jobs watched and take in the rows of those finished already (or, for
        jobs announced finished, now)."""
        wanted = list(ids)
        first = not self.watching
        self.watching = True

        def seen(rows: list[dict[str, Any]]) -> None:
            found = {row.id: row for row in JobRow.from_records(rows)}
            for job_id in wanted:
                row = found.get(job_id)
                if row is None:
                    raise ValidationError(
                        f"no job {job_id} to wait for"
                        if first
                        else f"job {job_id} left awa.jobs (deleted, or moved to the "
                        "dead-letter queue)"
                    )
                if row.state in TERMINAL_STATES:
                    self.finished[job_id] = row
                    self.pending.discard(job_id)

        return Statement(query("watch_jobs"), {"ids": wanted}, seen)

    def time_left(self) -> float | None:
        """Seconds left to wait (None: no limit); WaitTimeout once there are none."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"job(s) {sorted(self.pending)} did not finish within {self.timeout} s"
            )
        return left

    def announced(self, payloads: Iterable[str]) -> set[int]:
        """The pending jobs among the notifications' payloads."""
        return {int(p) for p in payloads if p.isdigit() and int(p) in self.pending}


def _timeout(value: object) -> float | None:
    """``timeout`` in seconds: None (no limit), or a finite number from 0 to 100 years."""
    if value is None:
        return None
    try:
        return check_seconds("timeout", value)
    except ValidationError as error:
        raise ValidationError(f"{error} (None waits without a limit)") from None


def _insert_batch(workflow: Workflow, fan_in: Step, rules: InsertRules) -> Flow[BatchRun]:
    run = yield from workflow.flow(rules)
    return BatchRun(run.id, run.jobs[: fan_in.index], run[fan_in])


def _first(job_id: int, flow: Flow[dict[int, JobRow]]) -> Flow[JobRow]:
    return (yield from flow)[job_id]


def _wait_flow(waiting: _Waiting) -> Flow[dict[int, JobRow]]:
    """Watch the jobs, then take in the announced ones until none is pending (run while
    listening on ``CHANNEL``)."""
    yield waiting.watch(waiting.ids)
    while waiting.pending:
        payloads = yield Notifications(waiting.time_left())
        announced = waiting.announced(payloads)
        if announced:
            yield waiting.watch(announced)
    return waiting.finished


class WorkflowMethods:
    """Mixin of both clients: workflows, batches and waiting for jobs."""

    _insert_rules: InsertRules

    @client_method
    def insert_workflow(self, workflow: Workflow) -> Call[WorkflowRun]:
        """Insert every job of ``workflow`` atomically, with its dependencies."""
        return workflow.flow(self._insert_rules)

    @client_method
    def insert_batch(
        self, /, members: Iterable[Any], *, on_complete: Any, **options: Any
    ) -> Call[BatchRun]:
        """Insert ``members`` and a fan-in job ``on_complete`` (args or an
        ``awa.EnqueueRequest``) that runs once after all of them finished, whatever their
        outcomes; ``options`` apply to each member."""
        workflow, fan_in = batch_workflow(members, on_complete, options)
        return _insert_batch(workflow, fan_in, self._insert_rules)

    @client_method
    def get_workflow(self, workflow: uuid.UUID | str) -> Call[WorkflowInfo]:
        """Every job of a workflow (or batch) with its state and dependencies."""
        statement = get_workflow_statement(workflow)
        found = workflow_id(workflow)
        return Statement(
            statement.sql,
            statement.params,
            lambda rows: WorkflowInfo(found, statement.decode(rows)),
        )

    @client_method
    def cancel_workflow(self, workflow: uuid.UUID | str) -> Call[int]:
        """Cancel every unfinished job of a workflow; returns how many."""
        return cancel_workflow_statement(workflow)

    @client_method
    def wait(self, job_id: int, *, timeout: float | None = None) -> Call[JobRow]:
        """The job's row once it is completed, failed or cancelled (with its output).
        Raises WaitTimeout after ``timeout`` seconds (a finite number from 0 to 100 years;
        None: no limit), ValidationError for an unknown id or a bad argument."""
        check_id("job_id", job_id)
        waiting = _Waiting([job_id], timeout)
        return Listening(CHANNEL, _first(job_id, _wait_flow(waiting)))

    @client_method
    def wait_many(
        self, job_ids: Iterable[int], *, timeout: float | None = None
    ) -> Call[dict[int, JobRow]]:
        """``wait`` for several jobs (1 to 10,000 ids): their final rows by id, once all have
        finished."""
        return Listening(CHANNEL, _wait_flow(_Waiting(job_ids, timeout)))


__all__ = ["WaitTimeout", "WorkflowMethods"]
