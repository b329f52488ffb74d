"""Bulk inserts with COPY: ids reserved in one statement, rows formatted as text while the
COPY streams (Postgres writes while Python formats the next ones), and the returned rows
built in the same pass. Batches with unique jobs take the INSERT path, which reports
duplicates."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from awa.errors import ValidationError
from awa.model import EnqueueRequest, InsertOpts, JobRow, JobState
from awa.producer.insert import DEFAULT_RULES, BatchPreparer, InsertRules, PreparedJob
from awa.producer.statements import insert_flow, stored_job
from awa.sql import query
from awa.storage.db import CopyStatement, Flow, Statement


def with_per_job_opts(jobs: Iterable[Any], opts: Sequence[Any] | None) -> list[Any]:
    """The reference package's ``insert_many_copy(jobs, opts=[...])``: one entry per job,
    None or a dict of ``queue`` and ``ordering_key`` overriding the batch's options (an
    explicit ``"ordering_key": None`` clears the batch's key for that job)."""
    batch = list(jobs)
    if opts is None:
        return batch
    if not isinstance(opts, Sequence) or isinstance(opts, str | bytes):
        raise ValidationError("opts must be a list with one entry per job")
    if len(opts) != len(batch):
        raise ValidationError(
            f"opts length must match jobs length (got {len(opts)}, expected {len(batch)})"
        )
    result = []
    for item, entry in zip(batch, opts, strict=True):
        if entry is None:
            result.append(item)
            continue
        if not isinstance(entry, Mapping):
            raise ValidationError("each opts entry must be a dict or None")
        for key in entry:
            if key not in ("queue", "ordering_key"):
                raise ValidationError(
                    f"unsupported opts key {key!r}; expected 'queue' or 'ordering_key'"
                )
        if "queue" in entry and not entry["queue"]:
            raise ValidationError("opts queue must not be empty")
        request = item if isinstance(item, EnqueueRequest) else EnqueueRequest(item)
        result.append(request._with(**dict(entry)))
    return result


def copy_flow(
    items: Iterable[Any], *, kind: str | None, opts: InsertOpts, rules: InsertRules = DEFAULT_RULES
) -> Flow[list[JobRow]]:
    """Bulk insert with COPY; run it inside a transaction.

    Jobs are validated and formatted while the COPY streams, so Postgres writes rows while
    Python prepares the next ones; a bad job aborts the COPY and the transaction (nothing is
    inserted). Batches with unique jobs take the INSERT path, which reports duplicates.
    """
    if isinstance(items, Mapping | str | bytes):
        raise ValidationError("insert_many_copy() takes a list of jobs")
    batch = list(items)
    preparer = BatchPreparer(kind, opts, rules)
    if opts.depends_on or any(
        isinstance(item, EnqueueRequest) and item.resolve(opts).depends_on for item in batch
    ):
        raise ValidationError("insert_many_copy() does not take depends_on: use insert_many()")
    if preparer.checked.unique is not None or any(
        isinstance(item, EnqueueRequest) and item.resolve(opts).unique is not None for item in batch
    ):
        return (yield from insert_flow(preparer.prepare_all(batch)))
    if not batch:
        return []
    return (yield from _copy(len(batch), lambda index: preparer.prepare(index, batch[index])))


def copy_prepared_flow(jobs: Sequence[PreparedJob], *, rows: bool = True) -> Flow[list[JobRow]]:
    """COPY jobs prepared already (none with a unique key); run it inside a transaction.
    ``rows=False``: the caller needs no stored rows (an empty list comes back)."""
    if not jobs:
        return []
    return (yield from _copy(len(jobs), jobs.__getitem__, keep=rows))


def _copy(
    count: int, job_at: Callable[[int], PreparedJob], *, keep: bool = True
) -> Flow[list[JobRow]]:
    """COPY ``count`` jobs, the one at each index given by ``job_at``; the stored rows
    (none unless ``keep``). Jobs due now go to the active table, the others to the held
    one: one COPY each (the second only when some job is scheduled)."""
    reserved = yield Statement(query("copy_reserve_ids"), {"count": count}, _first)
    now: dt.datetime = reserved["now"]
    ids: list[int] = reserved["ids"]
    stored: list[JobRow | None] = [None] * count if keep else []
    scheduled = [
        index
        for index in range(count)
        if (run_at := job_at(index).run_at) is not None and run_at > now
    ]

    def rows(indexes: Iterable[int]) -> Iterator[tuple[str | None, ...]]:
        # The returned rows are built here, one pass with the formatting, rather than after
        # the COPY: no list of prepared jobs is kept alive (fewer objects for the garbage
        # collector to walk).
        row = CopyRowFormatter(now)
        for index in indexes:
            job = job_at(index)
            job_id = ids[index]
            if keep:
                run_at = job.run_at
                due = run_at is None or run_at <= now
                state = JobState.AVAILABLE if due else JobState.SCHEDULED
                stored[index] = stored_job(job, job_id, state, run_at or now, now)
            yield row(job, job_id)

    slot = str(reserved["slot"])

    def in_slot(rows: Iterator[tuple[str | None, ...]]) -> Iterator[tuple[str | None, ...]]:
        for row in rows:
            yield (*row, slot)

    if not scheduled:
        yield CopyStatement(query("copy_jobs"), in_slot(rows(range(count))))
    else:
        later = set(scheduled)
        due_now = (index for index in range(count) if index not in later)
        yield CopyStatement(query("copy_jobs"), in_slot(rows(due_now)))
        yield CopyStatement(query("copy_jobs_scheduled"), rows(scheduled))
    return [row for row in stored if row is not None]


def array_literal(items: Sequence[str]) -> str:
    """A Postgres text[] literal (``{"a","b"}``), for COPY."""
    if not items:
        return "{}"
    quoted = (item.replace("\\", "\\\\").replace('"', '\\"') for item in items)
    return "{" + ",".join(f'"{item}"' for item in quoted) + "}"


def interval_literal(value: dt.timedelta) -> str:
    """An exact interval literal in seconds (``str(float)`` would give ``1e-06``, which
    Postgres refuses, and lose microseconds on long durations)."""
    micros = value // dt.timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    return f"{sign}{seconds}.{fraction:06d} seconds"


class CopyRowFormatter:
    """Formats rows of the ``copy_jobs`` COPY as text (psycopg formats strings fastest; jobs
    with unique keys never come here, they take the INSERT path)."""

    def __init__(self, now: dt.datetime) -> None:
        self._now = now
        self._now_text = now.isoformat()
        self._tags: dict[int, str] = {}  # batches share one tags list: render it once

    def __call__(self, job: PreparedJob, job_id: int) -> tuple[str | None, ...]:
        run_at = job.run_at
        tags = self._tags.get(id(job.tags))
        if tags is None:
            tags = self._tags[id(job.tags)] = array_literal(job.tags)
        return (
            str(job_id),
            job.kind,
            job.queue,
            job.args_json,
            "available" if run_at is None or run_at <= self._now else "scheduled",
            str(job.priority),
            str(job.max_attempts),
            self._now_text if run_at is None else run_at.isoformat(),
            self._now_text,
            job.metadata_json,
            tags,
            "\\x" + job.ordering_key.hex() if job.ordering_key is not None else None,
            (
                interval_literal(job.deadline_duration)
                if job.deadline_duration is not None
                else None
            ),
            job.concurrency_key,
        )


def _first(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return rows[0]
