"""OpenTelemetry instruments (meter ``awa``). Without an SDK configured they cost nothing;
with one, export them as usual (``awa_job_completed_total`` and so on in Prometheus; see
docs/observability.md for the list)."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections import Counter as Tally
from collections.abc import Iterable
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

_meter = metrics.get_meter("awa")

KIND = "awa.job.kind"
QUEUE = "awa.job.queue"
STATE = "awa.job.state"

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
# Seconds, from a millisecond to an hour (the SDK's default buckets suit milliseconds).
SECONDS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]
SECONDS_BUCKETS += [900, 3600]

duration = _meter.create_histogram(
    "awa.job.duration",
    unit="s",
    description="Handler run time of completed attempts",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
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
FINALIZE_RESULT = "awa.finalize.result"
own_transaction_completions = _meter.create_counter(
    "awa.job.own_transaction_completions",
    unit="{job}",
    description="Completions written in the handler's own transaction (job.finalize(), "
    "job.complete_in()), by awa.finalize.result: committed, not_committed or lost",
)
staged_follow_ups_discarded = _meter.create_counter(
    "awa.job.staged_follow_ups_discarded",
    unit="{job}",
    description="Handler-staged follow-ups discarded because the job parked on a callback",
)
rescues = _meter.create_counter(
    "awa.maintenance.rescues", unit="{job}", description="Jobs rescued, by awa.rescue.kind"
)
SETTING = "awa.setting"
OVERRIDDEN = "awa.setting.overridden"
overrides_applied = _meter.create_counter(
    "awa.queue.overrides_applied",
    unit="{change}",
    description="Changes of a queue's live overrides this process applied (set or cleared)",
)

CRON_SCHEDULE = "awa.cron.schedule"
cron_schedule_errors = _meter.create_counter(
    "awa.cron.schedule_errors",
    unit="{error}",
    description="Evaluations of a periodic job's schedule that failed (it cannot fire), by "
    "awa.cron.schedule; the leader counts one per schedule per tick while it fails",
)


backpressure_signaled = _meter.create_counter(
    "awa.enqueue.backpressure.signaled",
    unit="{job}",
    description="Jobs inserted into a queue at or over its depth limit (policy signal), by "
    "awa.job.queue",
)
backpressure_rejected = _meter.create_counter(
    "awa.enqueue.backpressure.rejected",
    unit="{job}",
    description="Jobs refused because their queue was at or over its depth limit (policy "
    "reject), by awa.job.queue",
)


def count_by_kind(counter: metrics.Counter, jobs: Iterable[tuple[str, str]]) -> None:
    """Add one per (kind, queue) pair, in as few calls as there are distinct pairs."""
    for (kind, queue), amount in Tally(jobs).items():
        counter.add(amount, {KIND: kind, QUEUE: queue})


head_wait = _meter.create_histogram(
    "awa.dispatch.head_wait",
    unit="s",
    description="Per claim: how long its first (most urgent) job waited after it was due",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)


# Gauges, observed at collection (a scrape) from what this process knows: its runtimes'
# handler slots, and the last queue sample the leader stored (read by the runtime every
# sample interval, or by the metrics endpoint before it answers).


class RuntimeSource(Protocol):
    """What the gauges read of a worker runtime."""

    @property
    def is_leader(self) -> bool: ...

    def stats(self) -> dict[str, dict[str, int]]: ...

    def settings(self) -> dict[str, list[tuple[str, float, bool]]]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSample:
    """The leader's last count of one queue: jobs by state, the age of its oldest
    available job (0 when none waits), and how old the sample is (seconds)."""

    queue: str
    counts: dict[str, int]
    lag: float
    sample_age: float
    unserved_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    """Available jobs, by kind, due for over a minute while no live worker of the queue has
    a handler for their kind."""


class _Sources:
    def __init__(self) -> None:
        self.runtimes: weakref.WeakSet[Any] = weakref.WeakSet()
        self.samples: list[QueueSample] = []
        self.sampled_at = 0.0  # time.monotonic() of the last refresh


sources = _Sources()

SAMPLED_STATES = (
    "available",
    "scheduled",
    "running",
    "retryable",
    "waiting_external",
    "blocked",
    "failed",
)


def register_runtime(runtime: RuntimeSource) -> None:
    sources.runtimes.add(runtime)


def unregister_runtime(runtime: RuntimeSource) -> None:
    sources.runtimes.discard(runtime)


def set_queue_samples(samples: list[QueueSample]) -> None:
    sources.samples = samples
    sources.sampled_at = time.monotonic()


def _running(options: CallbackOptions) -> Iterable[Observation]:
    totals: Tally[str] = Tally()
    for runtime in list(sources.runtimes):
        for queue, stats in runtime.stats().items():
            totals[queue] += stats["running"]
    return [Observation(n, {QUEUE: queue}) for queue, n in totals.items()]


def _slots(options: CallbackOptions) -> Iterable[Observation]:
    totals: Tally[str] = Tally()
    for runtime in list(sources.runtimes):
        for queue, stats in runtime.stats().items():
            totals[queue] += stats["max_workers"]
    return [Observation(n, {QUEUE: queue}) for queue, n in totals.items()]


def _settings(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(value, {QUEUE: queue, SETTING: name, OVERRIDDEN: overridden})
        for runtime in list(sources.runtimes)
        for queue, settings in runtime.settings().items()
        for name, value, overridden in settings
    ]


def _leader(options: CallbackOptions) -> Iterable[Observation]:
    runtimes = list(sources.runtimes)
    if not runtimes:
        return []
    return [Observation(int(any(runtime.is_leader for runtime in runtimes)))]


def _depth(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(sample.counts.get(state, 0), {QUEUE: sample.queue, STATE: state})
        for sample in sources.samples
        for state in SAMPLED_STATES
    ]


def _lag(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(sample.lag, {QUEUE: sample.queue}) for sample in sources.samples]


def _unserved_kinds(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(n, {QUEUE: sample.queue, KIND: kind})
        for sample in sources.samples
        for kind, n in sample.unserved_kinds.items()
    ]


def _sample_age(options: CallbackOptions) -> Iterable[Observation]:
    if not sources.samples:
        return []
    return [Observation(max(sample.sample_age for sample in sources.samples))]


_meter.create_observable_gauge(
    "awa.worker.running",
    [_running],
    unit="{job}",
    description="Handlers running now in this process, by queue",
)
_meter.create_observable_gauge(
    "awa.worker.slots",
    [_slots],
    unit="{slot}",
    description="Handler slots of this process, by queue",
)
_meter.create_observable_gauge(
    "awa.queue.setting",
    [_settings],
    description="Settings this process runs each queue with now, by awa.setting (rate, "
    "burst, global_max_running, key_concurrency, claim_batch_size, poll_interval and "
    "deadline_duration in seconds); awa.setting.overridden tells a live override's value",
)
_meter.create_observable_gauge(
    "awa.worker.leader",
    [_leader],
    description="1 when this process leads maintenance, else 0",
)
_meter.create_observable_gauge(
    "awa.queue.depth",
    [_depth],
    unit="{job}",
    description="Jobs of the queue by state, as the leader last counted them",
)
_meter.create_observable_gauge(
    "awa.queue.lag",
    [_lag],
    unit="s",
    description="Age of the queue's oldest available job (0: none waits)",
)
_meter.create_observable_gauge(
    "awa.queue.unserved_kind",
    [_unserved_kinds],
    unit="{job}",
    description="Available jobs of a kind that no live worker of the queue has a handler for "
    "(due for over a minute), as the leader last counted them",
)
_meter.create_observable_gauge(
    "awa.queue.sample_age",
    [_sample_age],
    unit="s",
    description="Age of the leader's last queue sample (grows when no leader samples)",
)


def count_inserted(
    counter: metrics.Counter, attributes: dict[str, Any], inserted: int, duplicates: int
) -> None:
    """Count follow-ups by ``awa.follow_up.result``: inserted, or skipped as duplicates."""
    if inserted:
        counter.add(inserted, {**attributes, "awa.follow_up.result": "inserted"})
    if duplicates:
        counter.add(duplicates, {**attributes, "awa.follow_up.result": "duplicate"})
