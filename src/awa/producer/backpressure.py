"""Backpressure: per-queue depth limits (``awa.queue_depth_limits``, migration 17), their
statements, and the cache a client checks its inserts against.

An insert never counts the job table. A client reads every limited queue's limit and the
depth in the maintenance leader's last sample (``awa.queue_samples``) at most once per
``REFRESH_SECONDS``, in the flow of the first insert (or ``queue_pressure`` call) that finds
the cache expired, and adds the jobs it inserted itself since that sample. With no limit
set anywhere, an insert costs a clock read and an empty-dict test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar, cast

from awa.errors import QueueOverLimit, ValidationError
from awa.model import BIGINT_MAX, check_int_range, check_name
from awa.observability.metrics import QUEUE, backpressure_rejected, backpressure_signaled
from awa.sql import query
from awa.storage.db import Autocommit, Call, Flow, Statement, operation

R = TypeVar("R")

Policy = Literal["signal", "reject"]
POLICIES: tuple[Policy, ...] = ("signal", "reject")
REFRESH_SECONDS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class QueuePressure:
    """A queue's depth against its limit. ``depth``: jobs waiting or running (available,
    scheduled, retryable, running) in the leader's last sample, plus, in a client's answer,
    the jobs that client inserted since; None when the queue has no limit (its depth is not
    read). ``sample_age``: seconds since that sample (None: no sample of the queue yet).
    ``over``: the depth is at or over the limit."""

    queue: str
    depth: int | None
    limit: int | None
    policy: Policy | None
    sample_age: float | None

    @property
    def over(self) -> bool:
        return self.limit is not None and self.depth is not None and self.depth >= self.limit


def check_policy(policy: object) -> Policy:
    if policy not in POLICIES:
        raise ValidationError(f"policy must be 'signal' or 'reject', got {policy!r}")
    return policy


def check_max_depth(max_depth: object) -> int:
    return check_int_range("max_depth", max_depth, 1, BIGINT_MAX)


def _pressure(row: dict[str, Any]) -> QueuePressure:
    return QueuePressure(
        row["queue"], int(row["depth"]), int(row["max_depth"]), row["policy"], row["sample_age"]
    )


def _pressures(rows: list[dict[str, Any]]) -> list[QueuePressure]:
    return [_pressure(row) for row in rows]


def _nothing(rows: list[Any]) -> None:
    return None


def _cleared(rows: list[Any]) -> bool:
    return bool(rows)


@operation
def set_queue_depth_limit(
    queue: str, max_depth: int, *, policy: Policy = "signal"
) -> Statement[None]:
    """Limit ``queue`` to ``max_depth`` jobs waiting or running. ``policy="signal"``: inserts
    succeed and the client reports the queue over its limit (``queue_pressure``);
    ``policy="reject"``: inserts raise ``QueueOverLimit``. Replaces the queue's limit; the
    clients see it within ``REFRESH_SECONDS``."""
    params = {
        "queue": check_name("queue", queue),
        "max_depth": check_max_depth(max_depth),
        "policy": check_policy(policy),
    }
    return Statement(query("set_queue_depth_limit"), params, _nothing)


@operation
def clear_queue_depth_limit(queue: str) -> Statement[bool]:
    """Remove ``queue``'s depth limit; False when it had none."""
    return Statement(
        query("clear_queue_depth_limit"), {"queue": check_name("queue", queue)}, _cleared
    )


@operation
def list_queue_depth_limits() -> Statement[list[QueuePressure]]:
    """Every queue's depth limit with its depth in the leader's last sample."""
    return Statement(query("queue_depth_limits"), None, _pressures)


@dataclasses.dataclass(slots=True)
class _Limit:
    max_depth: int
    policy: Policy
    sampled: int  # the depth in the leader's sample
    sampled_at: dt.datetime | None
    sample_age: float | None
    added: int = 0  # jobs this client inserted since the sample

    @property
    def depth(self) -> int:
        return self.sampled + self.added


