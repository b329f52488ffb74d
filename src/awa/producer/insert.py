"""I/O-free builders for inserts: validation, routing and size rules, unique keys (the
statements that insert what they prepare are in ``awa.producer.statements``).

Everything here turns Python values into SQL text plus parameters; running them is the job of
the caller (the clients, a Transaction, or a bridged connection), so one builder serves
psycopg, asyncpg, SQLAlchemy and Django alike.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import struct
import time
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

import blake3
import orjson

from awa.core.kinds import Encoder, args_encoder, dump_json, encode_args, kind_for
from awa.errors import ValidationError
from awa.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    EnqueueRequest,
    InsertOpts,
    UniqueOpts,
    check_name,
    check_run_at,
    dependency_ids,
    to_timedelta,
)
from awa.observability.tracing import with_traceparent
from awa.producer.backpressure import DepthLimits

UNIQUE_INDEX = "jobs_unique_key_idx"

MAX_ARGS_BYTES = 1024 * 1024
"""Default limit of a job's args, serialized as JSON (UTF-8 bytes)."""

MAX_METADATA_BYTES = 256 * 1024
"""Default limit of a job's metadata, serialized as JSON (UTF-8 bytes)."""


_DEFAULTABLE = ("priority", "max_attempts", "unique", "deadline_duration")


@dataclasses.dataclass(frozen=True, slots=True)
class TaskDefaults:
    """Options a kind's task gives its jobs unless an insert sets them
    (``client.task(Args, priority=1, max_attempts=5, ...)``)."""

    priority: int | None = None
    max_attempts: int | None = None
    unique: UniqueOpts | None = None
    deadline_duration: float | dt.timedelta | None = None

    def __post_init__(self) -> None:
        # Checked like an insert's options, naming the option.
        InsertOpts(
            priority=self.priority if self.priority is not None else DEFAULT_PRIORITY,
            max_attempts=(
                self.max_attempts if self.max_attempts is not None else DEFAULT_MAX_ATTEMPTS
            ),
            unique=self.unique,
            deadline_duration=self.deadline_duration,
        ).validated()

    def apply(self, opts: InsertOpts) -> InsertOpts:
        """``opts`` with these defaults for every option it does not set itself."""
        changes = {
            name: getattr(self, name)
            for name in _DEFAULTABLE
            if name not in opts.given and getattr(self, name) is not None
        }
        return dataclasses.replace(opts, **changes) if changes else opts


