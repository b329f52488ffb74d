"""Durable batch operations: change many queued jobs at once, carried out by the leader.

An operation sets the priority of the jobs a filter matches (``set_priority``), or moves
them to another queue (``move_queue``, optionally with a new priority). Submitting records
it in ``awa.batch.operations``; the maintenance leader then snapshots the matching jobs (a
page of ids per step) and changes them a chunk per step, counting ``processed`` (changed)
and ``skipped`` (no longer queued, or already as asked) as it goes, across restarts and
failover. Cancelling stops it at its next step; what it changed stays changed.

Only queued jobs are touched: ``available`` and ``scheduled``. Running, parked and finished
jobs never are, and neither are ``retryable`` ones (they wait out a backoff after a failure;
submit again once they are available, or make them available first with ``run_now``).

Each function takes a psycopg ``Connection`` (and blocks) or ``AsyncConnection`` (and
returns a coroutine); the clients have the same methods. Records are plain dicts with the
reference package's keys (``BatchOperation``); timestamps are RFC 3339 strings in UTC.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, cast, get_args

from awa.core.arguments import check_limit, check_text, uuid_from
from awa.core.kinds import dump_json
from awa.errors import ArgumentTypeError, ValidationError
from awa.model import (
    MAX_IDS,
    MAX_LIST_LIMIT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    JobRow,
    JobState,
    check_name,
    check_run_at,
    parse_state,
)
from awa.sql import query
from awa.storage.db import Flow, Statement, operation

__all__ = [
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationPreview",
    "BatchOperationState",
    "cancel_batch_operation",
    "get_batch_operation",
    "list_batch_operations",
    "preview_batch_operation",
    "purge_batch_operations",
    "submit_batch_operation",
]

BatchOperationKind = Literal["set_priority", "move_queue"]
BatchOperationState = Literal[
    "pending", "scanning", "running", "cancelling", "completed", "cancelled", "failed"
]


class BatchOperationFilter(TypedDict, total=False):
    """Which queued jobs an operation touches (every key given must match)."""

    kind: str
    queue: str
    ids: list[int]
    tag: str
    state: str
    created_at_gte: dt.datetime | str
    created_at_lt: dt.datetime | str


class BatchOperationPreview(TypedDict, total=False):
    """How many queued jobs a filter matches now, and the first ``PREVIEW_SAMPLE`` (by id)
    as dicts of their columns."""

    total_matched: int
    sample: list[dict[str, Any]]


class BatchOperation(TypedDict, total=False):
    """One operation's record. ``state`` goes pending -> scanning -> running -> completed
    (or cancelling -> cancelled, or failed); ``total_matched`` counts the snapshot as it is
    scanned, ``processed`` the jobs changed, ``skipped`` those left alone, ``errored`` those
    a failure left undone (``last_error`` says why)."""

    id: str
    op_kind: str
    filter: dict[str, Any]
    spec: dict[str, Any]
    state: str
    submitted_by: str | None
    submitted_at: str
    started_at: str | None
    finalized_at: str | None
    cursor: dict[str, Any] | None
    total_matched: int | None
    processed: int
    skipped: int
    errored: int
    last_error: str | None
    runner_instance: str | None
    retention_until: str | None
    updated_at: str


OP_KINDS: tuple[str, ...] = get_args(BatchOperationKind)
STATES: tuple[str, ...] = get_args(BatchOperationState)
QUEUED = (JobState.AVAILABLE, JobState.SCHEDULED)
PREVIEW_SAMPLE = 10
MAX_PURGE_LIMIT = 10_000
_FILTER_KEYS = tuple(BatchOperationFilter.__annotations__)


# Specs and filters ------------------------------------------------------------------------


def _required(spec: Mapping[str, Any], key: str) -> Any:
    value = spec.get(key)
    if value is None:
        raise ValidationError(f"batch operation spec missing {key!r}")
    return value


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(
            f"batch operation priority must be an int, not {type(value).__name__}"
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValidationError(f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}")
    return value


def parse_spec(op_kind: object, spec: object) -> dict[str, Any]:
    """The stored spec of an operation: ``{"op_kind": ..., "priority": ...}`` or
    ``{"op_kind": "move_queue", "queue": ..., "priority": ... or None}``."""
    if not isinstance(spec, Mapping):
        raise ArgumentTypeError("batch operation spec must be a dict")
    if op_kind not in OP_KINDS:
        raise ValidationError(f"unknown batch operation kind: {op_kind}")
    if op_kind == "set_priority":
        return {"op_kind": op_kind, "priority": _priority(_required(spec, "priority"))}
    queue = _required(spec, "queue")
    if not isinstance(queue, str):
        raise ArgumentTypeError(f"batch operation queue must be a str, not {type(queue).__name__}")
    if not queue or len(queue) > 200:
        raise ValidationError("destination queue must be 1 to 200 characters")
    check_name("destination queue", queue)
    priority = spec.get("priority")
    return {
        "op_kind": op_kind,
        "queue": queue,
        "priority": _priority(priority) if priority is not None else None,
    }


def _timestamp(key: str, value: object) -> dt.datetime:
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError as error:
            raise ValidationError(f"invalid RFC3339 timestamp: {error}") from None
    if not isinstance(value, dt.datetime):
        raise ArgumentTypeError(f"filter {key} must be a datetime or an RFC 3339 string")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"filter {key} must be timezone-aware")
    return value.astimezone(dt.UTC)


def _ids(value: object) -> list[int]:
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError("filter ids must be a list of ints")
    ids = list(cast(Any, value))
    for job_id in ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise ArgumentTypeError(f"filter ids must be ints, not {type(job_id).__name__}")
        if not 0 < job_id < 2**63:
            raise ValidationError(f"filter ids must be job ids (positive integers), got {job_id}")
    if len(set(ids)) > MAX_IDS:
        raise ValidationError(f"filter ids holds {len(set(ids))} job ids; the limit is {MAX_IDS}")
    return ids


def _filter_text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"filter {key} must be a str, not {type(value).__name__}")
    return check_name(key, value)


def parse_filter(value: object, op_kind: str) -> dict[str, Any]:
    """The stored filter: every key, None when unset (timestamps as RFC 3339 strings)."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ArgumentTypeError("batch operation filter must be a dict or None")
    # An ignored misspelt key would widen the operation: refuse it.
    unknown = sorted(str(key) for key in value if key not in _FILTER_KEYS)
    if unknown:
        raise ValidationError(
            f"unknown batch operation filter key(s) {unknown}; expected {list(_FILTER_KEYS)}"
        )
    given = {key: item for key, item in value.items() if item is not None}
    result: dict[str, Any] = dict.fromkeys(_FILTER_KEYS)
    for key in ("kind", "queue", "tag"):
        if key in given:
            result[key] = _filter_text(key, given[key])
    if "ids" in given:
        result["ids"] = _ids(given["ids"])
    if "state" in given:
        state = parse_state(given["state"])
        if state not in QUEUED:
            raise ValidationError(f"{op_kind} only supports available or scheduled state filters")
        result["state"] = state.value
    for key in ("created_at_gte", "created_at_lt"):
        if key in given:
            result[key] = _rfc3339(_timestamp(key, given[key]))
    return result


