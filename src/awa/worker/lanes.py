"""Where a dispatcher's next claim starts in each priority lane of its queue.

A queue's available jobs form four lanes, one per priority, each ordered by (run_at, id):
the claim's index order. A dispatcher remembers, per lane, the position just past the last
job it claimed, and its next claim reads the lane from there. The jobs before that point
were claimed; under a long transaction that pins the MVCC horizon their dead index entries
stay, and a claim from the head of the lane would walk all of them again each time. Reading
from the remembered point keeps the claim's cost flat however old the pin. It also knows
which lanes are empty: a claim that came back short emptied every lane it read, and the
next claim reads only lanes where jobs were announced since (most queues use one priority).

A job may become available behind that point, or in a lane found empty: a transaction that
inserted it committed after later jobs were claimed, a scheduled or retried job was promoted
with its old run_at, an operator moved it. Every such job is announced:

- an insert into the active table (new jobs, promotions, releases of dependents) sends
  ``awa_ready`` with the lane and position of the earliest one, and the lane moves back to
  it (``rewind``);
- other changes send ``awa_jobs`` with the queue alone, and every lane is read from its
  head (``reset``);
- a statement that locks an available job and leaves it in place (``wait`` flagging it, a
  workflow insert flagging a parent, an update through ``awa.jobs``) makes a claim running
  meanwhile skip it (``SKIP LOCKED``) and perhaps find its lane empty, so it announces the
  job's lane on ``awa_ready`` too.

A notification can be missed (the listener reconnecting, a claim by another process rolled
back after this one passed its locked rows), so every lane is also read from its head every
``full_sweep_interval`` seconds: at worst such a job waits that long.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import sql

from awa.sql import query

PRIORITIES = 4
"""Priorities 1 to 4: one lane each."""

FULL_SWEEP_INTERVAL = 5.0
"""Seconds between claims that read every lane from its head."""

# Where a claim row carries what the lanes need (see the claim_jobs query).
_ID = 0
_PRIORITY = 4
_RUN_AT = 8  # epoch seconds: exact to the microsecond once rounded (float8 holds ~15.9 digits)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_HEAD = (dt.datetime.min.replace(tzinfo=dt.UTC), 0)

Position = tuple[int, int]
"""(run_at in microseconds since the epoch, id): a place in a lane."""


def position_of(run_at_epoch: float, job_id: int) -> Position:
    return (round(run_at_epoch * 1_000_000), job_id)


class LanePositions:
    """The lanes of one queue, as seen by one dispatcher."""

    def __init__(self, full_sweep_interval: float = FULL_SWEEP_INTERVAL) -> None:
        self._after: list[Position | None] = [None] * PRIORITIES
        # Lanes that may hold jobs (unknown counts as maybe).
        self._maybe = [True] * PRIORITIES
        self._full_sweep_interval = full_sweep_interval
        self._swept_at = time.monotonic()
        # Rewinds and resets that arrive while a claim runs: that claim's result must not
        # move a lane past them, nor mark their lane empty.
        self._claiming = False
        self._reading: tuple[int, ...] = ()
        self._rewound_during_claim: list[tuple[int, Position]] = []
        self._reset_during_claim = False

    def start_claim(self) -> tuple[int, ...]:
        """The priorities the next claim reads (none: nothing to claim)."""
        if time.monotonic() - self._swept_at >= self._full_sweep_interval:
            self.reset()
        self._claiming = True
        self._rewound_during_claim = []
        self._reset_during_claim = False
        self._reading = tuple(p + 1 for p in range(PRIORITIES) if self._maybe[p])
        return self._reading

    def params(self, priorities: Iterable[int] = range(1, PRIORITIES + 1)) -> dict[str, Any]:
        """Each lane's position, as the claim statement's parameters."""
        params: dict[str, Any] = {}
        for priority in priorities:
            after = self._after[priority - 1]
            at, job_id = (
                _HEAD if after is None else (_EPOCH + dt.timedelta(microseconds=after[0]), after[1])
            )
            params[f"after_at_{priority}"] = at
            params[f"after_id_{priority}"] = job_id
        return params

    def arrays(self) -> dict[str, list[int | None]]:
        """Every lane's position as two arrays (the limited claim's parameters)."""
        return {
            "after_us": [after[0] if after is not None else None for after in self._after],
            "after_id": [after[1] if after is not None else None for after in self._after],
        }

    def claimed(self, rows: Sequence[Sequence[Any]], *, emptied: bool) -> None:
        """A claim returned these rows (claim_jobs columns): each lane moves past the last
        job it took from it. ``emptied``: the claim came back short, having read its lanes
        to their end (a plain claim that got fewer jobs than it asked for)."""
        self._claiming = False
        for row in rows:
            lane = int(row[_PRIORITY]) - 1
            if not 0 <= lane < PRIORITIES:
                continue
            past = position_of(row[_RUN_AT], int(row[_ID]) + 1)
            current = self._after[lane]
            if current is None or past > current:
                self._after[lane] = past
        if emptied:
            for priority in self._reading:
                self._maybe[priority - 1] = False
        if self._reset_during_claim:
            self.reset()
        for lane, position in self._rewound_during_claim:
            self._maybe[lane] = True
            self._lower(lane, position)

    def failed(self) -> None:
        """The claim failed (it may have passed rows it did not take): start over."""
        self._claiming = False
        self.reset()

    def rewind(self, priority: int, position_us: int, job_id: int) -> None:
        """A job became available at this place in the lane of ``priority``."""
        lane = priority - 1
        if not 0 <= lane < PRIORITIES:
            self.reset()
            return
        position = (position_us, job_id)
        self._maybe[lane] = True
        self._lower(lane, position)
        if self._claiming:
            self._rewound_during_claim.append((lane, position))

    def reset(self) -> None:
        """Read every lane from its head at the next claim."""
        self._after = [None] * PRIORITIES
        self._maybe = [True] * PRIORITIES
        self._swept_at = time.monotonic()
        if self._claiming:
            self._reset_during_claim = True

    def _lower(self, lane: int, position: Position) -> None:
        current = self._after[lane]
        if current is not None and position < current:
            self._after[lane] = position


@functools.cache
def claim_statement(priorities: tuple[int, ...], cap: int) -> str:
    """The claim of the given lanes, most urgent first, of at most ``cap`` jobs (the queue's
    ``claim_batch_size``: no claim's limit exceeds it). One statement per set of lanes and
    cap, composed once: as text, psycopg reuses its parsed form instead of composing it again
    on every claim."""
    if not priorities:
        raise ValueError("a claim reads at least one lane")
    lanes = [
        sql.SQL(query("claim_lane")).format(
            priority=sql.Literal(priority),
            after_at=sql.Placeholder(f"after_at_{priority}"),
            after_id=sql.Placeholder(f"after_id_{priority}"),
        )
        for priority in sorted(priorities)
    ]
    statement = sql.SQL(query("claim_jobs")).format(
        lanes=sql.SQL(" UNION ALL ").join(lanes), cap=sql.Literal(cap)
    )
    return statement.as_string(None)


def parse_ready(payload: str) -> tuple[str, int, int, int] | None:
    """An ``awa_ready`` payload: ``"priority position_us id queue"`` (the queue last: it may
    hold spaces). None when it does not parse."""
    parts = payload.split(" ", 3)
    if len(parts) != 4:
        return None
    priority, position, job_id, queue = parts
    try:
        return queue, int(priority), int(position), int(job_id)
    except ValueError:
        return None
