"""Exceptions raised by awa."""

from __future__ import annotations


class AwaError(Exception):
    """Base class of every error awa raises on purpose."""


class ValidationError(AwaError, ValueError):
    """Bad input, detected before anything reached the database.

    The message names the field and the rule it broke.
    """


class ArgumentTypeError(ValidationError, TypeError):
    """A ValidationError for an argument of the wrong type (a string where a number goes).
    It is also a ``TypeError``, which the reference package raises for these."""


class UniqueConflict(AwaError):
    """An insert collided with a job holding the same unique key.

    ``job_id`` is the id of the job holding the key (None when it vanished before it could be
    read back); ``constraint`` is the name of the unique index.
    """

    def __init__(self, message: str, *, job_id: int | None, constraint: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.constraint = constraint


class SchemaNotMigrated(AwaError):
    """The awa schema is missing or older than this version of the package."""


class DatabaseError(AwaError):
    """The database could not be reached or refused a statement."""


class TerminalError(AwaError):
    """Raise from a handler to fail the job now, without further attempts."""


class CallbackNotFound(AwaError):
    """No parked or running job holds this callback id (resolved, stale or unknown)."""


class CallbackWaitError(AwaError):
    """``job.wait_for_callback()`` cannot return a payload: the token is stale, or the job
    was cancelled, rescued or resolved some other way while it waited."""


class StagingError(TerminalError):
    """``job.enqueue_on_completion()`` refused a follow-up: it would not insert, a limit
    (``MAX_STAGED_FOLLOW_UPS``, ``MAX_STAGED_BYTES``) is reached, or the handler already
    returned. Uncaught it fails the job now; caught, the attempt still fails terminally if
    the handler then completes (it would complete without its follow-up)."""


class MissingExtra(AwaError, ImportError):
    """A feature was used whose packages are not installed. The message is one line naming
    the extra to install (``pip install 'awa-py[ui]'``); ``extra`` is its name."""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class QueueOverLimit(AwaError):
    """An insert into a queue whose depth limit has the ``reject`` policy found the queue at
    or over its limit; nothing of the insert was stored. ``queue``, ``depth`` (the depth the
    client last read, see docs/backpressure.md) and ``limit`` say which. Raised inside a
    transaction, it rolls the whole transaction back unless the caller catches it."""

    def __init__(self, queue: str, *, depth: int, limit: int) -> None:
        super().__init__(
            f"queue {queue!r} is at or over its depth limit: depth {depth}, limit {limit} "
            "(policy reject); nothing was inserted"
        )
        self.queue = queue
        self.depth = depth
        self.limit = limit


class AttemptLost(AwaError):
    """``job.finalize()`` / ``job.complete_in()`` found this attempt no longer running under
    its lease: it was rescued, cancelled or re-claimed (or already completed) before the
    completion could commit. The server has aborted the transaction, so the business writes
    made in it roll back with the completion; do not catch it in a savepoint and commit.
    ``job_id`` and ``run_lease`` name the attempt."""

    def __init__(self, job_id: int, run_lease: int) -> None:
        super().__init__(
            f"job {job_id}: the attempt with run_lease {run_lease} is no longer running "
            "(rescued, cancelled, re-claimed or completed already), so its completion and "
            "the writes of this transaction cannot commit; they are rolled back"
        )
        self.job_id = job_id
        self.run_lease = run_lease
