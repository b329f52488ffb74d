"""OpenTelemetry instruments (meter ``awa``). Without an SDK configured they cost nothing;
with one, export them as usual (``awa_job_completed_total`` and so on in Prometheus)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from opentelemetry import metrics

_meter = metrics.get_meter("awa")

KIND = "awa.job.kind"
QUEUE = "awa.job.queue"

claimed = _meter.create_counter("awa.job.claimed", unit="{job}", description="Jobs claimed")
completed = _meter.create_counter(
    "awa.job.completed", unit="{job}", description="Attempts that completed their job"
)
retried = _meter.create_counter(
    "awa.job.retried", unit="{job}", description="Attempts that failed and will be retried"
)
failed = _meter.create_counter(
    "awa.job.failed", unit="{job}", description="Jobs that failed for good"
)
cancelled = _meter.create_counter(
    "awa.job.cancelled", unit="{job}", description="Jobs cancelled by their handler"
)
snoozed = _meter.create_counter(
    "awa.job.snoozed", unit="{job}", description="Attempts that snoozed their job"
)
stale = _meter.create_counter(
    "awa.job.stale_outcomes",
    unit="{job}",
    description="Outcomes of attempts that were rescued, cancelled or re-claimed meanwhile",
)
duration = _meter.create_histogram(
    "awa.job.duration", unit="s", description="Handler run time of completed attempts"
)
follow_ups_committed = _meter.create_counter(
    "awa.job.follow_ups_committed",
    unit="{job}",
    description="Follow-ups of committed transitions, by awa.follow_up.result",
)
follow_up_failures = _meter.create_counter(
    "awa.job.follow_up_failures",
    unit="{failure}",
    description="Transitions rolled back because a follow-up could not be built or inserted",
)
staged_follow_ups_committed = _meter.create_counter(
    "awa.job.staged_follow_ups_committed",
    unit="{job}",
    description="Handler-staged follow-ups of committed completions, by awa.follow_up.result",
)
staged_follow_ups_discarded = _meter.create_counter(
    "awa.job.staged_follow_ups_discarded",
    unit="{job}",
    description="Handler-staged follow-ups discarded because the job parked on a callback",
)
rescues = _meter.create_counter(
    "awa.maintenance.rescues", unit="{job}", description="Jobs rescued, by awa.rescue.kind"
)


def count_by_kind(counter: metrics.Counter, jobs: Iterable[tuple[str, str]]) -> None:
    """Add one per (kind, queue) pair, in as few calls as there are distinct pairs."""
    for (kind, queue), amount in Tally(jobs).items():
        counter.add(amount, {KIND: kind, QUEUE: queue})
