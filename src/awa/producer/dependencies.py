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

from awa.model import JobRow
from awa.producer.insert import PreparedJob
from awa.sql import query
from awa.storage.db import Flow, Statement


def has_dependencies(jobs: Sequence[PreparedJob]) -> bool:
    return any(job.depends_on for job in jobs)


def _states(rows: list[dict[str, Any]]) -> dict[int, str]:
    return {int(row["child_id"]): str(row["state"]) for row in rows}


def dependencies_flow(rows: list[JobRow], jobs: Sequence[PreparedJob]) -> Flow[list[JobRow]]:
    """Record the edges of the jobs just inserted (``rows``, in the order of ``jobs``) in one
    statement and return the rows as their parents left them. Run it in the inserts'
    transaction."""
    children: list[int] = []
    parents: list[int] = []
    policies: list[str] = []
    for row, job in zip(rows, jobs, strict=True):
        for parent in job.depends_on or ():
            children.append(row.id)
            parents.append(parent)
            policies.append(job.dependency_policy)
    if not children:
        return rows
    params = {"children": children, "parents": parents, "policies": policies}
    # A parent that does not exist raises ValidationError naming it.
    states = yield Statement(query("add_dependencies"), params, _states)
    changed = [row.id for row in rows if row.id in states and states[row.id] != row.state.value]
    if not changed:
        return rows
    fresh = yield Statement(query("jobs_by_ids"), {"ids": changed}, JobRow.from_records)
    by_id = {row.id: row for row in fresh}
    return [by_id.get(row.id, row) for row in rows]
