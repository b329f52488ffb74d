"""Job states, job rows, insert options and their validation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Generic, TypeVar, cast

from awa.errors import ValidationError

MAX_NAME_LENGTH = 200
MAX_TAGS = 20
MIN_PRIORITY, MAX_PRIORITY = 1, 4
MIN_MAX_ATTEMPTS, MAX_MAX_ATTEMPTS = 1, 1000
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 2
DEFAULT_MAX_ATTEMPTS = 25

# Column ranges: job ids and run leases are bigint; limits stored per queue are integer.
BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
# Rows one list call returns at most (list_jobs, list_dlq, list_batch_operations).
MAX_LIST_LIMIT = 1000
# Job ids one call takes at most (wait_many, depends_on, retry_failed(ids=), ...).
MAX_IDS = 10_000


DEPENDENCY_POLICIES = ("cancel", "run", "wait")


def dependency_ids(value: object) -> tuple[int, ...] | None:
    """``depends_on`` as job ids: a list of ids or rows (anything with an ``id``), each a
    job id (1 to 2**63 - 1), at most ``MAX_IDS`` of them."""
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise ValidationError("depends_on must be a list of jobs or job ids")
    ids = []
    for item in cast(Iterable[object], value):
        job_id = getattr(item, "id", item)
        if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= BIGINT_MAX:
            raise ValidationError(
                f"depends_on: {short_repr(item)} is neither a job nor a job id (an integer from 1 "
                f"to {BIGINT_MAX})"
            )
        ids.append(job_id)
        if len(ids) > MAX_IDS:
            raise ValidationError(f"depends_on names more than {MAX_IDS} jobs")
    if not ids:
        return None
    return tuple(dict.fromkeys(ids))


def short_repr(value: object) -> str:
    """``repr`` of a bad value, cut to a readable length for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


