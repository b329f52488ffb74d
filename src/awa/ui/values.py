"""Stored values made safe to show. A job's metadata and error history are JSON that any
application (or any SQL) may have written: the job page reads them through these few typed
records, which take whatever is stored and never fail on an odd shape."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from typing import Any

from awa.model import JobRow, JobState
from awa.producer.insert import LINEAGE
from awa.workflows.operations import WORKFLOW

BIGINT_MAX = 2**63 - 1


def as_text(value: Any) -> str:
    """A stored value as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str, ensure_ascii=False)


def job_id(value: Any) -> int | None:
    """A stored job id (a JSON number or digits), or None when it cannot be one."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        value = int(value)
    if type(value) is int and 0 < value <= BIGINT_MAX:
        return value
    return None


def aware(stamp: dt.datetime) -> dt.datetime:
    """A timestamp with its zone (a stored one without is taken as UTC)."""
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class Lineage:
    """The job whose outcome enqueued this one (metadata ``awa:trigger``)."""

    id: int | None
    kind: str
    outcome: str
    via: str

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> Lineage | None:
        if LINEAGE not in metadata:
            return None
        record = metadata[LINEAGE]
        if not isinstance(record, dict):
            record = {}
        return cls(
            id=job_id(record.get("id")),
            kind=as_text(record.get("kind", "?")),
            outcome=as_text(record.get("outcome", "unknown")),
            via=as_text(record.get("via", "follow_up")),
        )

    @property
    def well_formed(self) -> bool:
        return self.id is not None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowMark:
    """The workflow a job belongs to: its id (when it is one), name and step."""

    id: uuid.UUID | None
    name: str
    step: str

    @classmethod
    def of(cls, job: JobRow) -> WorkflowMark | None:
        record = job.metadata.get(WORKFLOW)
        if not isinstance(record, dict) and job.workflow_id is None:
            return None
        record = record if isinstance(record, dict) else {}
        found = None
        for candidate in (job.workflow_id, record.get("id")):
            try:
                found = uuid.UUID(str(candidate)) if candidate is not None else None
            except ValueError:
                found = None
            if found is not None:
                break
        name = as_text(record.get("name")) if record.get("name") is not None else "a workflow"
        return cls(found, name, as_text(record.get("step", "?")))


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One entry of a job's error history."""

    attempt: str
    error: str
    at: str
    terminal: bool
    stamp: dt.datetime | None

    @classmethod
    def of(cls, entry: Any) -> Attempt:
        if not isinstance(entry, dict):
            return cls("?", as_text(entry), "", False, None)
        at = entry.get("at")
        stamp = None
        if isinstance(at, str):
            try:
                stamp = aware(dt.datetime.fromisoformat(at))
            except ValueError:
                stamp = None
        error = entry.get("error")
        return cls(
            attempt=as_text(entry.get("attempt", "?")),
            error=as_text(error) if error is not None else "",
            at=as_text(at) if at is not None else "",
            terminal=entry.get("terminal") is True,
            stamp=stamp,
        )


def attempts(job: JobRow) -> list[Attempt]:
    """The job's failed attempts, oldest first (whatever the stored history holds)."""
    history = job.errors if isinstance(job.errors, list) else [job.errors]
    return [Attempt.of(entry) for entry in history]


def timeline(job: JobRow, failed: list[Attempt]) -> list[tuple[dt.datetime, str]]:
    """The job's moments, oldest first: creation, each failed attempt, the last claim..."""
    moments: list[tuple[dt.datetime, str]] = [(job.created_at, "created")]
    for entry in failed:
        if entry.stamp is not None:
            moments.append((entry.stamp, f"attempt {entry.attempt} failed"))
    if job.attempted_at is not None:
        moments.append((job.attempted_at, f"attempt {job.attempt} started"))
    if job.heartbeat_at is not None:
        moments.append((job.heartbeat_at, "last heartbeat"))
    if job.state in (JobState.SCHEDULED, JobState.RETRYABLE, JobState.AVAILABLE):
        moments.append((job.run_at, "runs at" if job.state is not JobState.AVAILABLE else "due"))
    if job.deadline_at is not None:
        moments.append((job.deadline_at, "attempt deadline"))
    if job.callback_timeout_at is not None:
        moments.append((job.callback_timeout_at, "callback times out"))
    if job.finalized_at is not None:
        moments.append((job.finalized_at, job.state.value))
    return sorted(((aware(at), label) for at, label in moments), key=lambda moment: moment[0])


def shown_metadata(job: JobRow, lineage: Lineage | None) -> Any:
    """The metadata the page shows as JSON: all of it but a well-formed lineage record (the
    page shows that one as lineage)."""
    if lineage is None or not lineage.well_formed:
        return job.metadata
    return {key: value for key, value in job.metadata.items() if key != LINEAGE}
