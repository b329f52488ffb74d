"""The reference package's storage-engine calls, answered for awa's one engine.

awa-pg has two engines (its first, "canonical", and "queue_storage", installed into a schema
of its own and switched to through a staged transition). awa has one: the storage of
migration 12 (``awa.active_jobs``, ``awa.held_jobs``, ``awa.done_jobs`` behind the
``awa.jobs`` view, in the schema ``awa``), which does what the reference's queue storage is
for: claims that do not walk dead rows, finished jobs leaving by whole slots. So:

- ``storage_status()`` reports that engine as ``queue_storage``, active and finalized, with
  the reference's keys and awa's own (``schema``, ``migration_version``, ``installed``);
- ``install_queue_storage()`` and ``prepare_queue_storage_schema()`` check their arguments as
  the reference does and that the schema is migrated, and have nothing to build: the
  migrations built it. ``install_queue_storage(reset=True)`` empties it as the reference
  does, by dropping the schema and migrating again (every job, schedule and setting goes);
- ``awa.active_queue_storage_schema()`` (SQL, migration 13) answers ``awa``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from awa.errors import ArgumentTypeError, ValidationError
from awa.sql import query
from awa.storage.db import Flow, Statement, operation
from awa.storage.migrations import check_version, schema_version_flow

DEFAULT_QUEUE_STORAGE_SCHEMA = "awa"
DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT = 16
DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT = 8
DEFAULT_QUEUE_STORAGE_CLAIM_SLOT_COUNT = 8
DEFAULT_QUEUE_STORAGE_QUEUE_STRIPE_COUNT = 1

ENGINE = "queue_storage"
"""The reference's name of the engine awa's storage stands for."""

RUNNING_ERROR = "cannot install queue storage while the worker runtime is running"

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def check_storage_options(
    schema: object, queue_slot_count: object, lease_slot_count: object, reset: object = False
) -> None:
    """The reference's checks of ``install_queue_storage`` / ``prepare_queue_storage_schema``
    arguments, and awa's: the storage lives in the schema ``awa`` only."""
    if not isinstance(schema, str):
        raise ArgumentTypeError(f"schema must be a string, not {type(schema).__name__}")
    queue_slots = _count("queue_slot_count", queue_slot_count)
    lease_slots = _count("lease_slot_count", lease_slot_count)
    if not isinstance(reset, bool):
        raise ArgumentTypeError("reset must be True or False")
    if queue_slots < 4:
        raise ValidationError("queue storage requires at least 4 queue slots")
    if lease_slots < 2:
        raise ValidationError("queue storage requires at least 2 lease slots")
    if not _IDENTIFIER.fullmatch(schema):
        shown = schema if len(schema) <= 80 else f"{schema[:60]}... ({len(schema)} characters)"
        raise ValidationError(
            f"invalid SQL identifier: {shown if shown.isprintable() else repr(shown)}"
        )
    if schema != DEFAULT_QUEUE_STORAGE_SCHEMA:
        raise ValidationError(
            f"awa keeps its job storage in the schema {DEFAULT_QUEUE_STORAGE_SCHEMA!r} (one "
            f"engine, built by the migrations): it cannot be installed in {schema!r}"
        )
    if (queue_slots, lease_slots) != (
        DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    ):
        raise ValidationError(
            "the default `awa` queue-storage schema must use the default slot counts "
            f"(queue_slot_count={DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT}, "
            f"lease_slot_count={DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT})"
        )


def _count(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{field} must be an integer, not {type(value).__name__}")
    return value


@operation
def check_installed() -> Flow[None]:
    """SchemaNotMigrated unless the schema (and with it the storage) is at this version."""
    check_version((yield from schema_version_flow()))


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def status_report(row: dict[str, Any]) -> dict[str, Any]:
    """The reference's status keys, for awa's engine, then awa's own keys."""
    live = int(row["live_runtimes"])
    entered = _iso(row["entered_at"])
    one_engine = "awa has one storage engine: there is no transition to make"
    return {
        "current_engine": ENGINE,
        "active_engine": ENGINE,
        "prepared_engine": None,
        "state": "active",
        "transition_epoch": 0,
        "details": {
            "schema": row["schema"],
            "tables": ["awa.active_jobs", "awa.held_jobs", "awa.done_jobs"],
            "read_model": "awa.jobs",
        },
        "entered_at": entered,
        "updated_at": _iso(row["updated_at"]),
        "finalized_at": entered,
        "canonical_live_backlog": 0,
        "prepared_queue_storage_schema": row["schema"],
        "prepared_schema_ready": bool(row["ready"]),
        "live_runtime_capability_counts": {ENGINE: live} if live else {},
        "can_enter_mixed_transition": False,
        "enter_mixed_transition_blockers": ["state is 'active' (expected 'prepared')", one_engine],
        "can_finalize": False,
        "finalize_blockers": ["state is 'active' (expected 'mixed_transition')", one_engine],
        "engine": "awa",
        "schema": row["schema"],
        "migration_version": row["migration_version"],
        "installed": bool(row["ready"]),
    }


@operation
def storage_status() -> Statement[str]:
    """The storage report as pretty JSON (the reference's ``storage_status()`` shape)."""

    def decode(rows: list[dict[str, Any]]) -> str:
        return json.dumps(status_report(rows[0]), indent=2)

    return Statement(query("storage_status"), None, decode)


def _nothing(rows: list[Any]) -> None:
    return None


@operation
def flush_admin_metadata() -> Flow[None]:
    """Bring the maintenance leader's admin caches up to date now: fold the count rows of
    completed jobs and take a queue sample (``awa.queue_samples``, behind the queue gauges
    and the UI's throughput), for when no leader runs. ``queue_stats`` counts live."""
    yield Statement(query("fold_done_counts"), None, _nothing)
    yield Statement(query("queue_samples_store"), None, _nothing)
