"""The producer's statements: inserting prepared jobs (one, many, skipping held unique keys),
the checks before a workflow's insert, and the UniqueConflict a violation becomes. Flows
and statements only: the clients, transactions and the bridge run them."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import orjson

from awa.errors import DatabaseError, UniqueConflict, ValidationError
from awa.model import JobRow, JobState
from awa.producer.dependencies import dependencies_flow, has_dependencies
from awa.producer.insert import UNIQUE_INDEX, PreparedJob
from awa.sql import query
from awa.storage.db import Autocommit, Call, Flow, Statement

INSERT_CHUNK = 5000


def insert_flow(jobs: Sequence[PreparedJob]) -> Flow[list[JobRow]]:
    """Insert jobs; raise UniqueConflict naming the holder when a unique key is taken.

    Several jobs with unique keys must run inside a transaction (or savepoint) so that a
    conflict undoes the rows that did go in.
    """
    parents = [parent for job in jobs for parent in job.depends_on or ()]
    if parents:
        yield from dependency_preflight_flow(parents)
    inserted: list[JobRow] = []
    for start in range(0, len(jobs), INSERT_CHUNK):
        chunk = jobs[start : start + INSERT_CHUNK]
        payload = "[" + ",".join(job.recordset_json() for job in chunk) + "]"
        rows = yield Statement(query("insert_jobs"), {"jobs": payload}, _rows)
        missing = missing_unique_keys(chunk, rows)
        if missing:
            batch_ids = {job.id for job in inserted} | {int(row["id"]) for row in rows}
            yield from unique_conflict_flow(chunk, missing, batch_ids)
        rows.sort(key=lambda row: row["id"])
        inserted.extend(_inserted(job, row) for job, row in zip(chunk, rows, strict=True))
    return inserted


def dependency_preflight_flow(
    parents: Iterable[int], workflow: Any = None, workflow_name: str | None = None
) -> Flow[None]:
    """Before an insert: raise ValidationError naming the ``depends_on`` ids that name no job
    yet (a parent must exist before its child is inserted, so a job can never wait for
    itself nor for another job of the same insert), or when jobs of ``workflow`` (an id)
    exist already or another transaction is inserting them (it takes a transaction-level
    lock on the workflow id). Nothing is inserted when it raises."""
    wanted = sorted(set(parents))

    def decode(rows: list[dict[str, Any]]) -> None:
        missing = [int(job_id) for job_id in rows[0]["missing"]]
        if rows[0]["busy"]:
            raise ValidationError(
                f"workflow {workflow_name!r} ({workflow}) is being inserted by another "
                "transaction: a Workflow object inserts once"
            )
        if rows[0]["taken"]:
            raise ValidationError(
                f"workflow {workflow_name!r} ({workflow}) was inserted already: a Workflow "
                "object inserts once (build a new one to insert the same steps again)"
            )
        if missing:
            shown = ", ".join(str(job_id) for job_id in missing[:20])
            more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
            raise ValidationError(
                f"depends_on names jobs that do not exist: {shown}{more} (a job can depend "
                "only on jobs that exist before it is inserted)"
            )

    params = {"parents": wanted, "workflow": workflow}
    yield Statement(query("dependency_preflight"), params, decode)


def unique_conflict_flow(
    jobs: Sequence[PreparedJob], missing: Sequence[bytes], batch_ids: Collection[int] = ()
) -> Flow[NoReturn]:
    """Raise the UniqueConflict for keys an insert skipped, naming the jobs that hold them."""
    holders = yield Statement(query("unique_key_holders"), {"keys": list(missing)}, _holders)
    raise unique_conflict(jobs, missing, holders, batch_ids)


def _inserted(job: PreparedJob, row: Mapping[str, Any]) -> JobRow:
    """The stored row of a job from what an insert statement returned for it."""
    return stored_job(job, row["id"], JobState(row["state"]), row["run_at"], row["created_at"])


def insert_one_flow(job: PreparedJob) -> Flow[JobRow]:
    """Insert one job (the single-row statement); raises UniqueConflict like
    :func:`insert_flow`."""
    if _is_plain(job):
        plain = {
            "kind": job.kind,
            "queue": job.queue,
            "args": job.args_json,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
        }
        found = yield Statement(query("insert_job_plain"), plain, _rows, tuples=True)
        job_id, state, run_at, created_at = found[0]
        return stored_job(job, job_id, JobState(state), run_at, created_at)
    params = {
        "kind": job.kind,
        "queue": job.queue,
        "args": job.args_json,
        "run_at": job.run_at,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "metadata": job.metadata_json,
        "tags": job.tags,
        "unique_key": job.unique_key,
        "unique_states": job.unique_states,
        "ordering_key": job.ordering_key,
        "deadline_duration": job.deadline_duration,
        "concurrency_key": job.concurrency_key,
    }
    rows = yield Statement(query("insert_job"), params, _rows)
    if not rows:
        if job.unique_key is None:  # only a held unique key skips the row
            raise DatabaseError(f"inserting a {job.kind!r} job returned no row")
        yield from unique_conflict_flow([job], [job.unique_key])
    return _inserted(job, rows[0])


def _is_plain(job: PreparedJob) -> bool:
    """Whether every optional column of ``job`` is the table's default."""
    return (
        job.run_at is None
        and job.unique_key is None
        and not job.tags
        and job.metadata_json == "{}"
        and job.ordering_key is None
        and job.deadline_duration is None
        and job.concurrency_key is None
    )


