"""What a function's answer means for the attempt: the status decides, ``Retry-After``
sets the delay of a snooze, and a synchronous function's body becomes the job's output.

=====================================  ================================================
Answer                                 Outcome
=====================================  ================================================
2xx                                    completed (sync: the body is the output), or
                                       parked on the callback (async)
429 or 503 with a usable Retry-After   snoozed for that long (no attempt consumed)
408, 429, 5xx; timeout; no connection  retried with backoff (``FunctionError``)
any other status (3xx, other 4xx)      failed for good (``awa.TerminalError``)
=====================================  ================================================
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import math
import time
from typing import Any

import orjson

from awa.errors import TerminalError
from awa.outcomes import Snooze

__all__ = [
    "ERROR_BODY_BYTES",
    "FunctionError",
    "Reply",
    "decode_output",
    "judge",
    "retry_after_seconds",
]

ERROR_BODY_BYTES = 1024
"""How much of an error answer's body is read, to quote in the job's error."""
RETRYABLE_STATUSES = frozenset({408, 429})
"""4xx statuses that say "later", not "never": retried like a 5xx."""
SNOOZE_STATUSES = frozenset({429, 503})
"""Statuses whose ``Retry-After`` is honoured as a snooze."""
MIN_RETRY_AFTER = 1.0
"""The shortest snooze, in seconds: a snooze consumes no attempt, so ``Retry-After: 0``
repeated would otherwise call the function in a tight loop."""


class FunctionError(Exception):
    """The function could not do the job now: it answered 408, 429 or 5xx, took longer
    than the timeout, or could not be reached. The attempt is retried with backoff."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """A function's answer, as far as it was read."""

    status: int
    reason: str
    retry_after: str | None
    body: bytes
    """The body, or its first bytes (``truncated``) when it is larger than was read."""
    truncated: bool = False


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds from ``now`` that a ``Retry-After`` header asks for (delay-seconds or an
    HTTP date; a date in the past is 0), or None when it is absent or unusable."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(text)  # inf for absurd lengths: the caller caps it
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _quoted(reply: Reply) -> str:
    text = reply.body.decode("utf-8", errors="replace").strip()
    if not text:
        return ""
    return ": " + text + (" ..." if reply.truncated else "")


def judge(reply: Reply, url: str, max_retry_after: float) -> Snooze | None:
    """None when the function accepted the job (2xx), a Snooze when it asked to be called
    later; raises FunctionError (retry) or TerminalError (fail for good) otherwise."""
    if 200 <= reply.status < 300:
        return None
    answer = f"POST {url} answered {reply.status} {reply.reason}".rstrip() + _quoted(reply)
    if reply.status in SNOOZE_STATUSES:
        delay = retry_after_seconds(reply.retry_after)
        if delay is not None:
            return Snooze(min(max(delay, MIN_RETRY_AFTER), max_retry_after))
    if reply.status in RETRYABLE_STATUSES or 500 <= reply.status < 600:
        raise FunctionError(answer)
    raise TerminalError(answer)


def decode_output(body: bytes) -> Any:
    """A 2xx body as the job's output: its JSON value when it parses as JSON (whatever the
    Content-Type says), else its text (UTF-8, undecodable bytes replaced, NUL escaped:
    Postgres text cannot hold it)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", errors="replace").replace("\x00", "\\x00")
