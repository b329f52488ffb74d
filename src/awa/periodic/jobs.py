"""When periodic jobs fire: cron expressions (validation, next fires), and the declared
periodic job (``PeriodicJob``, ``define_periodic``).

An expression has 5 fields (minute hour day-of-month month day-of-week), 6 with seconds
first (``"*/10 * * * * *"``: every 10 seconds), or is an alias (``@hourly``, ``@daily``,
``@weekly``, ``@monthly``, ``@yearly``). Fires follow wall-clock time in the schedule's time
zone (``zoneinfo``). Across daylight-saving changes:

- a wall-clock time that does not exist that day (the clock jumps over it) fires at the
  first instant after the jump: a 02:30 daily job in Europe/Berlin fires at 03:00 on the
  spring-forward day; several such times fire once;
- a wall-clock time that happens twice (the clock is set back) fires once, at its first
  occurrence: the same job fires once on the fall-back day. A schedule that fires every few
  minutes or seconds in such a zone pauses while the hour repeats; give it
  ``timezone="UTC"`` (the default) when it should run at a steady rate.

Every fire is an instant in UTC (a timezone-aware ``datetime``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import zoneinfo
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from croniter import CroniterBadDateError, CroniterError, croniter

from awa.core.kinds import derive_kind
from awa.errors import ValidationError
from awa.model import InsertOpts, check_name
from awa.producer.insert import InsertRules, PreparedJob, prepare_job

MISSED_FIRE_POLICIES = ("coalesce", "catch_up")
"""``coalesce``: after downtime (or a pause), enqueue only the latest missed fire;
``catch_up``: enqueue every missed fire, in order."""

MAX_CATCH_UP = 1000
"""Missed fires one evaluation enqueues at most (the next evaluation goes on)."""

MAX_CRON_LENGTH = 500
"""Characters a cron expression may have."""

FIRE_SEARCH_YEARS = 50
"""How far ahead croniter looks for a fire before it gives up (its own bound)."""


_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)


def check_cron(expression: object) -> str:
    """The expression, stripped; ValidationError naming it when it is not a valid 5-field or
    6-field (seconds first) cron expression or alias."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValidationError(
            f"invalid cron expression: {_shown(expression)} (expected a non-empty string)"
        )
    if len(expression) > MAX_CRON_LENGTH:
        raise ValidationError(
            f"invalid cron expression: {_shown(expression)} is {len(expression)} characters "
            f"long; the limit is {MAX_CRON_LENGTH}"
        )
    text = " ".join(expression.split())
    fields = text.split(" ")
    if len(fields) == 1 and text.lower() in _ALIASES:
        return text.lower()
    if len(fields) not in (5, 6) or not croniter.is_valid(
        text, second_at_beginning=len(fields) == 6
    ):
        raise ValidationError(
            f"invalid cron expression: {expression!r} (expected 5 fields, minute hour "
            "day-of-month month day-of-week, or 6 with seconds first, or an alias such as "
            "@daily)"
        )
    return text


