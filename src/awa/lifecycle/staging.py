"""What a handler leaves for its completion: staged follow-ups and the job's output.

``job.enqueue_on_completion()`` validates a follow-up at once (everything an insert would
check) and keeps it in a per-attempt buffer; the follow-ups are inserted in the completion's
transaction, after the registered ``Completed`` specs, and only if the attempt completes.
``job.record_output()`` keeps a JSON value that the completion stores on the row.

The buffer is created on first use, so a job that stages nothing and records no output
costs nothing. Staging closes (is sealed) when the handler returns: the runtime marks the
job sealed, then freezes the buffer under a lock, so a thread that the handler started
either gets its follow-up in before the freeze or a StagingError saying the stage is sealed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
import pydantic
import pydantic_core

from awa.core.kinds import dump_json
from awa.errors import StagingError, ValidationError
from awa.model import InsertOpts
from awa.producer.insert import InsertRules, PreparedJob, prepare_job, split_kwargs, with_lineage

MAX_STAGED_FOLLOW_UPS = 16
"""Follow-ups one attempt may stage."""

MAX_STAGED_BYTES = 64 * 1024
"""Serialized size one attempt's staged follow-ups may reach: kind, queue, args, metadata,
tags and ordering key, in UTF-8 bytes."""

MAX_OUTPUT_BYTES = 1024 * 1024
"""Largest output (as JSON, in UTF-8 bytes) ``job.record_output()`` accepts."""

# Guards appends to every buffer against the freeze that seals it (staging is rare, so one
# lock for the process costs nothing).
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class StagedFollowUp:
    """A follow-up staged by a handler with ``job.enqueue_on_completion()``.

    ``args`` is the object as given; ``opts`` the insert options it resolved to. The other
    attributes are what the insert will write (``json_args`` is the args as stored).
    """

    args: Any
    opts: InsertOpts
    prepared: PreparedJob = dataclasses.field(repr=False)

    @property
    def kind(self) -> str:
        return self.prepared.kind

    @property
    def queue(self) -> str:
        return self.prepared.queue

    @property
    def priority(self) -> int:
        return self.prepared.priority

    @property
    def max_attempts(self) -> int:
        return self.prepared.max_attempts

    @property
    def run_at(self) -> dt.datetime | None:
        return self.prepared.run_at

    @property
    def tags(self) -> list[str]:
        return list(self.prepared.tags)

    @property
    def metadata(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.prepared.metadata_json)
        return value

    @property
    def json_args(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.prepared.args_json)  # the caller's own copy
        return value

    @property
    def unique_key(self) -> bytes | None:
        return self.prepared.unique_key

    @property
    def size(self) -> int:
        """The bytes this follow-up counts against ``MAX_STAGED_BYTES``."""
        return staged_size(self.prepared)


class AttemptBuffer:
    """One attempt's staged follow-ups, its output, and the first staging failure."""

    __slots__ = ("error", "output", "output_json", "size", "staged")

    def __init__(self) -> None:
        self.staged: list[StagedFollowUp] = []
        self.size = 0
        self.error: str | None = None
        self.output: Any = None
        self.output_json: str | None = None

    def discard(self) -> int:
        """Drop the follow-ups and the output (the attempt did not complete); returns the
        number of follow-ups dropped."""
        dropped = len(self.staged)
        self.staged = []
        self.size = 0
        self.output = self.output_json = None
        return dropped

    def prepared(self, trigger_id: int, kind: str) -> list[PreparedJob]:
        """The staged jobs to insert, each naming the completed job in its lineage."""
        jobs = []
        for item in self.staged:
            job = dataclasses.replace(item.prepared)
            with_lineage(job, trigger_id, kind, "completed", "staged")
            jobs.append(job)
        return jobs


class StagingJob(Protocol):
    """What staging needs of an ``awa.Job``: its id, its buffer, whether the handler has
    returned, and the client's insert rules."""

    id: int
    _extras: AttemptBuffer | None
    _sealed: bool

    def _insert_rules(self) -> InsertRules: ...


def staged_size(job: PreparedJob) -> int:
    size = len(job.kind.encode()) + len(job.queue.encode())
    size += len(job.args_json.encode()) + len(job.metadata_json.encode())
    size += sum(len(tag.encode()) for tag in job.tags)
    size += len(job.concurrency_key.encode()) if job.concurrency_key is not None else 0
    return size + (len(job.ordering_key) if job.ordering_key is not None else 0)


