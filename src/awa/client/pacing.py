"""Paced producers: insert into one queue at a target rate, and slow down while the queue
is over its depth limit (docs/backpressure.md). The pacing is one I/O-free ``Pacer``;
``AsyncPacedProducer`` and ``PacedProducer`` drive it with an asyncio or a blocking client."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any, Unpack

from awa.core.arguments import check_seconds
from awa.errors import ValidationError
from awa.model import JobRow, check_name
from awa.producer.backpressure import REFRESH_SECONDS, DepthLimits, QueuePressure
from awa.producer.insert import InsertKwargs

if TYPE_CHECKING:
    from awa.client.asyncio_client import AsyncClient
    from awa.client.blocking import Client


def _check_rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValidationError(f"{field} must be a number of jobs per second > 0, got {value!r}")
    return check_seconds(field, float(value))


def _check_factor(field: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low < value < high:
        raise ValidationError(
            f"{field} must be a number between {low:g} and {high:g}, got {value!r}"
        )
    return float(value)


class Pacer:
    """Holds a rate between ``min_rate`` and ``rate`` (jobs per second): multiplies it by
    ``backoff`` while the queue is over its limit and by ``recovery`` once it is not, at
    most once per ``adjust_every`` seconds (the depth it reads is refreshed about that
    often); ``delay`` spaces the inserts at the current rate."""

    def __init__(
        self,
        rate: float,
        *,
        min_rate: float | None = None,
        backoff: float = 0.5,
        recovery: float = 1.5,
        adjust_every: float = REFRESH_SECONDS,
    ) -> None:
        self.target = _check_rate("rate", rate)
        self.min_rate = _check_rate("min_rate", min_rate) if min_rate is not None else rate / 100
        if self.min_rate > self.target:
            raise ValidationError(f"min_rate ({min_rate!r}) must not exceed rate ({rate!r})")
        self.backoff = _check_factor("backoff", backoff, 0, 1)
        self.recovery = _check_factor("recovery", recovery, 1, 100)
        self.adjust_every = check_seconds("adjust_every", adjust_every)
        self.rate = self.target
        self._next = 0.0  # when the next insert may start (monotonic)
        self._adjusted = 0.0
        self._lock = threading.Lock()

    def delay(self, now: float) -> float:
        """Seconds to wait before the next insert (it is booked at the current rate)."""
        with self._lock:
            start = max(now, self._next)
            self._next = start + 1 / self.rate
        return start - now

    def observe(self, pressure: QueuePressure, now: float) -> None:
        """Adjust the rate to what the last insert's queue looks like."""
        if now - self._adjusted < self.adjust_every:
            return
        if pressure.over:
            self.rate = max(self.min_rate, self.rate * self.backoff)
        elif self.rate < self.target:
            self.rate = min(self.target, self.rate * self.recovery)
        else:
            return
        self._adjusted = now


def _limits(client: Any) -> DepthLimits:
    limits = client.insert_rules.depth_limits
    assert isinstance(limits, DepthLimits)  # every client has one
    return limits


class _Paced:
    def __init__(self, client: Any, queue: str, rate: float, **pacing: Any) -> None:
        self.queue = check_name("queue", queue)
        self.pacer = Pacer(rate, **pacing)
        self._limits = _limits(client)

    @property
    def rate(self) -> float:
        """The rate it holds now (jobs per second)."""
        return self.pacer.rate


class AsyncPacedProducer(_Paced):
    """Inserts into ``queue`` through an ``AsyncClient`` at ``rate`` jobs per second, backing
    off while the queue is over its depth limit (see ``Pacer`` for the other arguments).
    One producer paces the inserts awaited through it, also from several tasks."""

    def __init__(self, client: AsyncClient, queue: str, rate: float, **pacing: Any) -> None:
        super().__init__(client, queue, rate, **pacing)
        self.client = client

    async def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        """Wait for the job's turn, then ``client.insert(args, queue=queue, ...)``."""
        await asyncio.sleep(self.pacer.delay(time.monotonic()))
        kwargs["queue"] = self.queue
        row = await self.client.insert(args, **kwargs)
        self.pacer.observe(self._limits.pressure(self.queue), time.monotonic())
        return row


class PacedProducer(_Paced):
    """``AsyncPacedProducer`` for the blocking ``Client`` (safe to share between threads)."""

    def __init__(self, client: Client, queue: str, rate: float, **pacing: Any) -> None:
        super().__init__(client, queue, rate, **pacing)
        self.client = client

    def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        """Wait for the job's turn, then ``client.insert(args, queue=queue, ...)``."""
        time.sleep(self.pacer.delay(time.monotonic()))
        kwargs["queue"] = self.queue
        row = self.client.insert(args, **kwargs)
        self.pacer.observe(self._limits.pressure(self.queue), time.monotonic())
        return row