def filter_params(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Bind parameters of a stored filter (the leader reads them back from the record)."""
    params: dict[str, Any] = {key: stored.get(key) for key in _FILTER_KEYS}
    for key in ("created_at_gte", "created_at_lt"):
        if params[key] is not None:
            params[key] = dt.datetime.fromisoformat(str(params[key]))
    return params


def spec_params(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Bind parameters of a stored spec: the new priority and queue (None: unchanged)."""
    return {"priority": stored.get("priority"), "queue": stored.get("queue")}


def _operation_id(value: object) -> uuid.UUID:
    return uuid_from(
        value,
        lambda type_name: ArgumentTypeError(f"batch operation id must be a str, not {type_name}"),
        lambda error, shown: ValidationError(f"invalid batch operation id: {error}: {shown}"),
    )


# Records ----------------------------------------------------------------------------------


def _rfc3339(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return _rfc3339(value)
    if isinstance(value, JobState):
        return value.value
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def operation_record(row: Mapping[str, Any]) -> BatchOperation:
    """A row of ``awa.batch.operations`` as the reference package's dict."""
    return cast(BatchOperation, {key: _jsonable(item) for key, item in row.items()})


def job_dict(row: JobRow) -> dict[str, Any]:
    """A job as a plain dict of its columns (timestamps as RFC 3339 strings)."""
    return {field.name: _jsonable(getattr(row, field.name)) for field in dataclasses.fields(row)}


def _one(rows: list[dict[str, Any]]) -> BatchOperation | None:
    return operation_record(rows[0]) if rows else None


def _records(rows: list[dict[str, Any]]) -> list[BatchOperation]:
    return [operation_record(row) for row in rows]


# Operations -------------------------------------------------------------------------------


def _preview(rows: list[dict[str, Any]]) -> BatchOperationPreview:
    count = int(rows[0]["matched"]) if rows else 0
    sample = [job_dict(JobRow.from_record(row)) for row in rows]
    return BatchOperationPreview(total_matched=count, sample=sample)


def _preview_flow(params: dict[str, Any]) -> Flow[BatchOperationPreview]:
    limited = {**params, "limit": PREVIEW_SAMPLE}
    preview: BatchOperationPreview = yield Statement(query("batch_preview"), limited, _preview)
    return preview


@operation
def preview_batch_operation(
    op_kind: BatchOperationKind,
    *,
    spec: Mapping[str, Any],
    filter: BatchOperationFilter | Mapping[str, Any] | None = None,
) -> Flow[BatchOperationPreview]:
    """How many queued jobs the operation would touch now, and the first few of them;
    changes nothing. Raises as ``submit_batch_operation`` does (an empty filter allowed)."""
    parsed = parse_spec(op_kind, spec)
    return _preview_flow(filter_params(parse_filter(filter, parsed["op_kind"])))


@operation
def submit_batch_operation(
    op_kind: BatchOperationKind,
    *,
    spec: Mapping[str, Any],
    filter: BatchOperationFilter | Mapping[str, Any] | None = None,
    submitted_by: str | None = None,
    allow_all: bool = False,
) -> Statement[BatchOperation]:
    """Record an operation for the maintenance leader to carry out; returns its record
    (state ``pending``). ``op_kind`` ``"set_priority"`` takes ``spec={"priority": 1-4}``,
    ``"move_queue"`` takes ``spec={"queue": name, "priority": optional}``. The filter keys
    are ``kind``, ``queue``, ``ids``, ``tag``, ``state`` (available or scheduled),
    ``created_at_gte`` and ``created_at_lt``; without any, pass ``allow_all=True``.

    ValidationError: unknown kind, a value out of range, no filter; TypeError: a spec or
    filter of the wrong type; a missing spec key is a ValidationError (a ValueError)."""
    parsed = parse_spec(op_kind, spec)
    stored = parse_filter(filter, parsed["op_kind"])
    if all(item is None for item in stored.values()) and not allow_all:
        raise ValidationError("batch operation requires a filter or allow_all=true")
    if submitted_by is not None:
        if not isinstance(submitted_by, str):
            raise ArgumentTypeError("submitted_by must be a str")
        check_text("submitted_by", submitted_by)
    params = {
        "id": uuid.uuid4(),
        "op_kind": parsed["op_kind"],
        "filter": dump_json(stored, "filter"),
        "spec": dump_json(parsed, "spec"),
        "submitted_by": submitted_by,
    }
    return Statement(query("batch_submit"), params, lambda rows: operation_record(rows[0]))


@operation
def list_batch_operations(
    *, state: BatchOperationState | None = None, limit: int = 100
) -> Statement[list[BatchOperation]]:
    """Operations, newest first; ``state`` keeps those in it; ``limit`` 1 to 1000
    (ValidationError outside)."""
    if state is not None and state not in STATES:
        raise ValidationError(f"unknown batch operation state: {state}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentTypeError(f"limit must be an int, not {type(limit).__name__}")
    params = {"state": state, "limit": check_limit("limit", limit, MAX_LIST_LIMIT)}
    return Statement(query("batch_list"), params, _records)


def _found(operation_id: uuid.UUID) -> Callable[[list[dict[str, Any]]], BatchOperation]:
    def decode(rows: list[dict[str, Any]]) -> BatchOperation:
        if not rows:
            raise ValidationError(f"batch operation not found: {operation_id}")
        return operation_record(rows[0])

    return decode


@operation
def get_batch_operation(operation_id: str | uuid.UUID) -> Statement[BatchOperation]:
    """One operation's record; ValidationError when there is none with this id."""
    op_id = _operation_id(operation_id)
    return Statement(query("batch_get"), {"id": op_id}, _found(op_id))


def _cancel_flow(op_id: uuid.UUID) -> Flow[BatchOperation]:
    cancelled: BatchOperation | None = yield Statement(query("batch_cancel"), {"id": op_id}, _one)
    if cancelled is not None:
        return cancelled
    current: BatchOperation = yield Statement(query("batch_get"), {"id": op_id}, _found(op_id))
    raise ValidationError(
        f"batch operation cannot be cancelled: {op_id} (it is {current.get('state')})"
    )


@operation
def cancel_batch_operation(operation_id: str | uuid.UUID) -> Flow[BatchOperation]:
    """Ask the leader to stop an unfinished operation: it goes ``cancelling`` now and
    ``cancelled`` at its next step (jobs it changed stay changed). ValidationError when it
    is unknown or already finished."""
    return _cancel_flow(_operation_id(operation_id))


@operation
def purge_batch_operations(before: dt.datetime, *, limit: int = 1000) -> Statement[int]:
    """Delete up to ``limit`` (1 to 10,000) finished operations finalized before ``before``;
    returns how many. (The leader also deletes them 90 days after they finish.)"""
    if not isinstance(before, dt.datetime):
        raise ArgumentTypeError("before must be a datetime")
    if before.tzinfo is None or before.utcoffset() is None:
        raise ValidationError("before must be timezone-aware")
    try:
        check_run_at(before)
    except ValidationError:
        raise ValidationError("before must fall within years 1-9999 in UTC") from None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentTypeError(f"limit must be an int, not {type(limit).__name__}")
    params = {"before": before, "limit": check_limit("limit", limit, MAX_PURGE_LIMIT)}
    return Statement(query("batch_purge"), params, lambda rows: int(rows[0]["count"]))
