"""Jobs that wait for other jobs: the step that follows an insert with ``depends_on``.

A job inserted with ``depends_on=[...]`` first goes in like any other, then, in the same
transaction, ``awa.add_dependencies`` records its edges and puts it in the state its parents
call for: ``blocked`` while one is unfinished (workers never claim it), or cancelled at once
when a parent already failed under ``on_dependency_failure="cancel"``. Parents must exist
already (inserted earlier, or earlier in the same transaction), so a cycle cannot be built.
The release itself happens in the database, in the transaction that commits the last
parent's outcome (see migration 11).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from awa.db import Flow, Statement
from awa.insert import PreparedJob
from awa.model import JobRow, JobState
from awa.sql import query


def has_dependencies(jobs: Sequence[PreparedJob]) -> bool:
    return any(job.depends_on for job in jobs)


def _state(rows: list[dict[str, Any]]) -> str:
    return str(rows[0]["state"])


def _row(rows: list[dict[str, Any]]) -> JobRow:
    return JobRow.from_record(rows[0])


def dependencies_flow(rows: list[JobRow], jobs: Sequence[PreparedJob]) -> Flow[list[JobRow]]:
    """Record the edges of the jobs just inserted (``rows``, in the order of ``jobs``) and
    return the rows as their parents left them. Run it in the inserts' transaction."""
    result = []
    for row, job in zip(rows, jobs, strict=True):
        if job.depends_on:
            params = {
                "child": row.id,
                "parents": list(job.depends_on),
                "policy": job.dependency_policy,
            }
            # A parent that does not exist raises ValidationError naming it.
            state = yield Statement(query("add_dependencies"), params, _state)
            if state != row.state.value:
                row = yield Statement(query("get_job"), {"id": row.id}, _row)
        result.append(row)
    return result


def blocked(row: JobRow) -> bool:
    return row.state is JobState.BLOCKED