def check_timezone(name: object) -> zoneinfo.ZoneInfo:
    """The zone of an IANA name (one of ``zoneinfo.available_timezones()``: not a file
    path, nor ``posix/...`` or ``right/...``); ValidationError naming it otherwise."""
    if not isinstance(name, str) or not name:
        raise ValidationError(
            f"invalid timezone: {_shown(name)} (expected an IANA name such as UTC)"
        )
    if name not in _iana_names():
        raise ValidationError(
            f"invalid timezone: {_shown(name)} is not a known IANA time zone "
            "(e.g. UTC, Europe/Berlin)"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as error:
        raise ValidationError(
            f"invalid timezone: {_shown(name)} cannot be loaded ({error})"
        ) from None


@functools.cache
def _iana_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters so that an error stays readable."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... (cut)"


def check_policy(policy: object) -> str:
    if policy not in MISSED_FIRE_POLICIES:
        raise ValidationError(
            f"invalid cron missed fire policy {policy!r}: expected 'coalesce' or 'catch_up'"
        )
    return str(policy)


@dataclasses.dataclass(frozen=True, slots=True)
class CronTimes:
    """When one expression fires in one zone."""

    expression: str
    zone: zoneinfo.ZoneInfo

    @classmethod
    def of(cls, expression: str, timezone: str) -> CronTimes:
        return cls(check_cron(expression), check_timezone(timezone))

    def first_fire(self, after: dt.datetime) -> dt.datetime:
        """``next_fire(after)``, or ValidationError when the expression never fires: no
        time in the next ``FIRE_SEARCH_YEARS`` years matches it (30 February, 31 April)."""
        try:
            return self.next_fire(after)
        except CroniterError as error:
            raise self.no_fire(error) from None

    def no_fire(self, error: CroniterError) -> ValidationError:
        """The ValidationError saying why croniter found no fire."""
        if isinstance(error, CroniterBadDateError):
            return ValidationError(
                f"cron expression {self.expression!r} never fires: no time in the next "
                f"{FIRE_SEARCH_YEARS} years matches it (such as a day its months do not have: "
                "30 February, 31 April)"
            )
        return ValidationError(f"cron expression {self.expression!r} cannot be evaluated: {error}")

    def _iterate(self, start: dt.datetime, *, backwards: bool = False) -> croniter:
        seconds = len(self.expression.split(" ")) == 6
        return croniter(
            self.expression,
            start,
            ret_type=dt.datetime,
            second_at_beginning=seconds,
            is_prev=backwards,
        )

    def _wall(self, instant: dt.datetime) -> dt.datetime:
        return instant.astimezone(self.zone).replace(tzinfo=None, fold=0)

    def instant(self, wall: dt.datetime) -> dt.datetime:
        """The instant a wall-clock time (naive) fires at (see the module docstring)."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(dt.UTC)
        if self._wall(first) == wall:
            return first  # exists (and, when it repeats, this is its first occurrence)
        # It does not exist: the first instant whose wall-clock time is later. The clock
        # jumped over it between the two readings of the wall time.
        low = wall.replace(tzinfo=self.zone, fold=1).astimezone(dt.UTC)
        high = first
        if low > high:
            low, high = high, low
        while high - low > dt.timedelta(seconds=1):
            middle = low + (high - low) / 2
            if self._wall(middle) >= wall:
                high = middle
            else:
                low = middle
        return high.replace(microsecond=0)

    def next_fire(self, after: dt.datetime) -> dt.datetime:
        """The first fire strictly after the instant ``after``. (Wall-clock times before
        ``after``'s fire earlier; a repeated one, after ``after``'s, fires at its first
        occurrence, which may lie before ``after``: the loop passes over those.)"""
        times = self._iterate(self._wall(after))
        while True:
            fire = self.instant(times.get_next(dt.datetime))
            if fire > after:
                return fire

    def fires(self, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
        """Every fire in ``(after, until]``, in order."""
        fire = self.next_fire(after)
        while fire <= until:
            yield fire
            fire = self.next_fire(fire)

    def latest_fire(self, after: dt.datetime, until: dt.datetime) -> dt.datetime | None:
        """The last fire in ``(after, until]``, or None."""
        local = until.astimezone(self.zone)
        start = local.replace(tzinfo=None, fold=0) + dt.timedelta(seconds=1)
        if local.fold == 1:
            # The hour repeats and ``until`` is in its second pass: the wall-clock times up to
            # the end of the repeated hour already fired, in the first pass.
            first = local.replace(fold=0).utcoffset()
            second = local.utcoffset()
            if first is not None and second is not None:
                start += first - second
        times = self._iterate(start, backwards=True)
        while True:
            fire = self.instant(times.get_prev(dt.datetime))
            if fire <= after:
                return None
            if fire <= until:
                return fire


def next_fire_of(expression: str, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first fire after ``after`` of a stored schedule; ValidationError says why there is
    none (an expression or zone this version refuses, one that never fires)."""
    return CronTimes.of(expression, timezone).first_fire(after)


def failure_text(error: Exception) -> str:
    """Why a stored schedule cannot fire, in one line: a ValidationError's own words, any
    other error (a stored value no check foresaw) with its type."""
    if isinstance(error, ValidationError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def due_fires(
    times: CronTimes, policy: str, after: dt.datetime, now: dt.datetime
) -> list[dt.datetime]:
    """The fires to enqueue now, of a schedule last fired (or registered) at ``after``:
    with ``coalesce`` the latest one due, with ``catch_up`` every one due, at most
    ``MAX_CATCH_UP``. ValidationError when the expression never fires."""
    try:
        if policy == "coalesce":
            latest = times.latest_fire(after, now)
            return [latest] if latest is not None else []
        due = []
        for fire in times.fires(after, now):
            due.append(fire)
            if len(due) >= MAX_CATCH_UP:
                break
        return due
    except CroniterError as error:
        raise times.no_fire(error) from None


@dataclasses.dataclass(frozen=True, slots=True)
class PeriodicJob:
    """A schedule declared with ``client.periodic()``, stored when the client starts.
    ``queue`` None follows the kind's task, like an insert without ``queue=``."""

    name: str
    times: CronTimes
    policy: str
    job: PreparedJob
    queue: str | None

    @property
    def timezone(self) -> str:
        return self.times.zone.key

    def upsert_params(self, rules: InsertRules) -> dict[str, Any]:
        job = self.job
        return {
            "name": self.name,
            "cron_expr": self.times.expression,
            "timezone": self.timezone,
            "kind": job.kind,
            "queue": rules.queue_for(job.kind, self.queue),
            "args": job.args_json,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "tags": job.tags,
            "metadata": job.metadata_json,
            "policy": self.policy,
        }


def define_periodic(
    name: str,
    cron_expr: str,
    args_type: type[Any] | None,
    args: Any,
    *,
    timezone: str,
    queue: str | None,
    priority: int,
    max_attempts: int,
    tags: Sequence[str] | None,
    metadata: Mapping[str, Any] | None,
    missed_fire_policy: str,
    rules: InsertRules,
) -> PeriodicJob:
    """Validate a ``periodic()`` declaration; ValidationError names the schedule and what
    is wrong with it."""
    check_name("periodic job name", name)
    try:
        times = CronTimes.of(cron_expr, timezone)
        times.first_fire(dt.datetime.now(dt.UTC))
        policy = check_policy(missed_fire_policy)
        opts = InsertOpts(
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            tags=_tags(tags),
            metadata=metadata,
        )
        job = prepare_job(args, kind=_kind(args_type, args), opts=opts, rules=rules)
    except ValidationError as error:
        raise ValidationError(f"periodic job {name!r}: {error}") from None
    return PeriodicJob(name, times, policy, job, queue)


def _kind(args_type: object, args: object) -> str | None:
    if args_type is None:
        return None
    if not isinstance(args_type, type):
        raise ValidationError(f"args_type must be a class, not {_shown(args_type)}")
    if not isinstance(args, args_type):
        raise ValidationError(
            f"args must be an instance of {args_type.__name__}, not {type(args).__name__}"
        )
    return derive_kind(args_type.__name__)


def _tags(tags: object) -> tuple[str, ...]:
    if tags is None:
        return ()
    if isinstance(tags, str | bytes) or not isinstance(tags, Iterable):
        raise ValidationError(f"tags must be a list of strings, not {type(tags).__name__}")
    return tuple(tags)  # each is checked as an insert's tags are
