"""Live queue overrides on any connection: set, clear and read a queue's overridden settings
and the log of changes (migration 16). Workers apply a queue's overrides over the settings
they were started with within a few seconds (``awa.worker.overrides``); clearing one returns
them to their own. See docs/overrides.md.

The settings, by name (those of ``QueueConfig``): ``rate_limit`` ((jobs per second, burst),
or a bare rate), ``global_max_running``, ``key_concurrency``, ``claim_batch_size`` (integers
from 1 to 2**31 - 1; None for the first three removes the limit the workers were started
with), ``poll_interval`` (seconds, > 0), ``deadline_duration`` (seconds, 0: no
deadline) and ``paused`` (True or False: pauses or resumes the queue, as ``pause_queue``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from awa.core.arguments import (
    check_flag,
    check_limit,
    check_rate_limit,
    check_seconds,
    check_text,
    optional_name,
)
from awa.errors import ValidationError
from awa.model import INT_MAX, MappingAccess, check_int_range, check_name, short_repr
from awa.sql import query
from awa.storage.db import Statement, operation

R = TypeVar("R")


def _count(field: str, value: object) -> int:
    return check_int_range(field, value, 1, INT_MAX)


def _rate(field: str, value: object) -> list[float | int]:
    return list(check_rate_limit(field, value))


def _interval(field: str, value: object) -> float:
    return check_seconds(field, value, allow_zero=False)


def _deadline(field: str, value: object) -> float:
    return check_seconds(field, value)


# Each setting and its check, which returns the value as stored (JSON).
CHECKS: dict[str, Callable[[str, object], Any]] = {
    "rate_limit": _rate,
    "global_max_running": _count,
    "key_concurrency": _count,
    "claim_batch_size": _count,
    "poll_interval": _interval,
    "deadline_duration": _deadline,
    "paused": check_flag,
}
SETTINGS = tuple(CHECKS)
# The limits an override may remove (None: the queue runs without one, whatever its
# workers were started with).
REMOVABLE = frozenset({"rate_limit", "global_max_running", "key_concurrency"})

# Rows a list of overrides or of changes returns at most, and by default.
MAX_ROWS = 1000
DEFAULT_LOG_ROWS = 50


def check_settings(settings: Mapping[str, object]) -> dict[str, Any]:
    """The given settings checked and in their stored form; ValidationError names an
    unknown setting, or the setting and the value that is out of bounds."""
    if not isinstance(settings, Mapping):
        raise ValidationError(
            f"overrides must be a mapping of setting to value, not {type(settings).__name__}"
        )
    checked = {}
    for name, value in settings.items():
        check = CHECKS.get(name) if isinstance(name, str) else None
        if check is None:
            raise ValidationError(
                f"unknown queue setting {short_repr(name)}; the settings are {', '.join(SETTINGS)}"
            )
        checked[name] = None if value is None and name in REMOVABLE else check(name, value)
    return checked


def applicable(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Stored settings as ``QueueConfig`` values (a rate limit as a tuple), leaving out the
    ones this release does not know (written by a newer one) and ``paused`` (the claim
    reads it from ``awa.queues``). ValidationError when a value is out of bounds (a row
    written by hand)."""
    known = {name: value for name, value in stored.items() if name in CHECKS and name != "paused"}
    checked = check_settings(known)
    if checked.get("rate_limit") is not None:
        checked["rate_limit"] = tuple(checked["rate_limit"])
    return checked


@dataclasses.dataclass(frozen=True, slots=True)
class QueueOverrides(MappingAccess):
    """A queue's overrides: ``settings`` holds the overridden settings by name (a rate limit
    as ``[rate, burst]``); ``paused`` whether the queue is paused now (by an override or by
    ``pause_queue``); when and by whom the settings last changed (None: none stored)."""

    queue: str
    settings: dict[str, Any]
    paused: bool
    updated_at: dt.datetime | None
    updated_by: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class OverrideChange(MappingAccess):
    """One change of a queue's overrides: who and when, ``action`` ``"set"`` or
    ``"clear"``, and the overridden settings before and after (``paused`` included)."""

    id: int
    queue: str
    changed_at: dt.datetime
    changed_by: str | None
    action: str
    old: dict[str, Any]
    new: dict[str, Any]


def _by(changed_by: object) -> str | None:
    return None if changed_by is None else check_text("changed_by", changed_by)


def _change(
    queue: str, action: str, set_: Mapping[str, Any], clear: Iterable[str], changed_by: str | None
) -> Statement[QueueOverrides]:
    params = {
        "queue": queue,
        "set": json.dumps(set_),
        "clear": list(clear),
        "by": changed_by,
        "action": action,
    }

    def decode(rows: list[dict[str, Any]]) -> QueueOverrides:
        return QueueOverrides(queue=queue, **rows[0])

    return Statement(query("overrides_change"), params, decode)


@operation
def set_queue_overrides(
    queue: str,
    settings: Mapping[str, object] | None = None,
    *,
    changed_by: str | None = None,
    **more: object,
) -> Statement[QueueOverrides]:
    """Override settings of ``queue`` for every worker running it, given as a mapping or as
    keywords (``rate_limit=(20, 5)``, ``poll_interval=2``, ``paused=True``, ...); the other
    overridden settings stay. Records the change with ``changed_by`` (at most 200
    characters) and returns the queue's overrides. ValidationError names an unknown
    setting, or the setting and its bad value; nothing is written then."""
    given = {**(settings or {}), **more}
    if not given:
        raise ValidationError(f"give at least one setting to override: {', '.join(SETTINGS)}")
    checked = check_settings(given)
    return _change(check_name("queue", queue), "set", checked, [], _by(changed_by))


@operation
def clear_queue_overrides(
    queue: str, settings: Iterable[str] | None = None, *, changed_by: str | None = None
) -> Statement[QueueOverrides]:
    """Clear the named overridden settings of ``queue`` (None: every one, and a pause),
    returning its workers to the settings they were started with; clearing ``paused``
    resumes the queue. Records the change and returns what is left."""
    if settings is None:
        names = list(SETTINGS)
    else:
        if isinstance(settings, str | bytes) or not isinstance(settings, Iterable):
            raise ValidationError("settings must be a list of setting names")
        names = list(dict.fromkeys(settings))
        unknown = [name for name in names if name not in CHECKS]
        if unknown:
            raise ValidationError(
                f"unknown queue setting(s) {short_repr(unknown)}; the settings are "
                f"{', '.join(SETTINGS)}"
            )
    return _change(check_name("queue", queue), "clear", {}, names, _by(changed_by))


def _rows(name: str, row: Callable[..., R], queue: str | None, limit: int) -> Statement[list[R]]:
    params = {
        "queue": optional_name("queue", queue),
        "limit": check_limit("limit", limit, MAX_ROWS),
    }
    return Statement(query(name), params, lambda rows: [row(**found) for found in rows])


@operation
def list_queue_overrides(
    queue: str | None = None, *, limit: int = MAX_ROWS
) -> Statement[list[QueueOverrides]]:
    """The overridden or paused queues (or only ``queue``), by name, at most ``limit``."""
    return _rows("overrides_list", QueueOverrides, queue, limit)


@operation
def queue_override_log(
    queue: str | None = None, *, limit: int = DEFAULT_LOG_ROWS
) -> Statement[list[OverrideChange]]:
    """The latest changes of overrides (of ``queue``, or of all queues), newest first."""
    return _rows("overrides_log", OverrideChange, queue, limit)