class MappingAccess:
    """``row["id"]`` besides ``row.id`` (the reference package's rows are dicts), plus
    ``get`` and ``keys``; a name that is not a field raises KeyError."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key.startswith("_"):
            raise KeyError(key)
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self) -> list[str]:
        return [field.name for field in dataclasses.fields(self)]  # type: ignore[arg-type]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.keys()


class JobState(StrEnum):
    """The eight states of a job; ``str(state)`` is the name stored in the database."""

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    RETRYABLE = "retryable"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING_EXTERNAL = "waiting_external"
    # Waiting for the jobs it depends on (``depends_on``): never claimed until released.
    BLOCKED = "blocked"
    # The reference package's spellings of the same members (aliases, not new states).
    Scheduled = "scheduled"
    Available = "available"
    Running = "running"
    Completed = "completed"
    Retryable = "retryable"
    Failed = "failed"
    Cancelled = "cancelled"
    WaitingExternal = "waiting_external"
    Blocked = "blocked"

    def __repr__(self) -> str:  # the reference package's spelling: JobState.WaitingExternal
        return "JobState." + self.value.title().replace("_", "")

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def bit(self) -> int:
        """Position of this state in a unique-states mask (matches ``awa.state_bit``)."""
        return _BITS[self]


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
_BITS = {state: index for index, state in enumerate(JobState)}
# A blocked job waits to run: it holds its unique key exactly as a scheduled one does.
_BITS[JobState.BLOCKED] = _BITS[JobState.SCHEDULED]
TERMINAL_STATES: frozenset[JobState] = _TERMINAL

DEFAULT_UNIQUE_STATES: frozenset[JobState] = frozenset(
    {
        JobState.SCHEDULED,
        JobState.AVAILABLE,
        JobState.RUNNING,
        JobState.COMPLETED,
        JobState.RETRYABLE,
    }
)


def parse_state(value: JobState | str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        names = ", ".join(state.value for state in JobState)
        raise ValidationError(
            f"unknown job state {short_repr(value)}; expected one of: {names}"
        ) from None


@dataclasses.dataclass(frozen=True, slots=True)
class UniqueOpts:
    """How an insert is deduplicated.

    The unique key covers the kind, plus the args (``by_args``), the queue (``by_queue``) and
    the time period the job is scheduled in (``by_period``, a period length: two jobs whose
    run_at, or insert time, fall in the same period collide). A job holds its key while its
    state is in ``states``; leaving those states frees the key.
    """

    by_args: bool = True
    by_queue: bool = False
    by_period: float | dt.timedelta | None = None
    states: frozenset[JobState] = DEFAULT_UNIQUE_STATES

    def __post_init__(self) -> None:
        if self.by_period is not None:
            seconds = seconds_of(self.by_period, "unique_opts.by_period")
            if seconds <= 0:
                raise ValidationError("unique_opts.by_period must be a positive period length")
        states: object = self.states
        if isinstance(states, bool | str | bytes) or not isinstance(states, int | Iterable):
            raise ValidationError(
                "unique_opts.states must be a set of job states or a bitmask, not "
                f"{type(states).__name__}"
            )
        if isinstance(states, int):
            states = _states_from_mask(states)
        object.__setattr__(
            self, "states", frozenset(parse_state(s) for s in cast(Iterable[Any], states))
        )

    @property
    def period_seconds(self) -> float | None:
        if self.by_period is None:
            return None
        return seconds_of(self.by_period, "unique_opts.by_period")

    @property
    def mask(self) -> int:
        mask = 0
        for state in self.states:
            mask |= 1 << state.bit
        return mask

    @classmethod
    def coerce(cls, value: UniqueOpts | Mapping[str, Any] | None) -> UniqueOpts | None:
        """Accept a UniqueOpts, a dict of its fields (``{}`` means the defaults) or None."""
        if value is None or isinstance(value, UniqueOpts):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(
                f"unique_opts must be a dict or awa.UniqueOpts, not {type(value).__name__}"
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValidationError(
                f"unique_opts has unknown key(s) {unknown}; expected {sorted(known)}"
            )
        return cls(**dict(value))


def _states_from_mask(mask: int) -> frozenset[JobState]:
    if not 0 <= mask <= 255:
        raise ValidationError("unique_opts.states bitmask must be between 0 and 255")
    # Blocked shares scheduled's bit: a mask names the eight states of the reference.
    return frozenset(
        state for state in JobState if state is not JobState.BLOCKED and mask & (1 << state.bit)
    )


def seconds_of(value: float | dt.timedelta, field: str) -> float:
    """A duration as seconds; ValidationError for anything but a finite number or a
    timedelta."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(
            f"{field} must be a finite number of seconds, not {type(value).__name__}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ValidationError(f"{field} must be a finite number of seconds, got {value!r}")
    return seconds


# Longest duration an option may give. Far beyond any real deadline, and far inside what a
# Postgres interval (and now() plus it) can hold: make_interval() silently wraps around to
# a negative interval past ~292,000 years, and timedelta itself stops at 999,999,999 days.
MAX_DURATION = dt.timedelta(days=36525)


