"""What a handler can return to choose its job's outcome.

Returning None (or any other value) completes the job. Raising ``awa.TerminalError`` fails
it at once; raising anything else retries it with exponential backoff until
``max_attempts`` runs out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time

from awa.errors import ValidationError


def _delay_seconds(value: float | dt.timedelta, name: str) -> float:
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(
            f"{name} takes seconds (a number) or a timedelta, not {type(value).__name__}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValidationError(
            f"{name} delay must be a finite, non-negative number of seconds, got {seconds!r}"
        )
    if time.time() + seconds >= _LATEST_RUN_AT:
        # The row's run_at could not be read back (or even stored): refuse it here, where the
        # handler sees a clear error, instead of failing the outcome's commit.
        raise ValidationError(f"{name}({seconds:g}) would run the job after the year 9999")
    return float(seconds)


_LATEST_RUN_AT = dt.datetime(9999, 1, 1, tzinfo=dt.UTC).timestamp()


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


@dataclasses.dataclass(frozen=True, slots=True)
class CallbackToken:
    """A callback registered by ``await job.register_callback()``; send ``id`` to the system
    that will answer."""

    id: str

    def __str__(self) -> str:
        return self.id


@dataclasses.dataclass(frozen=True, slots=True)
class WaitForCallback:
    """Park the job until an outside system resolves the callback (``complete_external``,
    ``fail_external``, ``retry_external``, ``resolve_callback`` or ``resume_external``), or
    its timeout passes. The slot is released while it waits."""

    token: CallbackToken

    def __post_init__(self) -> None:
        if not isinstance(self.token, CallbackToken):
            raise TypeError(
                "WaitForCallback takes the CallbackToken returned by job.register_callback()"
            )


OUTCOME_TYPES: tuple[type, ...] = (RetryAfter, Snooze, Cancel, WaitForCallback)
