"""Resolving external callbacks: complete, fail, retry, resume, resolve by CEL, heartbeat.

These functions change rows only and run on any psycopg connection, like the rest of
``awa.admin``: they fire no lifecycle hook and insert no follow-up. ``AsyncClient`` has the
same methods (``awa.callbacks.resolution``), which also run the follow-ups in the
resolution's transaction and dispatch hooks once it commits.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Literal

from awa.callbacks import cel
from awa.core.kinds import dump_json
from awa.errors import CallbackNotFound, ValidationError
from awa.model import BIGINT_MAX, JobRow, MappingAccess, check_encodable, check_int_range
from awa.outcomes import CallbackToken
from awa.sql import query
from awa.storage.db import Flow, Statement, operation

DEFAULT_TIMEOUT = 3600.0
DefaultAction = Literal["complete", "fail", "ignore"]
_ACTIONS = ("complete", "fail", "ignore")


def callback_uuid(callback_id: str | uuid.UUID | CallbackToken) -> str:
    """The callback id as a canonical UUID string; ValidationError when it is not one."""
    if isinstance(callback_id, CallbackToken):
        callback_id = callback_id.id
    if isinstance(callback_id, uuid.UUID):
        return str(callback_id)
    try:
        return str(uuid.UUID(str(callback_id)))
    except ValueError:
        shown = repr(callback_id)
        if len(shown) > 60:
            shown = f"{shown[:40]}... ({len(shown)} characters)"
        raise ValidationError(f"callback id {shown} is not a UUID") from None


def check_timeout(timeout_seconds: float) -> float:
    if (
        isinstance(timeout_seconds, bool)
        or not isinstance(timeout_seconds, int | float)
        or not 0 <= timeout_seconds <= 366 * 86400 * 100  # NaN and infinities too
    ):
        raise ValidationError(
            "timeout_seconds must be a finite, non-negative number of seconds (at most 100 years)"
        )
    return float(timeout_seconds)


def _payload(payload: Any) -> str | None:
    return None if payload is None else dump_json(payload, "payload")


def _row(rows: list[dict[str, Any]]) -> JobRow | None:
    return JobRow.from_record(rows[0]) if rows else None


def _found(row: JobRow | None, callback_id: str) -> JobRow:
    if row is None:
        raise CallbackNotFound(
            f"callback not found: {callback_id} (no parked or running job holds it: it was "
            "resolved already, replaced, timed out, or the run_lease does not match)"
        )
    return row


def _lease(run_lease: int | None) -> int | None:
    if run_lease is None:
        return None
    if isinstance(run_lease, bool) or not isinstance(run_lease, int):
        raise ValidationError("run_lease must be an integer")
    return check_int_range("run_lease", run_lease, 0, BIGINT_MAX)  # a bigint column


# Resolution flows, shared by awa.admin and AsyncClient ------------------------------------


def complete_flow(
    callback_id: str | uuid.UUID | CallbackToken, payload: Any = None, run_lease: int | None = None
) -> Flow[JobRow]:
    cb = callback_uuid(callback_id)
    params = {"callback_id": cb, "payload": _payload(payload), "lease": _lease(run_lease)}
    row = yield Statement(query("complete_callback"), params, _row)
    return _found(row, cb)


def fail_flow(
    callback_id: str | uuid.UUID | CallbackToken,
    error: str,
    run_lease: int | None = None,
    expression: str | None = None,
) -> Flow[JobRow]:
    cb = callback_uuid(callback_id)
    if not isinstance(error, str) or "\x00" in error:
        raise ValidationError("error must be a string without NUL bytes")
    check_encodable("error", error)
    params = {
        "callback_id": cb,
        "error": error,
        "expression": expression,
        "lease": _lease(run_lease),
    }
    row = yield Statement(query("fail_callback"), params, _row)
    return _found(row, cb)


@dataclasses.dataclass(frozen=True, slots=True)
class RetriedCallback:
    job: JobRow
    parked_attempt: int


def retry_flow(
    callback_id: str | uuid.UUID | CallbackToken, run_lease: int | None = None
) -> Flow[RetriedCallback]:
    cb = callback_uuid(callback_id)
    params = {"callback_id": cb, "lease": _lease(run_lease)}
    rows: list[dict[str, Any]] = yield Statement(query("retry_callback"), params, list)
    if not rows:
        _found(None, cb)
    return RetriedCallback(JobRow.from_record(rows[0]), int(rows[0]["parked_attempt"]))


def resume_flow(
    callback_id: str | uuid.UUID | CallbackToken, payload: Any = None, run_lease: int | None = None
) -> Flow[JobRow]:
    cb = callback_uuid(callback_id)
    params = {"callback_id": cb, "payload": _payload(payload), "lease": _lease(run_lease)}
    row = yield Statement(query("resume_callback"), params, _row)
    return _found(row, cb)


def heartbeat_flow(
    callback_id: str | uuid.UUID | CallbackToken, timeout_seconds: float = DEFAULT_TIMEOUT
) -> Flow[JobRow]:
    cb = callback_uuid(callback_id)
    params = {"callback_id": cb, "timeout_seconds": check_timeout(timeout_seconds)}
    row = yield Statement(query("heartbeat_callback"), params, _row)
    return _found(row, cb)


@dataclasses.dataclass(frozen=True, slots=True)
class ResolveResult(MappingAccess):
    """What ``resolve_callback`` did: ``outcome`` is "completed" (``payload`` is the
    transformed payload), "failed", or "ignored" (``reason`` says why; the job is untouched
    and ``job`` is None)."""

    outcome: Literal["completed", "failed", "ignored"]
    job: JobRow | None
    payload: Any = None
    reason: str | None = None

    def is_completed(self) -> bool:
        return self.outcome == "completed"

    def is_failed(self) -> bool:
        return self.outcome == "failed"

    def is_ignored(self) -> bool:
        return self.outcome == "ignored"


def resolve_flow(
    callback_id: str | uuid.UUID | CallbackToken,
    payload: Any = None,
    default_action: DefaultAction = "ignore",
    run_lease: int | None = None,
) -> Flow[ResolveResult]:
    """Decide with the callback's CEL expressions, then complete, fail or ignore. Run it in
    a transaction: the row stays locked between the decision and the transition."""
    if default_action not in _ACTIONS:
        raise ValidationError(
            f"default_action must be one of {', '.join(_ACTIONS)}, not {default_action!r}"
        )
    cb = callback_uuid(callback_id)
    lease = _lease(run_lease)
    locked = yield Statement(query("lock_callback"), {"callback_id": cb, "lease": lease}, _row)
    job = _found(locked, cb)
    decision = cel.decide(
        payload,
        default_action,
        filter=job.callback_filter,
        on_complete=job.callback_on_complete,
        on_fail=job.callback_on_fail,
        transform=job.callback_transform,
    )
    if decision.action == "ignore":
        return ResolveResult("ignored", None, reason=decision.reason)
    if decision.action == "complete":
        row = yield from complete_flow(cb, decision.payload, lease)
        return ResolveResult("completed", row, payload=decision.payload)
    assert decision.error is not None
    row = yield from fail_flow(cb, decision.error, lease, decision.expression)
    return ResolveResult("failed", row)


# The same as admin operations (no hooks, no follow-ups) -----------------------------------


@operation
def complete_external(
    callback_id: str | uuid.UUID | CallbackToken, payload: Any = None, run_lease: int | None = None
) -> Flow[JobRow]:
    """Complete the job holding the callback (parked or still running); the payload, if
    any, becomes its output. CallbackNotFound when no job holds it."""
    return complete_flow(callback_id, payload, run_lease)


@operation
def fail_external(
    callback_id: str | uuid.UUID | CallbackToken, error: str, run_lease: int | None = None
) -> Flow[JobRow]:
    """Fail the job holding the callback, with ``error`` in its history."""
    return fail_flow(callback_id, error, run_lease)


@operation
def retry_external(
    callback_id: str | uuid.UUID | CallbackToken, run_lease: int | None = None
) -> Flow[JobRow]:
    """Run a parked job again, from a fresh attempt budget."""
    return _retried_job(callback_id, run_lease)


def _retried_job(
    callback_id: str | uuid.UUID | CallbackToken, run_lease: int | None
) -> Flow[JobRow]:
    retried = yield from retry_flow(callback_id, run_lease)
    return retried.job


@operation
def resume_external(
    callback_id: str | uuid.UUID | CallbackToken, payload: Any = None, run_lease: int | None = None
) -> Flow[JobRow]:
    """Hand ``payload`` to the job: a handler waiting in ``wait_for_callback`` receives it;
    a parked job runs again and finds it in ``job.callback_result``."""
    return resume_flow(callback_id, payload, run_lease)


@operation
def heartbeat_callback(
    callback_id: str | uuid.UUID | CallbackToken, timeout_seconds: float = DEFAULT_TIMEOUT
) -> Flow[JobRow]:
    """Push a parked job's callback timeout to ``timeout_seconds`` from now."""
    return heartbeat_flow(callback_id, timeout_seconds)


@operation
def resolve_callback(
    callback_id: str | uuid.UUID | CallbackToken,
    payload: Any = None,
    default_action: DefaultAction = "ignore",
    run_lease: int | None = None,
) -> Flow[ResolveResult]:
    """Complete, fail or ignore by the callback's CEL expressions (see ``awa.callbacks.cel``)."""
    return resolve_flow(callback_id, payload, default_action, run_lease)
