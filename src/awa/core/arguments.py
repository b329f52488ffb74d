"""Checks of the arguments of client, admin and command calls: ids within Postgres's bigint,
page sizes, collections of ids, durations, free text and switches. Each raises
ValidationError naming the argument and its limit, before anything reaches the database."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from awa.errors import ValidationError
from awa.model import (
    BIGINT_MAX,
    INT_MAX,
    MAX_DURATION,
    MAX_IDS,
    MAX_LIST_LIMIT,
    MAX_NAME_LENGTH,
    check_encodable,
    check_int_range,
    check_name,
    seconds_of,
    short_repr,
)


def check_id(field: str, value: object) -> int:
    """A job id (or another bigint key): an integer from 1 to 2**63 - 1, not a bool."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field} must be an integer, not {type(value).__name__}")
    if not 1 <= value <= BIGINT_MAX:
        raise ValidationError(
            f"{field} must be between 1 and {BIGINT_MAX}, got {short_repr(value)}"
        )
    return value


def check_ids(field: str, values: object, *, limit: int = MAX_IDS) -> list[int]:
    """A non-empty collection of job ids (``check_id``), at most ``limit`` of them; repeats
    are dropped, order kept."""
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise ValidationError(f"{field} must be a list of job ids, not {type(values).__name__}")
    ids: dict[int, None] = {}
    for value in cast(Iterable[object], values):
        ids[check_id(f"{field}: job id", value)] = None
        if len(ids) > limit:
            raise ValidationError(f"{field} holds more than {limit} job ids; the limit is {limit}")
    if not ids:
        raise ValidationError(f"{field} must name at least one job id")
    return list(ids)


def check_limit(field: str, value: object, high: int = MAX_LIST_LIMIT) -> int:
    """A page size or batch bound: an integer from 1 to ``high``."""
    return check_int_range(field, value, 1, high)


def check_seconds(field: str, value: object, *, allow_zero: bool = True) -> float:
    """A duration in seconds (a number or a timedelta): finite, not negative (nor zero
    unless allowed) and at most ``MAX_DURATION`` (100 years)."""
    seconds = seconds_of(cast(Any, value), field)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValidationError(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {seconds:g}")
    if seconds > MAX_DURATION.total_seconds():
        raise ValidationError(
            f"{field} is {seconds:g} seconds; the limit is {MAX_DURATION.days} days (100 years)"
        )
    return seconds


def check_text(field: str, value: object, max_length: int = MAX_NAME_LENGTH) -> str:
    """Free text stored as given (who paused a queue, a reason): a string of at most
    ``max_length`` characters, without NUL bytes or lone surrogates (may be empty)."""
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string, not {type(value).__name__}")
    if len(value) > max_length:
        raise ValidationError(f"{field} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise ValidationError(f"{field} contains a NUL byte, which Postgres cannot store")
    check_encodable(field, value)
    return value


MAX_CONNECTIONS = 10_000


def check_flag(field: str, value: object) -> bool:
    """A switch: True or False, not a truthy string or number."""
    if not isinstance(value, bool):
        raise ValidationError(f"{field} must be True or False, not {type(value).__name__}")
    return value


def check_client_options(max_connections: object, application_name: object) -> None:
    """A client's pool size (1 to 10,000) and application name (text Postgres can store)."""
    check_int_range("max_connections", max_connections, 1, MAX_CONNECTIONS)
    check_text("application_name", application_name)


def optional_name(field: str, value: object) -> str | None:
    """A filter naming a queue, kind, ...: None, or a name as ``check_name`` accepts."""
    return None if value is None else check_name(field, value)


def uuid_from(
    value: object,
    not_text: Callable[[str], Exception],
    not_uuid: Callable[[ValueError, str], Exception],
) -> uuid.UUID:
    """``value`` (a UUID, or its text) as a UUID. The errors come from the caller:
    ``not_text(type name)`` for another type, ``not_uuid(error, value as shown)`` for text
    that is not a UUID (shortened when long)."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise not_text(type(value).__name__)
    try:
        return uuid.UUID(value)
    except ValueError as error:
        shown = repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value)} characters)"
        raise not_uuid(error, shown) from None


# Bounds of a rate limit, in jobs per second: beyond them the bucket's arithmetic (and the
# wait it computes, 1/rate) stops meaning anything. The low end is about one job in 11 days.
MIN_RATE = 1e-6
MAX_RATE = float(INT_MAX)


def check_rate_limit(where: str, value: object) -> tuple[float, int]:
    """A rate limit given as ``(rate, burst)``, a bare rate, or a list (from TOML or JSON),
    as ``(rate, burst)``; a burst of 0 means ``max(ceil(rate), 1)``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = (value, 0)
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise ValidationError(
            f"{where} must be a (jobs per second, burst) pair or a number, got {short_repr(value)}"
        )
    rate, burst = value
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not MIN_RATE <= rate <= MAX_RATE  # False for NaN
    ):
        raise ValidationError(
            f"{where}: the rate must be a number of jobs per second from {MIN_RATE:g} to "
            f"{MAX_RATE:.0f}, got {short_repr(rate)}"
        )
    if isinstance(burst, bool) or not isinstance(burst, int) or not 0 <= burst <= INT_MAX:
        raise ValidationError(
            f"{where}: the burst must be an integer from 0 (0: the rate) to {INT_MAX}, "
            f"got {short_repr(burst)}"
        )
    return float(rate), burst or max(math.ceil(rate), 1)
