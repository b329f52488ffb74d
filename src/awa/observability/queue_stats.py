"""Per queue: jobs by state, the age of the oldest available job, pause status, and the
fleet-wide flow limits with the jobs they hold back."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from awa.model import JobState, MappingAccess, parse_state
from awa.sql import query
from awa.storage.db import Statement, operation


@dataclasses.dataclass(frozen=True, slots=True)
class QueueLimits:
    """The fleet-wide limits of a queue, as the worker that started last configured them."""

    rate: float | None
    burst: int | None
    global_max_running: int | None
    key_concurrency: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class HeldBack:
    """Due available jobs a limit keeps from starting right now: those whose key is at its
    limit (``keys``), and the others while the queue is at its cap (``cap``) or its token
    bucket is empty (``rate``)."""

    rate: int = 0
    cap: int = 0
    keys: int = 0

    @property
    def total(self) -> int:
        return self.rate + self.cap + self.keys


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats(MappingAccess):
    """Counts by state for one queue, and how long its oldest available job has waited."""

    queue: str
    counts: dict[JobState, int]
    oldest_available_at: dt.datetime | None
    oldest_available_age: float | None
    paused: bool
    paused_by: str | None
    limits: QueueLimits | None = None
    held_back: HeldBack = HeldBack()
    completed_last_hour: int = 0

    def count(self, state: JobState | str) -> int:
        return self.counts.get(parse_state(state), 0)

    @property
    def available(self) -> int:
        return self.count(JobState.AVAILABLE)

    @property
    def running(self) -> int:
        return self.count(JobState.RUNNING)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    # The reference package's QueueStat fields.
    @property
    def scheduled(self) -> int:
        return self.count(JobState.SCHEDULED)

    @property
    def retryable(self) -> int:
        return self.count(JobState.RETRYABLE)

    @property
    def failed(self) -> int:
        return self.count(JobState.FAILED)

    @property
    def waiting_external(self) -> int:
        return self.count(JobState.WAITING_EXTERNAL)

    @property
    def total_queued(self) -> int:
        """Jobs not finished: scheduled, available, running, retryable and parked."""
        return sum(count for state, count in self.counts.items() if not state.is_terminal)

    @property
    def lag_seconds(self) -> float | None:
        return self.oldest_available_age


def _limits(row: dict[str, Any]) -> QueueLimits | None:
    values = (row["rate"], row["burst"], row["max_running"], row["key_concurrency"])
    if all(value is None for value in values):
        return None
    return QueueLimits(*values)


def decode_queue_stats(rows: list[dict[str, Any]]) -> list[QueueStats]:
    return [
        QueueStats(
            queue=row["queue"],
            counts={JobState(state): int(n) for state, n in row["counts"].items()},
            oldest_available_at=row["oldest_run_at"],
            oldest_available_age=row["oldest_available_age"],
            paused=row["paused"],
            paused_by=row["paused_by"],
            limits=_limits(row),
            held_back=HeldBack(
                rate=int(row["held_by_rate"]),
                cap=int(row["held_by_cap"]),
                keys=int(row["held_by_keys"]),
            ),
            completed_last_hour=int(row["completed_last_hour"]),
        )
        for row in rows
    ]


@operation
def queue_stats() -> Statement[list[QueueStats]]:
    """One entry per queue that has jobs or operator state."""
    return Statement(query("queue_stats"), None, decode_queue_stats)
