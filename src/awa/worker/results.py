"""The outcome of one attempt, as the executor hands it to the finalizer."""

from __future__ import annotations

import dataclasses
import traceback

MAX_TRACEBACK_LINES = 10


@dataclasses.dataclass(frozen=True, slots=True)
class Completed:
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """A retryable failure: an exception (error set, backoff delay) or RetryAfter (delay set,
    no error unless it exhausts the job). ``exception`` is what the handler raised, for the
    log's traceback."""

    error: str | None
    delay: float | None = None
    exhausted_error: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    """A terminal failure (``exception``: what the handler raised, if it raised)."""

    error: str
    exception: BaseException | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Cancelled:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Snoozed:
    delay: float


@dataclasses.dataclass(frozen=True, slots=True)
class Interrupted:
    """The worker shut down before the handler finished."""

    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Park:
    """The handler returned WaitForCallback with this callback id."""

    callback_id: str


Outcome = Completed | Retry | Fail | Cancelled | Snoozed | Interrupted | Park


def storable_text(text: str) -> str:
    """``text`` with NUL characters escaped: Postgres text cannot hold them, and a message
    that contains one would make the outcome's statement fail."""
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def format_error(error: BaseException) -> str:
    """``Type: message`` followed by the last lines of the traceback."""
    return storable_text(_format_error(error))


def _format_error(error: BaseException) -> str:
    name = type(error).__qualname__
    module = type(error).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    head = f"{name}: {error}" if str(error) else name
    lines = "".join(traceback.format_tb(error.__traceback__)).rstrip().splitlines()
    if not lines:
        return head
    if len(lines) > MAX_TRACEBACK_LINES:
        dropped = len(lines) - MAX_TRACEBACK_LINES
        lines = [f"... ({dropped} traceback lines omitted)", *lines[-MAX_TRACEBACK_LINES:]]
    return head + "\n" + "\n".join(lines)