@dataclasses.dataclass(frozen=True, slots=True)
class InsertRules:
    """What a client decides for every job it inserts, follow-ups and staged ones included:
    ``routes`` (kind -> the queue its task was registered on) sends a job whose insert names
    no queue to its task's queue, else ``"default"``; ``defaults`` (kind -> TaskDefaults)
    fill the options an insert leaves unset; args and metadata may not exceed
    ``max_args_bytes`` and ``max_metadata_bytes`` as JSON; ``depth_limits`` checks producer
    inserts (not follow-ups) against the queues' depth limits."""

    routes: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    max_args_bytes: int = MAX_ARGS_BYTES
    max_metadata_bytes: int = MAX_METADATA_BYTES
    defaults: Mapping[str, TaskDefaults] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    # The client's cache of the queues' depth limits (None: inserts are not checked).
    depth_limits: DepthLimits | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        for field in ("max_args_bytes", "max_metadata_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError(f"{field} must be a positive integer, got {value!r}")

    def queue_for(self, kind: str, queue: str | None) -> str:
        """The queue a job of ``kind`` goes to: the explicit ``queue``, else its task's."""
        if queue is not None:
            return queue
        return self.routes.get(kind, DEFAULT_QUEUE)


DEFAULT_RULES = InsertRules()


def check_size(field: str, text: str, limit: int) -> None:
    """Raise ValidationError when ``text`` is more than ``limit`` bytes in UTF-8."""
    if len(text) * 4 <= limit:  # no character takes more than 4 bytes: the common case
        return
    size = len(text.encode())
    if size > limit:
        raise ValidationError(
            f"{field} is {size} bytes as JSON; the limit is {limit} bytes (max_{field}_bytes "
            "of the client). Store large data elsewhere and pass a reference"
        )


def unique_key(kind: str, queue: str | None, args_json: str | None, bucket: int | None) -> bytes:
    """The 16-byte unique key: BLAKE3 of kind [0 queue] [0 canonical args] [0 bucket i64le]."""
    hasher = blake3.blake3(kind.encode())
    if queue is not None:
        hasher.update(b"\x00" + queue.encode())
    if args_json is not None:
        hasher.update(b"\x00" + args_json.encode())
    if bucket is not None:
        hasher.update(b"\x00" + struct.pack("<q", bucket))
    return hasher.digest(length=16)


def period_bucket(period_seconds: float, at: dt.datetime | None) -> int:
    """The number of the period (of the given length) that ``at`` (default: now) falls in."""
    timestamp = at.timestamp() if at is not None else time.time()
    return math.floor(timestamp / period_seconds)


@dataclasses.dataclass(slots=True)
class PreparedJob:
    """A validated job, ready for any insert path."""

    kind: str
    queue: str
    args: dict[str, Any]
    args_json: str
    priority: int
    max_attempts: int
    run_at: dt.datetime | None
    metadata_json: str
    tags: list[str]
    unique_key: bytes | None
    unique_states: int | None
    ordering_key: bytes | None
    deadline_duration: dt.timedelta | None
    concurrency_key: str | None = None
    depends_on: tuple[int, ...] | None = None
    dependency_policy: str = "cancel"

    def recordset_json(self) -> str:
        """This job as one element of the ``insert_jobs`` JSON array (built without re-encoding
        args and metadata)."""
        head = orjson.dumps(
            {
                "kind": self.kind,
                "queue": self.queue,
                "priority": self.priority,
                "max_attempts": self.max_attempts,
                "run_at": self.run_at.isoformat() if self.run_at else None,
                "tags": self.tags,
                "unique_key": self.unique_key.hex() if self.unique_key else None,
                "unique_states": self.unique_states,
                "ordering_key": self.ordering_key.hex() if self.ordering_key else None,
                "concurrency_key": self.concurrency_key,
                "deadline_seconds": (
                    self.deadline_duration.total_seconds()
                    if self.deadline_duration is not None
                    else None
                ),
            }
        ).decode()
        return f'{head[:-1]},"args":{self.args_json},"metadata":{self.metadata_json}}}'


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedOpts:
    """InsertOpts after validation and conversion, shared by every job inserted with them."""

    opts: InsertOpts
    run_at: dt.datetime | None
    metadata_json: str
    tags: list[str]
    unique: UniqueOpts | None
    ordering_key: bytes | None
    deadline_duration: dt.timedelta | None


_CHECKED: dict[tuple[Any, ...], CheckedOpts] = {}
"""Options already checked, by value (follow-up closures build equal options for every
job; checking them takes longer than looking them up)."""

_CHECKED_LIMIT = 256


def check_opts(opts: InsertOpts, rules: InsertRules = DEFAULT_RULES) -> CheckedOpts:
    """Validate options once; raises ValidationError naming the field and its limit."""
    try:
        # The types are part of the key: True == 1 would otherwise pass for a priority.
        key = (
            opts,
            type(opts.priority),
            type(opts.max_attempts),
            type(opts.deadline_duration),
            rules.max_metadata_bytes,
        )
        cached = _CHECKED.get(key)
    except TypeError:  # a list of tags, a metadata dict: not hashable, checked each time
        return _check_opts(opts, rules)
    if cached is None:
        cached = _check_opts(opts, rules)
        if len(_CHECKED) >= _CHECKED_LIMIT:
            _CHECKED.clear()
        _CHECKED[key] = cached
    return cached


def _check_opts(opts: InsertOpts, rules: InsertRules) -> CheckedOpts:
    opts.validated()
    ordering = opts.ordering_key
    metadata_json = dump_json(dict(opts.metadata) if opts.metadata else {}, "metadata")
    check_size("metadata", metadata_json, rules.max_metadata_bytes)
    return CheckedOpts(
        opts=opts,
        run_at=check_run_at(opts.run_at) if opts.run_at is not None else None,
        metadata_json=metadata_json,
        tags=list(opts.tags),
        unique=UniqueOpts.coerce(opts.unique),
        ordering_key=ordering.encode()
        if isinstance(ordering, str)
        else (bytes(ordering) if ordering is not None else None),
        deadline_duration=(
            to_timedelta(opts.deadline_duration, "deadline_duration")
            if opts.deadline_duration is not None
            else None
        ),
    )


LINEAGE = "awa:trigger"
"""Metadata key of a follow-up's lineage: ``{"id", "kind", "outcome", "via"}`` of the job
whose outcome inserted it (``via``: ``"follow_up"`` for an ``on_*_enqueue`` spec,
``"staged"`` for ``job.enqueue_on_completion``). Kept in the follow-up's own row, so the
chain survives the retention of either side."""


def with_lineage(job: PreparedJob, trigger_id: int, kind: str, outcome: str, via: str) -> None:
    """Record in ``job``'s metadata the job whose outcome inserts it."""
    entry = orjson.dumps({"id": trigger_id, "kind": kind, "outcome": outcome, "via": via})
    head = f'"{LINEAGE}":{entry.decode()}'
    metadata = job.metadata_json
    job.metadata_json = "{" + head + ("}" if metadata == "{}" else "," + metadata[1:])


def prepare_job(
    args: Any,
    *,
    kind: str | None,
    opts: InsertOpts,
    checked: CheckedOpts | None = None,
    rules: InsertRules = DEFAULT_RULES,
) -> PreparedJob:
    """Validate one job and turn it into a PreparedJob; raises ValidationError.

    ``checked`` is ``check_opts(opts)`` when the caller already has it (batches); ``rules``
    pick the queue when the options name none, and limit the sizes.
    """
    if isinstance(args, EnqueueRequest):
        kind = args.kind_override if args.kind_override is not None else kind
        request_opts = args.resolve(opts)
        if request_opts is not opts:
            checked = None
        opts = request_opts
        args = args.args
    job_kind = check_name("kind", kind_for(args, kind))
    defaults = rules.defaults.get(job_kind)
    if defaults is not None:
        with_defaults = defaults.apply(opts)
        if with_defaults is not opts:
            opts, checked = with_defaults, None
    if checked is None:
        checked = check_opts(opts, rules)
    queue = rules.queue_for(job_kind, opts.queue)
    encoder = args_encoder(type(args))
    return _prepared(job_kind, queue, args, encoder, opts, checked, rules.max_args_bytes)


def _prepared(
    job_kind: str,
    queue: str,
    args: Any,
    encoder: Encoder,
    opts: InsertOpts,
    checked: CheckedOpts,
    max_args_bytes: int,
) -> PreparedJob:
    value = encode_args(encoder, args)
    args_json = dump_json(value, "args")
    check_size("args", args_json, max_args_bytes)
    if value is args:
        # A dict passed in is the caller's: the stored row gets its own copy.
        value = orjson.loads(args_json)
    key: bytes | None = None
    states: int | None = None
    unique = checked.unique
    if unique is not None:
        period = unique.period_seconds
        key = unique_key(
            job_kind,
            queue if unique.by_queue else None,
            dump_json(value, "args", sort_keys=True) if unique.by_args else None,
            period_bucket(period, checked.run_at) if period is not None else None,
        )
        states = unique.mask
    return PreparedJob(  # positional: this runs once per job of a bulk insert
        job_kind,
        queue,
        value,
        args_json,
        opts.priority,
        opts.max_attempts,
        checked.run_at,
        with_traceparent(checked.metadata_json),
        checked.tags,
        key,
        states,
        checked.ordering_key,
        checked.deadline_duration,
        opts.concurrency_key,
        opts.depends_on,
        opts.on_dependency_failure,
    )


class InsertKwargs(TypedDict, total=False):
    """The keyword arguments every insert method accepts (see ``AsyncClient.insert``)."""

    kind: str | None
    queue: str | None
    priority: int
    max_attempts: int
    tags: Sequence[str] | None
    metadata: Mapping[str, Any] | None
    run_at: dt.datetime | None
    unique_opts: UniqueOpts | Mapping[str, Any] | None
    ordering_key: bytes | str | None
    deadline_duration: float | dt.timedelta | None
    concurrency_key: str | None
    depends_on: Iterable[Any] | None
    on_dependency_failure: str


_INSERT_KWARGS = frozenset(InsertKwargs.__annotations__)


_DEFAULT_OPTS = InsertOpts()

_SPLIT: dict[tuple[Any, ...], tuple[str | None, InsertOpts]] = {}
_SPLIT_LIMIT = 256


def split_kwargs(caller: str, kwargs: Mapping[str, Any]) -> tuple[str | None, InsertOpts]:
    """The kind and InsertOpts named by insert keyword arguments; TypeError for unknown ones."""
    if not kwargs:
        return None, _DEFAULT_OPTS
    unknown = kwargs.keys() - _INSERT_KWARGS
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword argument(s) {', '.join(sorted(unknown))}; "
            f"expected {', '.join(sorted(_INSERT_KWARGS))}"
        )
    try:
        # Handlers staging a follow-up pass the same options for every job; the types are
        # part of the key, since True == 1 must not pass for a priority.
        key = tuple((name, value, type(value)) for name, value in kwargs.items())
        found = _SPLIT.get(key)
    except TypeError:  # a list of tags, a metadata dict: not hashable
        return _split(kwargs)
    if found is None:
        found = _split(kwargs)
        if len(_SPLIT) >= _SPLIT_LIMIT:
            _SPLIT.clear()
        _SPLIT[key] = found
    return found