def to_timedelta(value: float | dt.timedelta, field: str) -> dt.timedelta:
    seconds = seconds_of(value, field)
    if seconds < 0:
        raise ValidationError(f"{field} must not be negative")
    if seconds > MAX_DURATION.total_seconds():
        raise ValidationError(
            f"{field} is {seconds:g} seconds; the limit is {MAX_DURATION.days} days (100 years)"
        )
    return dt.timedelta(seconds=seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class InsertOpts:
    """Every per-job option of an insert, with the defaults of ``insert()``. ``queue=None``
    sends the job to the queue its kind's task was registered on, else ``"default"``."""

    queue: str | None = None
    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] | None = None
    run_at: dt.datetime | None = None
    unique: UniqueOpts | None = None
    ordering_key: bytes | str | None = None
    deadline_duration: float | dt.timedelta | None = None
    concurrency_key: str | None = None
    # The jobs (ids) this one waits for, and what it does when one of them ends failed or
    # cancelled: "cancel" (with its own dependents), "run" anyway, or "wait" for an operator.
    depends_on: tuple[int, ...] | None = None
    on_dependency_failure: str = "cancel"
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)
    """The options the caller set explicitly; the others may take the defaults of the
    kind's task (``client.task(..., priority=...)``). Not part of equality."""

    def validated(self) -> InsertOpts:
        """Check every option against its limit; returns self or raises ValidationError."""
        if self.queue is not None:
            check_name("queue", self.queue)
        check_int_range("priority", self.priority, MIN_PRIORITY, MAX_PRIORITY)
        check_int_range("max_attempts", self.max_attempts, MIN_MAX_ATTEMPTS, MAX_MAX_ATTEMPTS)
        check_tags(self.tags)
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise ValidationError(f"metadata must be a dict, not {type(self.metadata).__name__}")
        if self.run_at is not None:
            check_run_at(self.run_at)
        if self.unique is not None and not isinstance(self.unique, UniqueOpts):
            raise ValidationError("unique must be an awa.UniqueOpts")
        if self.ordering_key is not None and not isinstance(
            self.ordering_key, bytes | bytearray | str
        ):
            raise ValidationError("ordering_key must be bytes or str")
        if isinstance(self.ordering_key, str):
            check_encodable("ordering_key", self.ordering_key)
        if self.deadline_duration is not None:
            to_timedelta(self.deadline_duration, "deadline_duration")
        if self.concurrency_key is not None:
            check_name("concurrency_key", self.concurrency_key)
        if self.on_dependency_failure not in DEPENDENCY_POLICIES:
            raise ValidationError(
                f"on_dependency_failure must be one of {', '.join(DEPENDENCY_POLICIES)}, "
                f"not {self.on_dependency_failure!r}"
            )
        if self.depends_on is not None:
            unique = self.unique
            if (
                unique is not None
                and (unique.mask >> _BITS[JobState.SCHEDULED]) & 1
                != (unique.mask >> _BITS[JobState.AVAILABLE]) & 1
            ):
                raise ValidationError(
                    "a job with depends_on waits blocked, then runs: its unique_opts states "
                    "must include both scheduled and available, or neither"
                )
        return self