class DepthLimits:
    """One client's cache of the depth limits. Thread-safe (the blocking client is shared
    between threads); a refresh is run by one caller at a time, the others go on with the
    cache they have."""

    def __init__(self, ttl: float = REFRESH_SECONDS) -> None:
        self._ttl = ttl
        self._limits: dict[str, _Limit] = {}
        self._expires = 0.0
        self._refreshing = False
        self._loaded = False
        self._lock = threading.Lock()

    def due(self) -> bool:
        """Whether the caller should refresh the cache now (it then must run
        ``refresh_flow``): when it expired and nobody refreshes it, or while it was never
        read (no insert goes unchecked then)."""
        now = time.monotonic()
        if now < self._expires:
            return False
        with self._lock:
            if now < self._expires or (self._refreshing and self._loaded):
                return False
            self._refreshing = True
            return True

    def expire(self) -> None:
        """Forget the cache: the next insert reads the limits and depths again."""
        self._expires = 0.0

    def changing(self, statement: Call[R]) -> Flow[R]:
        """Run ``statement`` (a change of the limits: one Statement), then read the limits
        again: the client that changed a limit acts on it from its next insert."""
        result = yield cast(Statement[R], statement)
        with self._lock:
            self._refreshing = True
        yield from self.refresh_flow()
        return cast(R, result)

    def refresh_flow(self) -> Flow[None]:
        """Read every limit and its sampled depth into the cache."""
        try:
            rows = yield Statement(query("queue_depth_limits"), None, _rows)
        finally:
            with self._lock:
                self._refreshing = False
        with self._lock:
            old = self._limits
            fresh = {}
            for row in rows:
                before = old.get(row["queue"])
                same_sample = before is not None and before.sampled_at == row["sampled_at"]
                fresh[row["queue"]] = _Limit(
                    int(row["max_depth"]),
                    row["policy"],
                    int(row["depth"]),
                    row["sampled_at"],
                    row["sample_age"],
                    before.added if same_sample and before is not None else 0,
                )
            self._limits = fresh
            self._loaded = True
            self._expires = time.monotonic() + self._ttl

    def admit(self, queues: Sequence[str]) -> None:
        """Count the jobs of an insert about to run (one queue entry per job) into their
        queues' depths; raise QueueOverLimit instead, counting nothing, when one of the
        queues has the reject policy and is at or over its limit (the refused jobs go to
        the rejected counter). Counting before the insert keeps the producers of one
        client from all passing a limit at once."""
        if not self._limits:
            return
        with self._lock:
            wanted = Counter(queue for queue in queues if queue in self._limits)
            for queue, count in wanted.items():
                limit = self._limits[queue]
                if limit.policy == "reject" and limit.depth >= limit.max_depth:
                    backpressure_rejected.add(count, {QUEUE: queue})
                    raise QueueOverLimit(queue, depth=limit.depth, limit=limit.max_depth)
            signaled = {}
            for queue, count in wanted.items():
                limit = self._limits[queue]
                limit.added += count
                if limit.policy == "signal":  # jobs that left the queue at or over its limit
                    signaled[queue] = min(count, limit.depth - limit.max_depth + 1)
        for queue, count in signaled.items():
            if count > 0:
                backpressure_signaled.add(count, {QUEUE: queue})

    def withdraw(self, queues: Sequence[str]) -> None:
        """Take back what ``admit`` counted for an insert that failed."""
        if not self._limits:
            return
        with self._lock:
            for queue in queues:
                limit = self._limits.get(queue)
                if limit is not None and limit.added > 0:
                    limit.added -= 1

    def pressure(self, queue: str) -> QueuePressure:
        """``queue``'s pressure as this cache sees it."""
        limit = self._limits.get(queue)
        if limit is None:
            return QueuePressure(queue, None, None, None, None)
        return QueuePressure(queue, limit.depth, limit.max_depth, limit.policy, limit.sample_age)

    def pressure_flow(self, queue: str) -> Flow[QueuePressure]:
        """``pressure``, refreshing the cache first when it expired."""
        if self.due():
            yield from self.refresh_flow()
        return self.pressure(queue)

    def guard(self, call: Call[R], queues: Sequence[str] | None = None) -> Call[R]:
        """``call`` (an insert) checked against the limits: before it runs when the jobs'
        ``queues`` are known, else (COPY, inside a transaction) after it with the queues of
        the rows it returns."""
        if isinstance(call, Autocommit):
            return Autocommit(self.guard_flow(call.flow, queues))
        return self.guard_flow(cast(Flow[R], call), queues)

    def guard_flow(self, flow: Flow[R], queues: Sequence[str] | None) -> Flow[R]:
        """``flow`` (an insert) checked against the limits (see ``guard``)."""
        if self.due():
            yield from self.refresh_flow()
        if queues is None:  # COPY: counted from its rows, inside its transaction
            result = yield from flow
            self.admit([row.queue for row in cast(list[Any], result)])
            return result
        with self.admitted(queues):
            return (yield from flow)

    @contextlib.contextmanager
    def admitted(self, queues: Sequence[str]) -> Iterator[None]:
        """``admit`` the jobs of an insert that runs in the block; ``withdraw`` them if it
        fails."""
        self.admit(queues)
        try:
            yield
        except BaseException:
            self.withdraw(queues)
            raise


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows


class _HasLimits(Protocol):
    @property
    def depth_limits(self) -> DepthLimits | None: ...


def guarded(rules: _HasLimits, call: Call[R], queues: Sequence[str] | None = None) -> Call[R]:
    """``call`` checked against the depth limits of ``rules`` (an ``InsertRules``), if any."""
    limits = rules.depth_limits
    return call if limits is None else limits.guard(call, queues)


def guarded_flow(rules: _HasLimits, flow: Flow[R], queues: Sequence[str]) -> Flow[R]:
    """``guarded`` for an insert that is one step of a larger flow (a workflow's jobs, a
    bridge insert in the caller's transaction)."""
    limits = rules.depth_limits
    return flow if limits is None else limits.guard_flow(flow, queues)