def _split(kwargs: Mapping[str, Any]) -> tuple[str | None, InsertOpts]:
    tags = kwargs.get("tags")
    opts = InsertOpts(
        queue=kwargs.get("queue"),
        priority=kwargs.get("priority", DEFAULT_PRIORITY),
        max_attempts=kwargs.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
        tags=() if tags is None else tags,
        metadata=kwargs.get("metadata"),
        run_at=kwargs.get("run_at"),
        unique=UniqueOpts.coerce(kwargs.get("unique_opts")),
        ordering_key=kwargs.get("ordering_key"),
        deadline_duration=kwargs.get("deadline_duration"),
        concurrency_key=kwargs.get("concurrency_key"),
        depends_on=dependency_ids(kwargs.get("depends_on")),
        on_dependency_failure=kwargs.get("on_dependency_failure", "cancel"),
        given=frozenset(_GIVEN_NAMES.get(name, name) for name in kwargs),
    )
    return kwargs.get("kind"), opts


_GIVEN_NAMES = {"unique_opts": "unique"}


class BatchPreparer:
    """Prepares the jobs of one batch: items are args, or EnqueueRequests overriding the
    shared options. The options are checked once, and the kind, queue and encoder of each
    args type are looked up once (bulk inserts prepare tens of thousands of jobs a second)."""

    def __init__(
        self, kind: str | None, opts: InsertOpts, rules: InsertRules = DEFAULT_RULES
    ) -> None:
        self._kind = kind
        self._opts = opts
        self._rules = rules
        self.checked = check_opts(opts, rules)
        self._by_type: dict[type[Any], tuple[str, str, Encoder, InsertOpts, CheckedOpts]] = {}

    def prepare(self, index: int, item: Any) -> PreparedJob:
        """Job ``index`` of the batch; a ValidationError names the index."""
        try:
            cached = self._by_type.get(type(item))
            if cached is None:
                if isinstance(item, EnqueueRequest):
                    return prepare_job(
                        item,
                        kind=self._kind,
                        opts=self._opts,
                        checked=self.checked,
                        rules=self._rules,
                    )
                job_kind = check_name("kind", kind_for(item, self._kind))
                opts, checked = self._opts, self.checked
                defaults = self._rules.defaults.get(job_kind)
                if defaults is not None and defaults.apply(opts) is not opts:
                    opts = defaults.apply(opts)
                    checked = check_opts(opts, self._rules)
                queue = self._rules.queue_for(job_kind, opts.queue)
                cached = (job_kind, queue, args_encoder(type(item)), opts, checked)
                self._by_type[type(item)] = cached
            job_kind, queue, encoder, opts, checked = cached
            limit = self._rules.max_args_bytes
            return _prepared(job_kind, queue, item, encoder, opts, checked, limit)
        except ValidationError as error:
            raise ValidationError(f"job {index}: {error}") from None

    def prepare_all(self, items: Iterable[Any]) -> list[PreparedJob]:
        return [self.prepare(index, item) for index, item in enumerate(items)]


def prepare_many(
    jobs: Iterable[Any], *, kind: str | None, opts: InsertOpts, rules: InsertRules = DEFAULT_RULES
) -> list[PreparedJob]:
    """Prepare a batch; items are args or EnqueueRequests overriding the shared options."""
    if isinstance(jobs, Mapping | str | bytes):
        raise ValidationError("insert_many() takes a list of jobs")
    return BatchPreparer(kind, opts, rules).prepare_all(jobs)


# Rows per statement when a batch goes through the INSERT path.
