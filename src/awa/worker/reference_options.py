"""``start()`` in the reference package's spellings, turned into ours.

Programs written for awa-pg pass durations in milliseconds (``heartbeat_interval_ms=...``),
retention in hours, and queues as a list of dicts with a ``name`` key. Both spellings are
accepted; giving an option in both is an error, since the two could disagree. Options of the
reference's second storage engine (``queue_storage_*``, ``storage_transition_role``...) have
no meaning here (awa stores jobs in one table): they are accepted and have no effect.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

from awa.errors import ValidationError

log = logging.getLogger("awa.worker")

# Reference runtime option -> (our option, factor to seconds).
_RUNTIME_UNITS: dict[str, tuple[str, float]] = {
    "heartbeat_interval_ms": ("heartbeat_interval", 0.001),
    "heartbeat_staleness_ms": ("heartbeat_staleness", 0.001),
    "leader_election_interval_ms": ("leader_election_interval", 0.001),
    "promote_interval_ms": ("promote_interval", 0.001),
    "heartbeat_rescue_interval_ms": ("heartbeat_rescue_interval", 0.001),
    "deadline_rescue_interval_ms": ("deadline_rescue_interval", 0.001),
    "callback_rescue_interval_ms": ("callback_rescue_interval", 0.001),
    "completed_retention_hours": ("completed_retention", 3600.0),
    "failed_retention_hours": ("failed_retention", 3600.0),
    "descriptor_retention_days": ("descriptor_retention", 86400.0),
    "priority_aging_interval_ms": ("priority_aging_interval", 0.001),
}

# Per-queue reference option -> (our queue option, factor).
_QUEUE_UNITS: dict[str, tuple[str, float]] = {
    "deadline_duration_ms": ("deadline_duration", 0.001),
    "poll_interval_ms": ("poll_interval", 0.001),
}

_STORAGE_ENGINE_OPTIONS = frozenset(
    {
        "queue_storage_schema",
        "queue_storage_queue_slot_count",
        "queue_storage_lease_slot_count",
        "queue_storage_claim_slot_count",
        "queue_storage_queue_stripe_count",
        "queue_storage_queue_rotate_interval_ms",
        "queue_storage_lease_rotate_interval_ms",
        "queue_storage_claim_rotate_interval_ms",
        "storage_transition_role",
        "terminal_count_rollup_interval_ms",
    }
)


def _number(value: object, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{option} must be a finite number, got {value!r}")
    if isinstance(value, int) and value.bit_length() > 64:
        # float() would overflow, and its digits would make the message unreadable.
        raise ValidationError(
            f"{option} must be a finite number, got an integer of {value.bit_length()} bits"
        )
    if not math.isfinite(value):
        raise ValidationError(f"{option} must be a finite number, got {value!r}")
    return float(value)


def _converted(
    options: Mapping[str, Any], units: Mapping[str, tuple[str, float]], where: str
) -> dict[str, Any]:
    """``options`` with each reference spelling replaced by ours, in seconds."""
    result = dict(options)
    for theirs, (ours, factor) in units.items():
        if theirs not in result:
            continue
        if ours in result:
            raise ValidationError(
                f"{where}: {theirs} and {ours} set the same thing; give one of them"
            )
        result[ours] = _number(result.pop(theirs), f"{where}: {theirs}") * factor
    return result


def runtime_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], float | None]:
    """Our runtime options for ``start()``'s keywords, and the reference's runtime-wide
    ``poll_interval_ms`` in seconds (ours is per queue) if given."""
    result = _converted(options, _RUNTIME_UNITS, "start()")
    ignored = sorted(result.keys() & _STORAGE_ENGINE_OPTIONS)
    for name in ignored:
        result.pop(name)
    if ignored:
        log.info("start(): %s have no effect: awa keeps jobs in one table", ", ".join(ignored))
    poll = result.pop("poll_interval_ms", None)
    return result, (_number(poll, "start(): poll_interval_ms") / 1000 if poll is not None else None)


def queue_options(queues: Any, poll_interval: float | None) -> tuple[Any, dict[str, Any]]:
    """Queues in our forms, and runtime options the reference sets per queue (ours are
    runtime-wide: ``priority_aging_interval_ms``). A list of dicts with a ``name`` key (the
    reference's form) becomes our mapping; millisecond keys become seconds;
    ``retention={"completed_hours": h, "failed_hours": h}`` becomes the queue's
    ``completed_retention``/``failed_retention``. ``claimers`` is accepted (awa claims
    with one loop per queue)."""
    runtime: dict[str, Any] = {}
    if isinstance(queues, list | tuple) and any(isinstance(item, Mapping) for item in queues):
        mapping: dict[str, Any] = {}
        for item in queues:
            if not isinstance(item, Mapping):
                raise ValidationError(
                    "queues: mix no tuples with dicts; each dict needs a 'name' key"
                )
            if "name" not in item:
                raise ValidationError("queues: a queue config dict must have a 'name' key")
            spec = {key: value for key, value in item.items() if key != "name"}
            if item["name"] in mapping:
                raise ValidationError(f"queue(s) configured more than once: [{item['name']!r}]")
            mapping[item["name"]] = spec
        queues = mapping
    if isinstance(queues, Mapping):
        converted: dict[str, Any] = {}
        aging: set[float] = set()
        for name, spec in queues.items():
            if not isinstance(spec, Mapping):
                converted[name] = spec
                continue
            spec = _converted(spec, _QUEUE_UNITS, f"queue {name!r}")
            spec.pop("claimers", None)
            if "priority_aging_interval_ms" in spec:
                value = spec.pop("priority_aging_interval_ms")
                aging.add(_number(value, f"queue {name!r}: priority_aging_interval_ms") / 1000)
            if "retention" in spec:
                retention = _retention(spec.pop("retention"), name)
                spec.update(retention)
            if poll_interval is not None:
                spec.setdefault("poll_interval", poll_interval)
            converted[name] = spec
        if len(aging) > 1:
            raise ValidationError(
                "queues set different priority_aging_interval_ms values; awa ages priorities "
                "with one interval per worker (start(priority_aging_interval=...))"
            )
        if aging:
            runtime["priority_aging_interval"] = aging.pop()
        queues = converted
    elif poll_interval is not None:
        queues = _with_poll_interval(queues, poll_interval)
    return queues, runtime


def _with_poll_interval(queues: Iterable[Any] | None, poll_interval: float) -> Any:
    """Tuples (or None, left to the declared queues) with the reference's runtime-wide poll
    interval applied to each queue."""
    if queues is None:
        return None
    mapping: dict[str, Any] = {}
    for item in queues:
        if isinstance(item, tuple) and len(item) == 2:
            mapping[item[0]] = {"max_workers": item[1], "poll_interval": poll_interval}
        else:
            return queues  # QueueConfig objects carry their own
    return mapping


def _retention(value: object, queue: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValidationError(
            f"queue {queue!r}: retention must be a dict of completed_hours / failed_hours"
        )
    unknown = sorted(set(value) - {"completed_hours", "failed_hours"})
    if unknown:
        raise ValidationError(
            f"queue {queue!r}: retention: unknown key(s) {unknown}; "
            "expected completed_hours, failed_hours"
        )
    result = {}
    for key, ours in (
        ("completed_hours", "completed_retention"),
        ("failed_hours", "failed_retention"),
    ):
        if key in value:
            hours = _number(value[key], f"queue {queue!r}: retention.{key}")
            if hours <= 0:
                raise ValidationError(f"queue {queue!r}: retention.{key} must be > 0")
            result[ours] = hours * 3600.0
    return result
