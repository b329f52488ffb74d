"""What a handler can return to choose its job's outcome.

Returning None (or any other value) completes the job. Raising ``awa.TerminalError`` fails
it at once; raising anything else retries it with exponential backoff until
``max_attempts`` runs out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math


def _delay_seconds(value: float | dt.timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{name} takes seconds (a number) or a timedelta")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} delay must be a finite, non-negative number of seconds")
    return float(seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryAfter:
    """Fail this attempt and run the job again after ``seconds`` (fractions kept).

    It consumes the attempt: on the last attempt the job is exhausted and fails.
    """

    seconds: float

    def __init__(self, seconds: float | dt.timedelta) -> None:
        object.__setattr__(self, "seconds", _delay_seconds(seconds, "RetryAfter"))


@dataclasses.dataclass(frozen=True, slots=True)
class Snooze:
    """Run the job again after ``seconds`` without consuming an attempt and without an event.

    Not bounded by ``max_attempts``: use it for polling, not for failures.
    """

    seconds: float

    def __init__(self, seconds: float | dt.timedelta) -> None:
        object.__setattr__(self, "seconds", _delay_seconds(seconds, "Snooze"))


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the job: it will not run again."""

    reason: str = "cancelled by handler"


OUTCOME_TYPES: tuple[type, ...] = (RetryAfter, Snooze, Cancel)
