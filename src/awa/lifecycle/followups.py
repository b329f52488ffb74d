"""Durable follow-up jobs: specs registered per outcome and kind (``on_*_enqueue``).

A spec's closure turns the trigger's args and committed row into follow-up args (or, for the
``_with`` variants, an ``awa.EnqueueRequest`` or None). The follow-ups are inserted in the
same transaction as the transition that triggers them, so both commit or neither does; a
follow-up whose unique key is already held is skipped (a duplicate) and the transition
still commits. Maintenance rescue is the exception: its follow-ups run in a transaction of
their own after the rescue commits.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import psycopg

from awa.core.kinds import decode_args
from awa.core.tasks import cancels_this_task
from awa.errors import AwaError
from awa.lifecycle.events import RescueReason
from awa.lifecycle.hooks import is_async_callable
from awa.model import EnqueueRequest, InsertOpts, JobRow, check_name
from awa.observability import metrics
from awa.producer.insert import DEFAULT_RULES, InsertRules, PreparedJob, prepare_job, with_lineage
from awa.producer.statements import SkippingInsert, insert_skipping_duplicates_flow
from awa.storage.db import Flow, drive_async

log = logging.getLogger("awa.followups")


class Trigger(StrEnum):
    """The outcomes follow-ups can be attached to."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    RETRIED = "retried"
    EXHAUSTED = "exhausted"
    WAITING_FOR_CALLBACK = "waiting_for_callback"
    RESCUED = "rescued"


@dataclasses.dataclass(frozen=True, slots=True)
class TriggerContext:
    """The outcome-specific values a spec's closure receives after ``(args, job)``."""

    trigger: Trigger
    reason: str | RescueReason | None = None
    error: str | None = None
    attempt: int | None = None
    next_run_at: dt.datetime | None = None

    def closure_args(self) -> tuple[Any, ...]:
        match self.trigger:
            case Trigger.CANCELLED | Trigger.RESCUED:
                return (self.reason,)
            case Trigger.RETRIED:
                return (self.error, self.attempt, self.next_run_at)
            case Trigger.EXHAUSTED:
                return (self.error, self.attempt)
        return ()


class FollowUpError(AwaError):
    """A spec could not produce its follow-up: the transition is rolled back with it."""


@dataclasses.dataclass(frozen=True, slots=True)
class FollowUpSpec:
    trigger: Trigger
    kind: str
    trigger_type: type[Any] | None
    closure: Callable[..., Any]
    returns_request: bool  # the _with variant

    @property
    def name(self) -> str:
        variant = "_with" if self.returns_request else ""
        closure = getattr(self.closure, "__qualname__", repr(self.closure))
        return f"on_{self.trigger.value}_enqueue{variant} for {self.kind!r} ({closure})"

    async def request(
        self, job: JobRow, context: TriggerContext, decoded: Any = None
    ) -> EnqueueRequest[Any] | None:
        """Call the closure; the follow-up it asks for, or None for nothing. ``decoded``:
        the trigger's args already decoded (by the worker, for the handler), used when they
        are of the spec's type."""
        try:
            if decoded is not None and type(decoded) is self.trigger_type:
                args = decoded
            else:
                args = decode_args(self.trigger_type, job.args)
        except Exception as error:
            raise FollowUpError(
                f"{self.name}: the trigger's args do not decode: {error}"
            ) from error
        try:
            result = self.closure(args, job, *context.closure_args())
            if inspect.isawaitable(result):
                result = await result
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            # Anything a closure raises rolls the transition back, a BaseException subclass
            # or a CancelledError of its own included: let through, it would kill the
            # worker slot and leave the attempt heartbeating forever. Only a cancellation
            # of the attempt's task itself (shutdown) propagates.
            if cancels_this_task(error):
                raise
            raise FollowUpError(f"{self.name} raised {type(error).__name__}: {error}") from error
        if self.returns_request:
            if result is None or isinstance(result, EnqueueRequest):
                return result
            raise FollowUpError(
                f"{self.name} must return an awa.EnqueueRequest or None, "
                f"not {type(result).__name__}"
            )
        if result is None:
            raise FollowUpError(
                f"{self.name} returned None; return the follow-up's args, or use the _with "
                "variant to enqueue conditionally"
            )
        return result if isinstance(result, EnqueueRequest) else EnqueueRequest(result)


