"""Helpers for the lifecycle-hook and follow-up tests: a hook that records events, waiting
for hooks to settle, reading follow-up rows, and reading OpenTelemetry counters.

Waits poll with a deadline (see helpers_worker.wait_for); nothing sleeps a fixed time to wait
for an outcome.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, TypeVar

import awa
from helpers_worker import wait_for
from jobs_helpers import Conn

E = TypeVar("E", bound=awa.JobEvent[Any])


class Recorder:
    """An async hook that records every event it receives (with the time it arrived)."""

    def __init__(self) -> None:
        self.events: list[awa.JobEvent[Any]] = []
        self.times: list[float] = []

    async def __call__(self, event: awa.JobEvent[Any]) -> None:
        self.events.append(event)
        self.times.append(time.monotonic())

    def of(self, event_type: type[E], job_id: int | None = None) -> list[E]:
        return [
            event
            for event in self.events
            if isinstance(event, event_type) and (job_id is None or event.job.id == job_id)
        ]

    def names(self, job_id: int | None = None) -> list[str]:
        """The event class names received (for one job), in arrival order."""
        return [
            type(event).__name__
            for event in self.events
            if job_id is None or event.job.id == job_id
        ]

    async def wait(
        self,
        event_type: type[E],
        job_id: int | None = None,
        *,
        count: int = 1,
        timeout: float = 5.0,
    ) -> list[E]:
        """Wait until ``count`` events of ``event_type`` (for ``job_id``) have arrived."""

        def check() -> list[E] | None:
            found = self.of(event_type, job_id)
            return found if len(found) >= count else None

        return await wait_for(
            check,
            timeout,
            message=lambda: f"expected {count} x {event_type.__name__}, got {self.names()}",
        )


async def hooks_idle(client: awa.AsyncClient, timeout: float = 5.0) -> None:
    """Wait until no hook task of ``client`` is running (every dispatched event handled)."""
    await wait_for(lambda: client.hook_dispatcher.pending() == 0, timeout)


def jobs_of_kind(conn: Conn, kind: str) -> list[dict[str, Any]]:
    """Rows of ``kind`` as dicts, oldest first."""
    cursor = conn.execute(
        "SELECT id, kind, queue, args, state::text AS state, priority, max_attempts, metadata,"
        " tags, unique_key, run_at, deadline_duration, ordering_key, attempt"
        " FROM awa.jobs WHERE kind = %s ORDER BY id",
        (kind,),
    )
    assert cursor.description is not None
    names = [column.name for column in cursor.description]
    return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]


def state_of(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM awa.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return str(row[0])


# OpenTelemetry ---------------------------------------------------------------------------

_reader: Any = None


def metric_reader() -> Any:
    """The process's InMemoryMetricReader, installing an SDK MeterProvider on first use.

    awa.observability.metrics created its instruments at import through the API's global
    proxy; setting the SDK provider afterwards must still route them (which is what this
    exercises).
    """
    global _reader
    if _reader is None:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _reader = reader
    return _reader


def counter_value(name: str, **attributes: Any) -> int:
    """The cumulative value of counter ``name`` over the data points that carry every one of
    ``attributes`` (0 if it was never recorded)."""
    data = metric_reader().get_metrics_data()
    total = 0
    if data is None:
        return 0
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    point_attributes = dict(point.attributes or {})
                    if all(point_attributes.get(k) == v for k, v in attributes.items()):
                        total += int(point.value)
    return total


@dataclasses.dataclass
class Counters:
    """Counter values captured now, to compare with later values (counters are cumulative)."""

    name: str
    attributes: dict[str, Any]
    before: int

    @classmethod
    def capture(cls, name: str, **attributes: Any) -> Counters:
        return cls(name, attributes, counter_value(name, **attributes))

    def delta(self) -> int:
        return counter_value(self.name, **self.attributes) - self.before