def check_name(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string, not {type(value).__name__}")
    if not value:
        raise ValidationError(f"{field} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise ValidationError(
            f"{field} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if "\x00" in value:
        raise ValidationError(f"{field} contains a NUL byte, which Postgres cannot store")
    check_encodable(field, value)
    return value


def check_encodable(field: str, value: str) -> None:
    """Raise ValidationError when ``value`` holds a lone surrogate (``"\\ud800"``): such a
    string has no UTF-8 form, so the database could not store it."""
    if value.isascii():
        return
    try:
        value.encode()
    except UnicodeEncodeError as error:
        bad = value[error.start]
        raise ValidationError(
            f"{field} contains a lone surrogate ({bad!r} at position {error.start}), which is "
            "not valid text and cannot be stored"
        ) from None


def check_int_range(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{field} must be an integer, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValidationError(f"{field} must be between {low} and {high}, got {value}")
    return value


def check_tags(tags: object) -> list[str]:
    if isinstance(tags, str | bytes) or not isinstance(tags, Iterable):
        raise ValidationError("tags must be a list of strings")
    items = list(cast(Iterable[object], tags))
    if len(items) > MAX_TAGS:
        raise ValidationError(f"{len(items)} tags given; the limit is {MAX_TAGS}")
    for tag in items:
        if not isinstance(tag, str):
            raise ValidationError(f"tags must be strings, got {type(tag).__name__}")
        if "\x00" in tag:
            raise ValidationError(f"tag {tag!r} contains a NUL byte, which Postgres cannot store")
        check_encodable("tag", tag)
    return cast(list[str], items)


def check_run_at(value: object) -> dt.datetime:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(
                f"run_at {value!r} is not an ISO 8601 timestamp within years 1-9999"
            ) from None
    if not isinstance(value, dt.datetime):
        raise ValidationError(
            f"run_at must be a timezone-aware datetime, not {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError("run_at must be timezone-aware (naive datetimes are ambiguous)")
    try:
        value.astimezone(dt.UTC)
    except OverflowError:
        raise ValidationError("run_at must fall within years 1-9999 in UTC") from None
    return value


_UNSET: Any = object()

_RESOLVED: dict[tuple[Any, ...], InsertOpts] = {}
_RESOLVED_LIMIT = 256
A = TypeVar("A")


class EnqueueRequest(Generic[A]):
    """Job args plus the options to insert them with.

    Each setter returns a new request, so requests can be shared and chained::

        awa.EnqueueRequest(WelcomeEmail(user_id=1)).queue("email").priority(1)

    ``with_opts`` replaces every option set before it.
    """

    __slots__ = ("_args", "_kind", "_opts")

    def __init__(self, args: A, *, kind: str | None = None) -> None:
        self._args = args
        self._kind = kind
        self._opts: dict[str, Any] = {}

    @property
    def args(self) -> A:
        return self._args

    @property
    def kind_override(self) -> str | None:
        return self._kind

    def _with(self, **changes: Any) -> EnqueueRequest[A]:
        copy: EnqueueRequest[A] = EnqueueRequest(self._args, kind=self._kind)
        copy._opts = {**self._opts, **changes}
        return copy

    def queue(self, queue: str) -> EnqueueRequest[A]:
        return self._with(queue=queue)

    def priority(self, priority: int) -> EnqueueRequest[A]:
        return self._with(priority=priority)

    def max_attempts(self, max_attempts: int) -> EnqueueRequest[A]:
        return self._with(max_attempts=max_attempts)

    def metadata(self, metadata: Mapping[str, Any]) -> EnqueueRequest[A]:
        return self._with(metadata=metadata)

    def tags(self, tags: Sequence[str]) -> EnqueueRequest[A]:
        return self._with(tags=tags)

    def unique(
        self, unique_opts: UniqueOpts | Mapping[str, Any] | None = _UNSET
    ) -> EnqueueRequest[A]:
        """Deduplicate by unique key; with no argument, the default UniqueOpts()."""
        opts = UniqueOpts() if unique_opts is _UNSET else UniqueOpts.coerce(unique_opts)
        return self._with(unique=opts)

    def run_at(self, run_at: dt.datetime) -> EnqueueRequest[A]:
        return self._with(run_at=run_at)

    def deadline_duration(self, duration: float | dt.timedelta) -> EnqueueRequest[A]:
        return self._with(deadline_duration=duration)

    def ordering_key(self, key: bytes | str) -> EnqueueRequest[A]:
        return self._with(ordering_key=key)

    def concurrency_key(self, key: str) -> EnqueueRequest[A]:
        return self._with(concurrency_key=key)

    def with_opts(self, opts: InsertOpts) -> EnqueueRequest[A]:
        """Replace every option, including ones set earlier in the chain."""
        if not isinstance(opts, InsertOpts):
            raise ValidationError("with_opts() takes an awa.InsertOpts")
        copy: EnqueueRequest[A] = EnqueueRequest(self._args, kind=self._kind)
        copy._opts = {field.name: getattr(opts, field.name) for field in dataclasses.fields(opts)}
        return copy

    def resolve(self, defaults: InsertOpts) -> InsertOpts:
        """The options this request inserts with, over the given defaults."""
        if not self._opts:
            return defaults
        changes = {**self._opts, "given": defaults.given | frozenset(self._opts)}
        try:
            # Follow-up closures build equal requests for every job: reuse the options. The
            # types are part of the key, since True == 1 must not pass for a priority.
            key = (
                defaults,
                defaults.given,
                *((name, value, type(value)) for name, value in self._opts.items()),
            )
            resolved = _RESOLVED.get(key)
        except TypeError:  # a list of tags, a metadata dict: not hashable
            return dataclasses.replace(defaults, **changes)
        if resolved is None:
            resolved = dataclasses.replace(defaults, **changes)
            if len(_RESOLVED) >= _RESOLVED_LIMIT:
                _RESOLVED.clear()
            _RESOLVED[key] = resolved
        return resolved

    def __repr__(self) -> str:
        opts = ", ".join(f"{key}={value!r}" for key, value in self._opts.items())
        return f"EnqueueRequest({self._args!r}{', ' + opts if opts else ''})"


@dataclasses.dataclass(slots=True)
class JobRow(MappingAccess):
    """A snapshot of one job row as committed in the database (a plain record: changing it
    changes nothing in the database)."""

    id: int
    kind: str
    queue: str
    args: Any
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    run_lease: int
    run_at: dt.datetime
    created_at: dt.datetime
    attempted_at: dt.datetime | None
    finalized_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    deadline_at: dt.datetime | None
    deadline_duration: dt.timedelta | None
    errors: list[dict[str, Any]]
    metadata: dict[str, Any]
    tags: list[str]
    unique_key: bytes | None
    unique_states: int | None
    ordering_key: bytes | None
    callback_id: str | None
    callback_timeout_at: dt.datetime | None
    callback_filter: str | None
    callback_on_complete: str | None
    callback_on_fail: str | None
    callback_transform: str | None
    progress: dict[str, Any] | None
    output: Any
    callback_in_handler: bool = False
    concurrency_key: str | None = None
    # Some job depends on this one (depends_on): its final state settles them. The rows a
    # worker builds from its claim (the Completed events of batched completions) say False.
    has_dependents: bool = False
    # The workflow or batch the job belongs to (a UUID string); rows built from a claim say
    # None (the job's metadata names its workflow under "awa:workflow").
    workflow_id: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> JobRow:
        """Build from a row of ``awa.jobs`` fetched with a dict row factory."""
        values = {name: record[name] for name in _REQUIRED_FIELDS}
        for name, default in _OPTIONAL_FIELDS:
            values[name] = record.get(name, default)
        values["state"] = JobState(values["state"])
        for name in ("callback_id", "workflow_id"):
            if values[name] is not None:
                values[name] = str(values[name])
        for name in ("unique_key", "ordering_key"):
            if values[name] is not None:
                values[name] = bytes(values[name])
        return cls(**values)

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> list[JobRow]:
        """``from_record`` of each row (a Statement's decoder)."""
        return [cls.from_record(record) for record in records]

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> JobRow:
        """Build from a row whose columns are in the order of this class's fields."""
        row = cls(*values)
        row.state = JobState(row.state)
        if row.callback_id is not None:
            row.callback_id = str(row.callback_id)
        if row.unique_key is not None:
            row.unique_key = bytes(row.unique_key)
        if row.ordering_key is not None:
            row.ordering_key = bytes(row.ordering_key)
        return row

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @property
    def deadline(self) -> dt.datetime | None:
        """``deadline_at`` under the reference package's name (None: not running)."""
        return self.deadline_at

    def __repr__(self) -> str:
        return (
            f"JobRow(id={self.id}, kind={self.kind!r}, queue={self.queue!r}, "
            f"state={self.state.value}, attempt={self.attempt}/{self.max_attempts})"
        )


_JOB_ROW_FIELDS = tuple(field.name for field in dataclasses.fields(JobRow))
_REQUIRED_FIELDS = tuple(
    field.name for field in dataclasses.fields(JobRow) if field.default is dataclasses.MISSING
)
_OPTIONAL_FIELDS = tuple(
    (field.name, field.default)
    for field in dataclasses.fields(JobRow)
    if field.default is not dataclasses.MISSING
)