@dataclasses.dataclass(slots=True)
class SkippingInsert:
    """What an insert that skips duplicates did."""

    inserted: list[JobRow]
    duplicates: list[PreparedJob]


def insert_skipping_duplicates_flow(jobs: Sequence[PreparedJob]) -> Flow[SkippingInsert]:
    """Insert jobs, skipping (not raising for) those whose unique key is already held, by
    an existing job or an earlier one of the same batch. Used for follow-up jobs."""
    result = SkippingInsert([], [])
    for start in range(0, len(jobs), INSERT_CHUNK):
        chunk = jobs[start : start + INSERT_CHUNK]
        payload = "[" + ",".join(job.recordset_json() for job in chunk) + "]"
        rows = yield Statement(query("insert_jobs"), {"jobs": payload}, _rows)
        rows.sort(key=lambda row: row["id"])
        keyed = {bytes(row["unique_key"]) for row in rows if row["unique_key"] is not None}
        remaining = iter(rows)
        for job in chunk:
            if job.unique_key is not None:
                if job.unique_key not in keyed:
                    result.duplicates.append(job)
                    continue
                keyed.discard(job.unique_key)  # later jobs with this key were skipped
            result.inserted.append(_inserted(job, next(remaining)))
    return result


def needs_transaction(jobs: Sequence[PreparedJob]) -> bool:
    """Whether inserting these jobs takes more than one atomic statement."""
    return len(jobs) > INSERT_CHUNK or (
        len(jobs) > 1 and any(job.unique_key is not None for job in jobs)
    )


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows


def _holders(rows: list[dict[str, Any]]) -> dict[bytes, int]:
    return {bytes(row["unique_key"]): int(row["id"]) for row in rows}


def missing_unique_keys(
    jobs: Sequence[PreparedJob], inserted: Sequence[Mapping[str, Any]]
) -> list[bytes]:
    """Unique keys that were requested but not inserted: held by another job, or by an
    earlier job of the same batch (ON CONFLICT DO NOTHING skips the later duplicate, so each
    inserted row accounts for one request of its key, not all of them)."""
    if len(inserted) == len(jobs):
        return []
    unclaimed = Counter(
        bytes(row["unique_key"]) for row in inserted if row["unique_key"] is not None
    )
    missing = []
    for job in jobs:
        if job.unique_key is None:
            continue
        if unclaimed[job.unique_key] > 0:
            unclaimed[job.unique_key] -= 1
        else:
            missing.append(job.unique_key)
    return missing


def unique_conflict(
    jobs: Sequence[PreparedJob],
    missing: Sequence[bytes],
    holders: Mapping[bytes, int],
    batch_ids: Collection[int] = (),
) -> UniqueConflict:
    key = missing[0]
    job = next(job for job in jobs if job.unique_key == key)
    holder = holders.get(key)
    if holder is not None and holder in batch_ids:
        # The holder is a row of this very batch, which the conflict rolls back.
        return UniqueConflict(
            f"two {job.kind!r} jobs in the same batch have the same unique key "
            f"{key.hex()} ({UNIQUE_INDEX})",
            job_id=None,
            constraint=UNIQUE_INDEX,
        )
    holder_text = f"job {holder}" if holder is not None else "another job"
    return UniqueConflict(
        f"a {job.kind!r} job with the same unique key already exists: {holder_text} holds "
        f"key {key.hex()} ({UNIQUE_INDEX})",
        job_id=holder,
        constraint=UNIQUE_INDEX,
    )


def stored_job(
    job: PreparedJob,
    job_id: int,
    state: JobState,
    run_at: dt.datetime,
    created_at: dt.datetime,
) -> JobRow:
    """The row an insert wrote, from what was sent plus what the database decided."""
    return JobRow(
        job_id,
        job.kind,
        job.queue,
        job.args,
        state,
        job.priority,
        0,
        job.max_attempts,
        0,
        run_at,
        created_at,
        None,
        None,
        None,
        None,
        job.deadline_duration,
        [],
        orjson.loads(job.metadata_json) if job.metadata_json != "{}" else {},
        list(job.tags),
        job.unique_key,
        job.unique_states,
        job.ordering_key,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        False,
        job.concurrency_key,
    )


def _with_dependencies(jobs: Sequence[PreparedJob]) -> Flow[list[JobRow]]:
    rows = yield from insert_flow(jobs)
    return (yield from dependencies_flow(rows, jobs))


def _one(job: PreparedJob) -> Flow[list[JobRow]]:
    return [(yield from insert_one_flow(job))]


def insert_call(jobs: Sequence[PreparedJob]) -> Call[list[JobRow]]:
    """How prepared jobs go in on a connection: atomically (a transaction, or a savepoint
    inside one) when they must; jobs with ``depends_on`` get their edges in the same
    transaction."""
    if has_dependencies(jobs):
        return _with_dependencies(jobs)
    if len(jobs) == 1:
        return Autocommit(_one(jobs[0]))
    if needs_transaction(jobs):
        return insert_flow(jobs)
    return Autocommit(insert_flow(jobs))


def _first(flow: Flow[list[JobRow]]) -> Flow[JobRow]:
    return (yield from flow)[0]


def insert_one_call(job: PreparedJob) -> Call[JobRow]:
    """``insert_call`` for one job, returning its row."""
    if job.depends_on:
        return _first(_with_dependencies([job]))
    return Autocommit(insert_one_flow(job))