class FollowUpRegistry:
    """Specs by trigger and kind, in registration order, and the client's insert rules
    (follow-ups without ``queue=`` go to their kind's task queue)."""

    def __init__(self, rules: InsertRules = DEFAULT_RULES) -> None:
        self._specs: dict[tuple[Trigger, str], list[FollowUpSpec]] = {}
        self._kinds: set[str] = set()
        self._awaiting: set[tuple[Trigger, str]] = set()
        self.insert_rules = rules

    def add(self, spec: FollowUpSpec) -> None:
        check_name("kind", spec.kind)
        if not callable(spec.closure):
            raise TypeError(f"{spec.name}: the closure is not callable")
        self._specs.setdefault((spec.trigger, spec.kind), []).append(spec)
        self._kinds.add(spec.kind)
        if is_async_callable(spec.closure):
            self._awaiting.add((spec.trigger, spec.kind))

    def awaits(self, trigger: Trigger, kind: str) -> bool:
        """Whether a closure of these specs is ``async def`` (it may wait on something, so a
        batch runs it beside the others)."""
        return (trigger, kind) in self._awaiting

    def specs(self, trigger: Trigger, kind: str) -> list[FollowUpSpec]:
        return self._specs.get((trigger, kind), [])

    def has_kind(self, kind: str) -> bool:
        """Whether any outcome of this kind has specs (a cheap first check)."""
        return kind in self._kinds

    def has(self, trigger: Trigger, kind: str) -> bool:
        return (trigger, kind) in self._specs

    def __bool__(self) -> bool:
        return bool(self._specs)


async def prepare_follow_ups(
    specs: Sequence[FollowUpSpec],
    job: JobRow,
    context: TriggerContext,
    rules: InsertRules = DEFAULT_RULES,
    decoded: Any = None,
) -> list[PreparedJob]:
    """Run the closures in order and validate what they ask for (like any insert).
    ``decoded``: the trigger's args as its handler got them, when at hand."""
    prepared = []
    defaults = InsertOpts()
    for spec in specs:
        request = await spec.request(job, context, decoded)
        if request is None:
            continue
        try:
            follow_up = prepare_job(request, kind=None, opts=defaults, rules=rules)
        except Exception as error:
            raise FollowUpError(f"{spec.name}: invalid follow-up: {error}") from error
        if follow_up.depends_on:
            raise FollowUpError(f"{spec.name}: a follow-up cannot take depends_on")
        with_lineage(follow_up, job.id, job.kind, context.trigger.value, "follow_up")
        prepared.append(follow_up)
    return prepared


async def insert_follow_ups(
    conn: psycopg.AsyncConnection[Any],
    specs: Sequence[FollowUpSpec],
    job: JobRow,
    context: TriggerContext,
    rules: InsertRules = DEFAULT_RULES,
) -> SkippingInsert:
    """Run the specs for a committed-to-be transition and insert their follow-ups on
    ``conn`` (inside the transition's transaction). Closures see the row without its
    output: a job must not read another job's output."""
    trigger_row = dataclasses.replace(job, output=None) if job.output is not None else job
    prepared = await prepare_follow_ups(specs, trigger_row, context, rules)
    result = await drive_async(conn, follow_up_flow(prepared))
    count_follow_ups(job.kind, context.trigger, len(result.inserted), len(result.duplicates))
    return result


def count_follow_ups(kind: str, trigger: Trigger, inserted: int, duplicates: int) -> None:
    """Count the follow-ups of one transition, inserted and skipped as duplicates."""
    attributes = {metrics.KIND: kind, "awa.follow_up.trigger": trigger.value}
    metrics.count_inserted(metrics.follow_ups_committed, attributes, inserted, duplicates)


def follow_up_flow(jobs: Sequence[PreparedJob]) -> Flow[SkippingInsert]:
    """Insert follow-ups in the caller's transaction, skipping held unique keys."""
    if not jobs:
        return SkippingInsert([], [])
    return (yield from insert_skipping_duplicates_flow(jobs))
