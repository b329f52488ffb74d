"""Completions committed many per transaction, follow-ups included.

A batch's plain completions are one statement. When some of its jobs have follow-ups
(``Completed`` specs of their kind, or follow-ups their handler staged), the whole batch is
one transaction:

1. the plain completions, one statement;
2. ``SAVEPOINT``, then the completions with follow-ups, one statement returning their rows;
3. for each committed row, the ``Completed`` specs run (closures see the row without its
   output), their follow-ups are validated, and the staged follow-ups join them;
4. a job whose closure raised, returned the wrong type or asked for an invalid follow-up is
   an offender: ``ROLLBACK TO SAVEPOINT`` undoes step 2, and step 2 runs again without it.
   The other rows come back as they were (``now()`` is fixed for a transaction), so their
   follow-ups stand; the offender takes the failure path after the batch;
5. every follow-up in one COPY (or, when some have unique keys, one insert that skips the
   held ones), then the caller commits.

So each job's completion and its follow-ups commit together or not at all, and one bad
closure does not hold back the rest of its batch. Closures run inside the batch's
transaction: plain functions one after the other, ``async def`` ones side by side; keep them
quick, since the batch commits when the slowest has returned.

An insert the database refuses cannot be pinned on one job: the follow-up part rolls back
to the savepoint, the plain completions still commit, and the jobs with follow-ups are
committed one by one, each in a transaction of its own, where a failure belongs to its job.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Any

import psycopg

from awa.errors import DatabaseError, SchemaNotMigrated, UniqueConflict
from awa.job import Job
from awa.lifecycle.followups import (
    FollowUpError,
    Trigger,
    TriggerContext,
    count_follow_ups,
    follow_up_flow,
    prepare_follow_ups,
)
from awa.model import JobRow
from awa.observability import tracing
from awa.producer.copy import copy_prepared_flow
from awa.producer.insert import PreparedJob
from awa.sql import query
from awa.storage.db import Flow, drive_async, run_async
from awa.worker import results
from awa.worker.completer import (
    Done,
    Pending,
    Returned,
    complete_returning_statement,
    completed_row,
    flush_plain,
)
from awa.worker.finalizer import Finalizer, commits_staged, count_staged

log = logging.getLogger("awa.worker")

_COMPLETED = TriggerContext(Trigger.COMPLETED)


@dataclasses.dataclass(slots=True)
class _Plan:
    """One committed completion and the follow-ups it inserts (``row``: the committed row,
    built when its closures needed it)."""

    job: Job[Any]
    duration: float
    returned: Returned
    row: JobRow | None
    from_specs: list[PreparedJob]
    staged: list[PreparedJob]


def has_follow_ups(finalizer: Finalizer, batch: list[Pending]) -> bool:
    """Whether a job of the batch commits with follow-ups (so its flush plans them)."""
    return any(
        finalizer.needs_own_transaction(job, results.Completed(duration)) for job, duration in batch
    )


async def flush_with_follow_ups(
    finalizer: Finalizer, conn: psycopg.AsyncConnection[Any], batch: list[Pending]
) -> list[Done]:
    """Commit a batch of completions (see the module docstring); what became of each."""
    plain: list[Pending] = []
    rich: list[Pending] = []
    for job, duration in batch:
        wants = finalizer.needs_own_transaction(job, results.Completed(duration))
        (rich if wants else plain).append((job, duration))
    try:
        if not rich:
            return await flush_plain(conn, plain)
        async with conn.transaction():
            done = await flush_plain(conn, plain) if plain else []
            done.extend(await _with_follow_ups(finalizer, conn, rich))
        return done
    except UniqueConflict:
        # A completion would move a job into its unique mask while a newer job holds the key
        # (a mask covering completed but not running). Nothing of the batch committed; job
        # by job, the one that collides is cancelled as superseded and the others complete.
        log.info("a completion of the batch collides with a unique key; completing one by one")
        return [Done(job, duration, None, alone=True) for job, duration in batch]


async def _with_follow_ups(
    finalizer: Finalizer, conn: psycopg.AsyncConnection[Any], batch: list[Pending]
) -> list[Done]:
    await conn.execute(query("savepoint_follow_ups"))
    returned = await run_async(conn, complete_returning_statement([job for job, _ in batch]))
    plans, failures = await _plan_all(finalizer, batch, returned)
    if failures:
        await conn.execute(query("rollback_to_follow_ups"))
        kept = [plan.job for plan in plans]
        returned = await run_async(conn, complete_returning_statement(kept)) if kept else {}
        # A job that went stale between the rollback and the new statement (rescued or
        # cancelled meanwhile) has no row any more, and no follow-ups.
        plans = [plan for plan in plans if plan.job.id in returned]
    settled = {plan.job.id for plan in plans} | {failure.job.id for failure in failures}
    stale = [Done(job, duration, None) for job, duration in batch if job.id not in settled]
    prepared = [job for plan in plans for job in (*plan.from_specs, *plan.staged)]
    try:
        skipped = await drive_async(conn, _insert_flow(prepared))
    except (DatabaseError, SchemaNotMigrated, psycopg.OperationalError):
        raise  # an outage: the whole batch is retried
    except Exception as error:
        log.warning(
            "inserting the follow-ups of %d completions failed (%s: %s); completing them one "
            "by one to find the job it belongs to",
            len(plans),
            type(error).__name__,
            error,
        )
        await conn.execute(query("rollback_to_follow_ups"))
        alone = [Done(plan.job, plan.duration, None, alone=True) for plan in plans]
        return alone + failures + stale
    return _settle(plans, skipped) + failures + stale


def _insert_flow(jobs: list[PreparedJob]) -> Flow[set[int]]:
    """Insert the follow-ups; the ``id()`` of those skipped as duplicates. COPY (the
    cheapest for the server) unless one of them has a unique key, which only the INSERT
    path can skip when it is held."""
    if any(job.unique_key is not None for job in jobs):
        result = yield from follow_up_flow(jobs)
        return {id(job) for job in result.duplicates}
    yield from copy_prepared_flow(jobs, rows=False)
    return set()


async def _plan_all(
    finalizer: Finalizer, batch: list[Pending], returned: dict[int, Returned]
) -> tuple[list[_Plan], list[Done]]:
    """Plan every committed completion of the batch (stale ones returned nothing). Kinds
    whose closures are all plain functions run one after the other; ``async def`` closures
    run side by side, so that one waiting on something holds the batch for its own time
    only."""
    plans: list[_Plan] = []
    failures: list[Done] = []
    waiting: list[Pending] = []
    follow_ups = finalizer.follow_ups
    for job, duration in batch:
        values = returned.get(job.id)
        if values is None:
            continue  # stale: nothing was written for it
        if follow_ups.awaits(Trigger.COMPLETED, job.kind):
            waiting.append((job, duration))
            continue
        try:
            plans.append(await _plan(finalizer, job, duration, values))
        except FollowUpError as error:
            failures.append(Done(job, duration, None, failure=error))
    if waiting:
        planned = await asyncio.gather(
            *(_plan(finalizer, job, duration, returned[job.id]) for job, duration in waiting),
            return_exceptions=True,
        )
        for (job, duration), plan in zip(waiting, planned, strict=True):
            if isinstance(plan, FollowUpError):
                failures.append(Done(job, duration, None, failure=plan))
            elif isinstance(plan, BaseException):
                raise plan
            else:
                plans.append(plan)
    return plans, failures


async def _plan(finalizer: Finalizer, job: Job[Any], duration: float, returned: Returned) -> _Plan:
    """Run the job's Completed specs on its committed row and collect its follow-ups."""
    specs = finalizer.follow_ups.specs(Trigger.COMPLETED, job.kind)
    from_specs: list[PreparedJob] = []
    row = None
    if specs:
        row = completed_row(job, returned)
        # Closures see the row without its output: a job must not read another's output.
        trigger_row = dataclasses.replace(row, output=None) if row.output is not None else row
        rules = finalizer.follow_ups.insert_rules
        with tracing.continuing(job._trace_context):  # follow-ups join the attempt's trace
            from_specs = await prepare_follow_ups(specs, trigger_row, _COMPLETED, rules, job._args)
    buffer = job._extras
    outcome = results.Completed(duration)
    commits = buffer is not None and commits_staged(job, outcome)
    staged = buffer.prepared(job.id, job.kind) if buffer is not None and commits else []
    return _Plan(job, duration, returned, row, from_specs, staged)


def _settle(plans: list[_Plan], skipped: set[int]) -> list[Done]:
    """What became of each planned completion, its follow-ups counted (``skipped``: the
    ``id()`` of the follow-ups skipped as duplicates). The runtime builds the Completed
    event from the committed row, for the kinds that have hooks."""
    counts: collections.Counter[tuple[str, str, str, bool]] = collections.Counter()
    done = []
    for plan in plans:
        job = plan.job
        for source, jobs in (("specs", plan.from_specs), ("staged", plan.staged)):
            for prepared in jobs:
                counts[source, job.kind, job.queue, id(prepared) not in skipped] += 1
        finalized_at = plan.returned[0].timestamp()
        done.append(Done(job, plan.duration, finalized_at, plan.returned, plan.row))
    for (source, kind, queue, inserted), count in counts.items():
        if source == "specs":
            duplicates = 0 if inserted else count
            count_follow_ups(kind, Trigger.COMPLETED, count if inserted else 0, duplicates)
        else:
            count_staged(kind, queue, count if inserted else 0, 0 if inserted else count)
    return done
