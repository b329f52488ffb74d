"""Lifecycle events: what happened to a job, built from its committed row.

Every event carries ``job`` (the row as committed by the transition, an ``awa.JobRow``) and
``args`` (decoded into the hook's args type, or the JSON value for ``on_event_kind``
hooks). They are frozen dataclasses, so hooks can ``match`` on them::

    match event:
        case awa.Completed(duration=duration): ...
        case awa.Retried(error=error, next_run_at=when): ...
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from enum import StrEnum
from typing import Any, Generic, TypeVar

from awa.model import JobRow

A = TypeVar("A")


class RescueReason(StrEnum):
    """Why maintenance rescued a job."""

    STALE_HEARTBEAT = "stale_heartbeat"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    EXPIRED_CALLBACK = "expired_callback"


@dataclasses.dataclass(frozen=True, slots=True)
class JobEvent(Generic[A]):
    """Base class of every lifecycle event."""

    job: JobRow
    args: A


@dataclasses.dataclass(frozen=True, slots=True)
class Started(JobEvent[A]):
    """The claim committed; the handler is about to run (``job.state`` is running).

    Dispatched without waiting, so a quick job may finish before its Started hooks do.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class WaitingForCallback(JobEvent[A]):
    """The handler returned ``WaitForCallback`` and the job parked (``job.callback_id``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Completed(JobEvent[A]):
    """The job finished successfully. ``duration`` is the handler's run time (zero when an
    external callback completed it); ``output`` is what the handler recorded, if anything."""

    duration: dt.timedelta
    output: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Retried(JobEvent[A]):
    """The attempt failed (or asked to be retried) and the job will run again at
    ``next_run_at``. ``error`` is empty for ``RetryAfter``."""

    error: str
    attempt: int
    next_run_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class Exhausted(JobEvent[A]):
    """The job failed for good: its last attempt failed, or the failure was terminal."""

    error: str
    attempt: int


@dataclasses.dataclass(frozen=True, slots=True)
class Cancelled(JobEvent[A]):
    """The job was cancelled and will not run again."""

    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Rescued(JobEvent[A]):
    """Maintenance rescued the job from a dead or stuck attempt; ``job.state`` shows where
    it went (retryable, or failed when the attempt was its last)."""

    reason: RescueReason


EVENT_TYPES: tuple[type[JobEvent[Any]], ...] = (
    Started,
    WaitingForCallback,
    Completed,
    Retried,
    Exhausted,
    Cancelled,
    Rescued,
)
