"""The job object handed to a handler: the claimed row plus what the attempt can do."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from awa.model import JobState

if TYPE_CHECKING:
    from awa.worker.attempts import AttemptServices

A = TypeVar("A")


class Job(Generic[A]):
    """One attempt of a job, as seen by its handler.

    Attributes mirror the claimed row (``attempt`` counts this attempt). The methods report
    progress, and ``is_cancelled()`` tells a long handler to stop early: it turns true when
    an operator cancels the job, its deadline passes, or the worker shuts down.
    """

    __slots__ = (
        "_args",
        "_cancelled",
        "_progress",
        "_progress_version",
        "_services",
        "attempt",
        "attempted_at",
        "created_at",
        "deadline",
        "errors",
        "id",
        "kind",
        "max_attempts",
        "metadata",
        "priority",
        "queue",
        "raw_args",
        "run_at",
        "run_lease",
        "tags",
    )

    def __init__(
        self,
        *,
        id: int,
        kind: str,
        queue: str,
        raw_args: Any,
        priority: int,
        attempt: int,
        max_attempts: int,
        run_lease: int,
        run_at: dt.datetime,
        created_at: dt.datetime,
        attempted_at: dt.datetime | None,
        deadline: dt.datetime | None,
        errors: list[dict[str, Any]],
        metadata: dict[str, Any],
        tags: list[str],
        progress: dict[str, Any] | None,
        services: AttemptServices | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.queue = queue
        self.raw_args = raw_args
        self.priority = priority
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.run_lease = run_lease
        self.run_at = run_at
        self.created_at = created_at
        self.attempted_at = attempted_at
        self.deadline = deadline
        self.errors = errors
        self.metadata = metadata
        self.tags = tags
        self._progress = progress
        self._progress_version = 0
        self._cancelled = False
        self._services = services
        self._args: Any = None

    @property
    def args(self) -> A:
        """The job's args, decoded into the handler's args type."""
        return self._args  # type: ignore[no-any-return]

    @property
    def state(self) -> JobState:
        return JobState.RUNNING

    @property
    def progress(self) -> dict[str, Any] | None:
        """The latest progress: what this attempt set, else what earlier attempts left."""
        return self._progress

    def is_cancelled(self) -> bool:
        return self._cancelled

    def set_progress(self, percent: int, message: str | None = None) -> None:
        """Record progress (percent clamped to 0-100); stored by the next heartbeat, at the
        end of the attempt, or by ``flush_progress()``. Survives retries; cleared on
        completion."""
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise TypeError("percent must be a number")
        progress = dict(self._progress or {})
        progress["percent"] = max(0, min(100, int(percent)))
        if message is None:
            progress.pop("message", None)
        else:
            progress["message"] = str(message)
        self._replace_progress(progress)

    def update_metadata(self, updates: Mapping[str, Any]) -> None:
        """Merge keys into ``progress["metadata"]`` (a shallow merge)."""
        if not isinstance(updates, Mapping):
            raise TypeError("update_metadata() takes a dict")
        progress = dict(self._progress or {})
        current = progress.get("metadata") or {}
        if not isinstance(current, dict):
            raise TypeError("progress metadata is not an object and cannot be merged into")
        progress["metadata"] = {**current, **updates}
        self._replace_progress(progress)

    def _replace_progress(self, progress: dict[str, Any]) -> None:
        # Swapping the reference (never mutating in place) lets the heartbeat thread read a
        # consistent snapshot without a lock.
        self._progress = progress
        self._progress_version += 1

    async def flush_progress(self) -> None:
        """Write pending progress now (a no-op once the attempt is no longer running)."""
        if self._services is None:
            raise RuntimeError("flush_progress() is only available while the job runs")
        await self._services.flush_progress(self)

    def flush_progress_sync(self) -> None:
        """``flush_progress()`` for plain ``def`` handlers running in a worker thread."""
        if self._services is None:
            raise RuntimeError("flush_progress_sync() is only available while the job runs")
        future = asyncio.run_coroutine_threadsafe(
            self._services.flush_progress(self), self._services.loop
        )
        future.result()

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id}, kind={self.kind!r}, queue={self.queue!r}, "
            f"attempt={self.attempt}/{self.max_attempts})"
        )
