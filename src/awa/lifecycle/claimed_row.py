"""A job's row as its running attempt sees it (``Job.snapshot``), filled lazily."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from awa.model import JobRow, JobState

ROW_FIELDS = tuple(field.name for field in dataclasses.fields(JobRow))
ROW_INDEX = {name: index for index, name in enumerate(ROW_FIELDS)}


class RowSource(Protocol):
    """What a claimed row is read from (an ``awa.Job``)."""

    id: int
    kind: str
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    run_lease: int
    tags: list[str]
    _errors: list[dict[str, Any]] | None
    _metadata: dict[str, Any] | None
    _progress: dict[str, Any] | None

    def _row_values(self, state: JobState, changes: dict[str, Any]) -> list[Any]: ...


class ClaimedRow(JobRow):
    """A JobRow taken from an attempt's claimed row (``Job.snapshot``). Its id, kind, queue,
    priority, attempts and run lease, what the attempt may change (errors, metadata, tags,
    progress: copied now),
    the state and the changes given are set at once; the others, which stay as claimed
    (timestamps to convert, args, unique and callback columns), on the first read of any of
    them (an unset slot raises AttributeError, which calls ``__getattr__``). Compares equal
    to a JobRow with the same values."""

    __slots__ = ("_changes", "_source")

    _source: RowSource
    _changes: dict[str, Any]

    @classmethod
    def of(cls, job: RowSource, state: JobState, changes: dict[str, Any]) -> JobRow:
        row: ClaimedRow = cls.__new__(cls)
        row.id = job.id
        row.kind = job.kind
        row.queue = job.queue
        row.priority = job.priority
        row.attempt = job.attempt
        row.max_attempts = job.max_attempts
        row.run_lease = job.run_lease
        row.state = state
        row.errors = list(job._errors) if job._errors else []
        row.metadata = dict(job._metadata) if job._metadata else {}
        row.tags = list(job.tags)
        row.progress = job._progress
        for name, value in changes.items():
            setattr(row, name, value)
        row._source = job
        row._changes = changes
        return row

    def __getattr__(self, name: str) -> Any:
        if name not in ROW_INDEX:
            raise AttributeError(name)
        self._fill()
        return object.__getattribute__(self, name)

    def _fill(self) -> None:
        values = self._source._row_values(self.state, self._changes)
        for name, value in zip(ROW_FIELDS, values, strict=True):
            try:
                object.__getattribute__(self, name)
            except AttributeError:
                setattr(self, name, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobRow):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in ROW_FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like JobRow
