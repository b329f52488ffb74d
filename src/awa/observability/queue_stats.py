"""Per queue: jobs by state, the age of the oldest available job, and pause status."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from awa.db import Statement, operation
from awa.model import JobState, parse_state
from awa.sql import query


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats:
    """Counts by state for one queue, and how long its oldest available job has waited."""

    queue: str
    counts: dict[JobState, int]
    oldest_available_at: dt.datetime | None
    oldest_available_age: float | None
    paused: bool
    paused_by: str | None

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


def decode_queue_stats(rows: list[dict[str, Any]]) -> list[QueueStats]:
    return [
        QueueStats(
            queue=row["queue"],
            counts={JobState(state): int(n) for state, n in row["counts"].items()},
            oldest_available_at=row["oldest_run_at"],
            oldest_available_age=row["oldest_available_age"],
            paused=row["paused"],
            paused_by=row["paused_by"],
        )
        for row in rows
    ]


@operation
def queue_stats() -> Statement[list[QueueStats]]:
    """One entry per queue that has jobs or operator state."""
    return Statement(query("queue_stats"), None, decode_queue_stats)
