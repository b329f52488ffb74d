"""Runtime and per-queue settings, and how ``start()`` arguments turn into them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from awa.core.arguments import check_rate_limit, check_seconds
from awa.errors import ValidationError
from awa.model import INT_MAX, check_name


def _positive_seconds(value: object, field: str, *, allow_zero: bool = False) -> float:
    """Seconds (a number or a timedelta), finite, above 0 (or at 0 when allowed), at most
    100 years."""
    return check_seconds(field, value, allow_zero=allow_zero)


def _positive_int(value: object, field: str, *, low: int = 1) -> int:
    """An integer from ``low`` to 2**31 - 1 (the integer columns and parameters it ends in)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT_MAX:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:30]}..."
        what = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValidationError(f"{field} must be {what} (at most {INT_MAX}), got {shown}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff after a failed attempt: ``min(base**attempt * (1 + U(0, jitter)), max_delay)``
    seconds. The defaults give 2-2.5 s after attempt 1, 4-5 s after attempt 2, ... 24 h."""

    base: float = 2.0
    jitter: float = 0.25
    max_delay: float = 86400.0

    def __post_init__(self) -> None:
        for field in ("base", "jitter"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValidationError(
                    f"RetryPolicy.{field} must be a number, not {type(value).__name__}"
                )
        if not 1 <= self.base <= 1e6:  # NaN too
            raise ValidationError(f"RetryPolicy.base must be between 1 and 1e6, got {self.base}")
        if not 0 <= self.jitter <= 1e6:
            raise ValidationError(
                f"RetryPolicy.jitter must be between 0 and 1e6, got {self.jitter}"
            )
        _positive_seconds(self.max_delay, "RetryPolicy.max_delay")


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    """How one queue is worked.

    ``max_workers`` handlers run at once. ``claim_batch_size`` caps one claim. ``prefetch``
    lets the worker claim up to that many jobs beyond its free slots while handlers are
    quick (it shrinks to nothing for slow handlers), which saves round trips on busy queues
    of short jobs; 0 turns it off. ``poll_interval`` is the fallback when no notification
    arrives. ``deadline_duration`` bounds each attempt (0 means no deadline).

    Flow control across every worker running the queue (see docs/flow-control.md):
    ``rate_limit=(rate, burst)`` starts at most ``rate`` jobs per second (``burst`` at once;
    0 means ``max(ceil(rate), 1)``), ``global_max_running`` caps the jobs running at once,
    and ``key_concurrency`` caps the running jobs that share a ``concurrency_key``.

    In this process's weighted mode (``start(global_max_workers=N)``), ``min_workers`` is the
    queue's guaranteed share of the N slots and ``weight`` its part of the rest; a queue with
    ``min_workers`` set is weighted, one without keeps its own ``max_workers``.
    """

    name: str
    max_workers: int = 10
    poll_interval: float = 0.5
    deadline_duration: float = 300.0
    claim_batch_size: int = 256
    prefetch: int = -1  # -1: default (4 x max_workers)
    retry: RetryPolicy = RetryPolicy()
    rate_limit: tuple[float, int] | None = None
    global_max_running: int | None = None
    key_concurrency: int | None = None
    min_workers: int | None = None
    weight: int = 1
    # Seconds this queue's finished jobs are kept, overriding the worker-wide
    # completed_retention / failed_retention (None: those).
    completed_retention: float | None = None
    failed_retention: float | None = None
    # Whether this queue's jobs that fail for good move to the dead-letter queue (None: the
    # runtime's dlq_enabled). See awa.dlq.
    dlq_enabled: bool | None = None

    def __post_init__(self) -> None:
        check_name("queue", self.name)
        if self.dlq_enabled is not None and not isinstance(self.dlq_enabled, bool):
            raise ValidationError(f"queue {self.name!r}: dlq_enabled must be True or False")
        for field in ("completed_retention", "failed_retention"):
            value = getattr(self, field)
            if value is not None:
                seconds = _positive_seconds(value, f"queue {self.name!r}: {field}")
                object.__setattr__(self, field, seconds)
        _positive_int(self.max_workers, f"queue {self.name!r}: max_workers")
        if self.rate_limit is not None:
            object.__setattr__(
                self,
                "rate_limit",
                check_rate_limit(f"queue {self.name!r}: rate_limit", self.rate_limit),
            )
        for field in ("global_max_running", "key_concurrency"):
            value = getattr(self, field)
            if value is not None:
                _positive_int(value, f"queue {self.name!r}: {field}")
        if self.min_workers is not None:
            _positive_int(self.min_workers, f"queue {self.name!r}: min_workers", low=0)
        if isinstance(self.weight, bool) or not isinstance(self.weight, int):
            raise ValidationError(
                f"queue {self.name!r}: weight must be an integer > 0, not "
                f"{type(self.weight).__name__}"
            )
        if not 0 < self.weight <= INT_MAX:
            raise ValidationError(
                f"queue {self.name!r}: weight must be > 0 and at most {INT_MAX}, got {self.weight}"
            )
        object.__setattr__(
            self,
            "poll_interval",
            _positive_seconds(self.poll_interval, f"queue {self.name!r}: poll_interval"),
        )
        object.__setattr__(
            self,
            "deadline_duration",
            _positive_seconds(
                self.deadline_duration, f"queue {self.name!r}: deadline_duration", allow_zero=True
            ),
        )
        _positive_int(self.claim_batch_size, f"queue {self.name!r}: claim_batch_size")
        if self.prefetch == -1:
            # Prefetched jobs are running in the database while they wait here: under a cap
            # they would hold places other workers could use, and under weights a share.
            # (Under a per-key limit they hold their key's place for the prefetch window,
            # a few handler durations at most, which other keys do not notice.)
            holds = self.global_max_running is not None or self.min_workers is not None
            object.__setattr__(self, "prefetch", 0 if holds else 4 * self.max_workers)
        _positive_int(self.prefetch, f"queue {self.name!r}: prefetch", low=0)
        if not isinstance(self.retry, RetryPolicy):
            raise ValidationError(f"queue {self.name!r}: retry must be an awa.RetryPolicy")

    @property
    def limited(self) -> bool:
        """Whether claims of this queue go through the fleet-wide limits."""
        return (
            self.rate_limit is not None
            or self.global_max_running is not None
            or self.key_concurrency is not None
        )

    @property
    def weighted(self) -> bool:
        return self.min_workers is not None


_QUEUE_KEYS = frozenset(
    field.name for field in dataclasses.fields(QueueConfig) if field.name != "name"
)


def parse_queues(
    queues: Iterable[tuple[str, int]] | Mapping[str, int | Mapping[str, Any]] | None,
    declared: Iterable[str],
    *,
    global_max_workers: int | None = None,
) -> list[QueueConfig]:
    """Queue configs from ``start()``'s argument: ``[("email", 8), ...]`` or
    ``{"email": 8, "billing": {"max_workers": 2, "deadline_duration": 60}}``; None runs
    every queue a task declared, with default settings.

    With ``global_max_workers``, a queue given as a dict without ``max_workers`` is
    weighted: it shares the N slots, with ``min_workers`` (default 0) guaranteed. A queue
    given a ``max_workers`` keeps it, apart from the N. Weighted mode needs the queues
    given as a dict (None and tuples name no shares: ValidationError, as in the reference
    package).
    """
    weighted = global_max_workers is not None
    configs: list[QueueConfig] = []
    if queues is None:
        if weighted:
            raise ValidationError(
                "weighted mode requires explicit queue configs (global_max_workers set but "
                "queues=None): give each queue's share, e.g. "
                "{'email': {'min_workers': 2, 'weight': 3}, 'reports': {'weight': 1}}"
            )
        configs = [QueueConfig(name) for name in dict.fromkeys(declared)]
    elif isinstance(queues, Mapping):
        for name, spec in queues.items():
            if isinstance(spec, Mapping):
                unknown = sorted(set(spec) - _QUEUE_KEYS)
                if unknown:
                    raise ValidationError(
                        f"queue {name!r}: unknown option(s) {unknown}; "
                        f"expected {sorted(_QUEUE_KEYS)}"
                    )
                if "max_workers" in spec and spec.get("min_workers") is not None:
                    raise ValidationError(
                        f"queue {name!r}: give max_workers (a fixed number of slots) or "
                        "min_workers (a weighted share of global_max_workers), not both"
                    )
                if weighted and "max_workers" not in spec and spec.get("min_workers") is None:
                    spec = {**spec, "min_workers": 0}
                configs.append(QueueConfig(name, **spec))
            else:
                configs.append(QueueConfig(name, max_workers=spec))
    else:
        for item in queues:
            if isinstance(item, QueueConfig):
                configs.append(item)
                continue
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValidationError(
                    "queues must be (name, max_workers) tuples, QueueConfig objects, or a dict"
                )
            if weighted:
                # A tuple's max_workers is the queue's own: none would share the N slots.
                raise ValidationError(
                    "tuple queue config is not supported with global_max_workers; use dict "
                    "form with min_workers/weight (e.g. {'email': {'min_workers': 2}})"
                )
            configs.append(QueueConfig(item[0], max_workers=item[1]))
    if not configs:
        raise ValidationError("start() needs at least one queue (register a task or pass queues)")
    names = [config.name for config in configs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValidationError(f"queue(s) configured more than once: {duplicates}")
    _check_weights(configs, global_max_workers)
    return configs


def _check_weights(configs: list[QueueConfig], global_max_workers: int | None) -> None:
    weighted = [config for config in configs if config.weighted]
    if global_max_workers is None:
        if weighted:
            raise ValidationError(
                f"queue(s) {[config.name for config in weighted]} set min_workers, which "
                "needs start(global_max_workers=N): the slots they share"
            )
        stray = [config.name for config in configs if config.weight != 1]
        if stray:
            raise ValidationError(
                f"queue(s) {stray} set a weight, which needs start(global_max_workers=N)"
            )
        return
    reserved = sum(config.min_workers or 0 for config in weighted)
    if reserved > global_max_workers:
        raise ValidationError(
            f"the weighted queues' min_workers add up to {reserved}, more than "
            f"global_max_workers={global_max_workers}"
        )
    stray = [config.name for config in configs if not config.weighted and config.weight != 1]
    if stray:
        raise ValidationError(
            f"queue(s) {stray} have max_workers and a weight: a weight applies only to "
            "weighted queues (give min_workers instead of max_workers)"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Process-wide settings of the worker runtime (durations in seconds)."""

    heartbeat_interval: float = 30.0
    heartbeat_staleness: float = 90.0
    promote_interval: float = 0.1
    promote_batch_size: int = 4096
    leader_election_interval: float = 2.0
    leader_check_interval: float = 5.0
    completion_batch_size: int = 512
    completion_linger: float = 0.002
    sync_handler_threads: int | None = None
    heartbeat_rescue_interval: float = 10.0
    deadline_rescue_interval: float = 10.0
    callback_rescue_interval: float = 10.0
    rescue_batch_size: int = 500
    completed_retention: float = 86400.0
    failed_retention: float = 7 * 86400.0
    cleanup_interval: float = 30.0
    cleanup_batch_size: int = 5000
    vacuum_interval: float = 10.0
    vacuum_threshold: int = 50_000
    # Seconds between the leader's checks whether the active ring's current slot should be
    # sealed and another slot freed (see worker/storage_ring.py).
    ring_rotation_interval: float = 1.0
    # Seconds an async handler has to return once its attempt is cancelled or rescued
    # (is_cancelled() turns true) before it is interrupted with CancelledError, freeing its
    # slot; None leaves it to the handler. Plain def handlers run on, in their thread.
    cancel_grace: float | None = 5.0
    # Seconds between the leader's evaluations of periodic-job schedules.
    cron_interval: float = 1.0
    # Weighted mode: the slots this process shares among its weighted queues (None: off).
    global_max_workers: int | None = None
    # Seconds an available job waits before the leader raises its priority one level (lowers
    # the number, down to 1), so that urgent jobs cannot starve it for ever; 0: no aging.
    priority_aging_interval: float = 60.0
    # Seconds between the leader's counts of each queue's jobs for the queue gauges (longer
    # on a large backlog: see worker/queue_sampling.py), and between each process's reads.
    queue_sample_interval: float = 5.0
    # Seconds between this process's reads of the live queue overrides (awa.overrides); a
    # change is also announced on awa_overrides, which applies it at once while the listener
    # is connected.
    override_refresh_interval: float = 5.0
    # Whether jobs that fail for good move to the dead-letter queue, for the queues that do
    # not set dlq_enabled themselves; and seconds an entry stays there before the leader
    # deletes it (counted from when it was moved).
    dlq_enabled: bool = False
    dlq_retention: float = 30 * 86400.0
    # Seconds a queue's or job kind's descriptor is kept after a worker last ran or declared
    # it (the leader deletes it then); 0: keep descriptors for ever.
    descriptor_retention: float = 30 * 86400.0
    # Seconds an entry of the queue override change log is kept (the leader deletes older
    # ones); 0: keep the log for ever.
    override_log_retention: float = 365 * 86400.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RuntimeConfig:
        """The config for ``start()``'s keyword options; ValidationError names unknown ones."""
        unknown = sorted(set(options) - _RUNTIME_KEYS)
        if unknown:
            raise ValidationError(
                f"start() got unknown option(s) {unknown}; valid options: "
                f"{', '.join(sorted(_RUNTIME_KEYS))}"
            )
        return cls(**options)

    def __post_init__(self) -> None:
        for field in (
            "heartbeat_interval",
            "heartbeat_staleness",
            "promote_interval",
            "leader_election_interval",
            "leader_check_interval",
            "heartbeat_rescue_interval",
            "deadline_rescue_interval",
            "callback_rescue_interval",
            "completed_retention",
            "failed_retention",
            "cleanup_interval",
            "cron_interval",
            "queue_sample_interval",
            "override_refresh_interval",
            "dlq_retention",
            "ring_rotation_interval",
        ):
            object.__setattr__(self, field, _positive_seconds(getattr(self, field), field))
        object.__setattr__(
            self,
            "completion_linger",
            _positive_seconds(self.completion_linger, "completion_linger", allow_zero=True),
        )
        _positive_int(self.promote_batch_size, "promote_batch_size")
        _positive_int(self.rescue_batch_size, "rescue_batch_size")
        _positive_int(self.cleanup_batch_size, "cleanup_batch_size")
        _positive_int(self.vacuum_threshold, "vacuum_threshold")
        object.__setattr__(
            self,
            "vacuum_interval",
            _positive_seconds(self.vacuum_interval, "vacuum_interval", allow_zero=True),
        )
        _positive_int(self.completion_batch_size, "completion_batch_size")
        if not isinstance(self.dlq_enabled, bool):
            raise ValidationError("dlq_enabled must be True or False")
        if self.cancel_grace is not None:
            object.__setattr__(
                self,
                "cancel_grace",
                _positive_seconds(self.cancel_grace, "cancel_grace", allow_zero=True),
            )
        if self.sync_handler_threads is not None:
            _positive_int(self.sync_handler_threads, "sync_handler_threads")
        if self.global_max_workers is not None:
            _positive_int(self.global_max_workers, "global_max_workers")
        object.__setattr__(
            self,
            "priority_aging_interval",
            _positive_seconds(
                self.priority_aging_interval, "priority_aging_interval", allow_zero=True
            ),
        )
        object.__setattr__(
            self,
            "descriptor_retention",
            _positive_seconds(self.descriptor_retention, "descriptor_retention", allow_zero=True),
        )
        object.__setattr__(
            self,
            "override_log_retention",
            _positive_seconds(
                self.override_log_retention, "override_log_retention", allow_zero=True
            ),
        )
        if self.heartbeat_staleness < 2 * self.heartbeat_interval:
            raise ValidationError(
                "heartbeat_staleness must be at least twice heartbeat_interval, or healthy "
                "jobs would be rescued"
            )


_RUNTIME_KEYS = frozenset(field.name for field in dataclasses.fields(RuntimeConfig))