def _buffer(job: StagingJob) -> AttemptBuffer:
    """The job's buffer, created under the lock; raises StagingError once sealed.

    The buffer is attached before ``_sealed`` is read: the runtime sets ``_sealed`` before
    it looks for a buffer, so either it sees this buffer (and freezes it under the lock) or
    this call sees the seal."""
    with _lock:
        buffer = job._extras
        if buffer is None:
            buffer = job._extras = AttemptBuffer()
        if job._sealed:
            raise _sealed_error(job)
        return buffer


def _sealed_error(job: StagingJob) -> StagingError:
    return StagingError(
        f"job {job.id}: the stage is sealed: its handler already returned or wrote its "
        "completion (job.finalize(), job.complete_in()), so nothing can be staged or "
        "recorded for this attempt any more (await the task that does it before returning)"
    )


def _fail(buffer: AttemptBuffer, message: str) -> StagingError:
    with _lock:
        if buffer.error is None:
            buffer.error = message
    return StagingError(message)


def stage(job: StagingJob, args: Any, kwargs: Mapping[str, Any]) -> StagedFollowUp:
    """Validate a follow-up and add it to the job's buffer (``enqueue_on_completion``)."""
    buffer = _buffer(job)
    try:
        kind, opts = split_kwargs("enqueue_on_completion", kwargs)
        if opts.depends_on:
            raise ValidationError("a staged follow-up cannot take depends_on")
        prepared = prepare_job(args, kind=kind, opts=opts, rules=job._insert_rules())
    except Exception as error:
        raise _fail(buffer, f"cannot stage the follow-up: {error}") from error
    size = staged_size(prepared)
    item = StagedFollowUp(args, opts, prepared)
    with _lock:
        if job._sealed:
            raise _sealed_error(job)
        if len(buffer.staged) >= MAX_STAGED_FOLLOW_UPS:
            failure = (
                f"cannot stage the follow-up: an attempt may stage at most "
                f"{MAX_STAGED_FOLLOW_UPS} follow-ups (MAX_STAGED_FOLLOW_UPS); larger fan-out "
                "belongs in a dedicated fan-out job"
            )
        elif buffer.size + size > MAX_STAGED_BYTES:
            failure = (
                f"cannot stage the follow-up: it is {size} bytes and {buffer.size} are staged "
                f"already; the limit is {MAX_STAGED_BYTES} bytes per attempt (MAX_STAGED_BYTES)"
            )
        else:
            buffer.staged.append(item)
            buffer.size += size
            return item
        if buffer.error is None:
            buffer.error = failure
    raise StagingError(failure)


def record_output(job: StagingJob, value: Any) -> None:
    """Keep ``value`` (JSON) as the output the job's completion stores; None clears it."""
    buffer = _buffer(job)
    if value is None:
        text = None
    else:
        try:
            jsonable = pydantic_core.to_jsonable_python(value)
        except (pydantic_core.PydanticSerializationError, pydantic.PydanticSchemaGenerationError):
            raise ValidationError(
                f"output cannot be converted to JSON: {type(value).__name__} is not a JSON "
                "value, dataclass or pydantic model"
            ) from None
        text = dump_json(jsonable, "output")
        size = len(text.encode())
        if size > MAX_OUTPUT_BYTES:
            raise ValidationError(
                f"output is {size} bytes as JSON; the limit is {MAX_OUTPUT_BYTES} bytes "
                "(MAX_OUTPUT_BYTES). Store large results elsewhere and record a reference"
            )
        value = orjson.loads(text)
    with _lock:
        buffer.output = value
        buffer.output_json = text


def freeze(job: StagingJob) -> AttemptBuffer | None:
    """Seal staging and return the buffer (None: nothing was staged or recorded).

    Called once the handler has returned; appends still in progress on other threads finish
    first (they hold the lock), later ones see the seal."""
    job._sealed = True
    buffer = job._extras
    if buffer is None:
        return None
    with _lock:
        return buffer


def output_json(job: StagingJob) -> str | None:
    """The output a completion of ``job`` stores, as JSON text (None: no output)."""
    buffer = job._extras
    return buffer.output_json if buffer is not None else None
