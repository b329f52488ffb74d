"""Logging failures that repeat while the database is unavailable: one warning when a kind
of failure starts, a reminder now and then while it lasts, and one line when it clears.

Every retry loop of the runtime (claiming, completing, saving outcomes, heartbeats, the
listener, maintenance) reports through a ``FailureLog``, so an outage of a minute logs a
handful of lines instead of one per retry.
"""

from __future__ import annotations

import logging
import threading
import time

REMIND_EVERY = 60.0
"""Seconds between the reminders of a failure that goes on."""


def one_line(error: BaseException | str) -> str:
    """An error's text on one line (libpq messages span several)."""
    return " ".join(str(error).split()) or type(error).__name__


class FailureLog:
    """The log of one kind of failure (``what``: what keeps failing, e.g. "heartbeat").

    ``failed()`` logs a warning the first time, then at debug level, with a reminder every
    ``remind_every`` seconds; ``succeeded()`` ends the episode with an info line saying how
    long it lasted. Safe to call from any thread.
    """

    def __init__(
        self, log: logging.Logger, what: str, *, remind_every: float = REMIND_EVERY
    ) -> None:
        self._log = log
        self._what = what
        self._remind_every = remind_every
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0
        self._last_warning = 0.0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(
        self, error: BaseException | str, *, then: str = "retrying", traceback: bool = False
    ) -> None:
        """Record a failure; ``traceback`` adds the current exception's traceback to the
        first warning (for errors that are not simply an unreachable database)."""
        now = time.monotonic()
        first = False
        text = one_line(error)
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = self._last_warning = now
                first = True
                level, message = logging.WARNING, "%s failed (%s); %s"
                args: tuple[object, ...] = (self._what, text, then)
            elif now - self._last_warning >= self._remind_every:
                self._last_warning = now
                level, message = logging.WARNING, "%s still failing after %.0fs, %d attempts (%s)"
                args = (self._what, now - self._since, self._failures, text)
            else:
                level, message = logging.DEBUG, "%s failed again (%s)"
                args = (self._what, text)
        self._log.log(level, message, *args, exc_info=first and traceback)

    def succeeded(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is None:
                return
            lasted = time.monotonic() - self._since
            failures = self._failures
            self._since = None
            self._failures = 0
        self._log.info(
            "%s recovered after %.1fs (%d failed attempts)", self._what, lasted, failures
        )


class _PoolReconnectFilter(logging.Filter):
    """Lets through one "error connecting in 'awa'" warning of psycopg_pool per minute (the
    pool logs one per reconnection attempt of each connection)."""

    def __init__(self, pool_name: str) -> None:
        super().__init__()
        self._pool_name = pool_name
        self._last = -REMIND_EVERY
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (
            record.msg == "error connecting in %r: %s"
            and isinstance(record.args, tuple)
            and record.args[:1] == (self._pool_name,)
        ):
            return True
        now = time.monotonic()
        if now - self._last < REMIND_EVERY:
            self._suppressed += 1
            return False
        self._last = now
        if self._suppressed:
            record.msg += " (%d similar messages suppressed)"
            record.args = (*record.args, self._suppressed)
            self._suppressed = 0
        return True


_installed: set[str] = set()


def quiet_pool_reconnect_errors(pool_name: str) -> None:
    """Rate-limit psycopg_pool's reconnection warnings for the pool named ``pool_name``."""
    if pool_name in _installed:
        return
    _installed.add(pool_name)
    logging.getLogger("psycopg.pool").addFilter(_PoolReconnectFilter(pool_name))
