"""Hostile input through ``awa.admin`` on a blocking and an asyncio psycopg connection: every
bad value of every argument is refused with a ValidationError naming the argument before
any SQL runs, so the caller's transaction stays usable and every awa table is unchanged.

``ADMIN_ROWS`` has one row per argument (helpers_hostile.Row); a new argument gets its
cases by adding a row."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
from typing import Any

import psycopg
import pytest

import awa
from awa import admin
from helpers_hostile import (
    ID_LISTS,
    IDS,
    LEASES,
    LIMITS,
    NAMES,
    PRIORITIES,
    SECONDS,
    TEXT,
    Row,
    assert_names,
    cases,
    row,
    snapshot,
)
from jobs_helpers import Conn, maybe_await, set_state

CALLBACK = "00000000-0000-0000-0000-000000000001"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclasses.dataclass
class Note:
    text: str = "x"


def _listing_rows(name: str) -> list[Row]:
    """The rows of a listing of awa.admin that takes a ``queue`` and a ``limit``."""
    listing = getattr(admin, name)
    return [
        row(f"{name}.queue", "queue", NAMES, lambda c, v: listing(c, v)),
        row(f"{name}.limit", "limit", LIMITS, lambda c, v: listing(c, limit=v)),
    ]


ADMIN_ROWS: list[Row] = [
    row("get_job", "job id", IDS, lambda c, v: admin.get_job(c, v)),
    row("cancel", "job id", IDS, lambda c, v: admin.cancel(c, v)),
    row("retry", "job id", IDS, lambda c, v: admin.retry(c, v)),
    row("discard", "job id", IDS, lambda c, v: admin.discard(c, v)),
    row("run_now", "job id", IDS, lambda c, v: admin.run_now(c, v)),
    row("list_jobs.limit", "limit", LIMITS, lambda c, v: admin.list_jobs(c, limit=v)),
    row("list_jobs.kind", "kind", NAMES, lambda c, v: admin.list_jobs(c, kind=v)),
    row("list_jobs.queue", "queue", NAMES, lambda c, v: admin.list_jobs(c, queue=v)),
    row("retry_failed.ids", "ids", ID_LISTS, lambda c, v: admin.retry_failed(c, ids=v)),
    row("retry_failed.kind", "kind", NAMES, lambda c, v: admin.retry_failed(c, kind=v)),
    row("retry_failed.queue", "queue", NAMES, lambda c, v: admin.retry_failed(c, queue=v)),
    row("discard_failed.ids", "ids", ID_LISTS, lambda c, v: admin.discard_failed(c, ids=v)),
    row("discard_failed.kind", "kind", NAMES, lambda c, v: admin.discard_failed(c, v)),
    row("cancel_by_unique_key.kind", "kind", NAMES, lambda c, v: admin.cancel_by_unique_key(c, v)),
    row(
        "cancel_by_unique_key.queue",
        "queue",
        NAMES,
        lambda c, v: admin.cancel_by_unique_key(c, "k", queue=v),
    ),
    row(
        "cancel_by_unique_key.period_bucket",
        "period_bucket",
        IDS,
        lambda c, v: admin.cancel_by_unique_key(c, "k", period_bucket=v),
        skip=["zero", "negative"],
    ),
    row("pause_queue.queue", "queue", NAMES, lambda c, v: admin.pause_queue(c, v)),
    row(
        "pause_queue.paused_by",
        "paused_by",
        TEXT,
        lambda c, v: admin.pause_queue(c, "q", paused_by=v),
    ),
    row("queue_known.queue", "queue", NAMES, lambda c, v: admin.queue_known(c, v)),
    row(
        "set_queue_overrides.queue",
        "queue",
        NAMES,
        lambda c, v: admin.set_queue_overrides(c, v, poll_interval=1),
    ),
    row(
        "set_queue_overrides.changed_by",
        "changed_by",
        TEXT,
        lambda c, v: admin.set_queue_overrides(c, "q", poll_interval=1, changed_by=v),
    ),
    row("clear_queue_overrides.queue", "queue", NAMES, admin.clear_queue_overrides),
    row(
        "clear_queue_overrides.changed_by",
        "changed_by",
        TEXT,
        lambda c, v: admin.clear_queue_overrides(c, "q", changed_by=v),
    ),
    row(
        "set_queue_depth_limit.queue",
        "queue",
        NAMES,
        lambda c, v: admin.set_queue_depth_limit(c, v, 10),
    ),
    row("clear_queue_depth_limit.queue", "queue", NAMES, admin.clear_queue_depth_limit),
    *_listing_rows("list_queue_overrides"),
    *_listing_rows("queue_override_log"),
    row("resume_queue.queue", "queue", NAMES, lambda c, v: admin.resume_queue(c, v)),
    row(
        "pause_cron_job.paused_by",
        "paused_by",
        TEXT,
        lambda c, v: admin.pause_cron_job(c, "nightly", paused_by=v),
    ),
    row("drain_queue.queue", "queue", NAMES, lambda c, v: admin.drain_queue(c, v)),
    row("get_dlq_job", "job id", IDS, lambda c, v: admin.get_dlq_job(c, v)),
    row("list_dlq.limit", "limit", LIMITS, lambda c, v: admin.list_dlq(c, limit=v)),
    row("list_dlq.before_id", "before_id", IDS, lambda c, v: admin.list_dlq(c, before_id=v)),
    row("list_dlq.kind", "kind", NAMES, lambda c, v: admin.list_dlq(c, kind=v)),
    row("list_dlq.queue", "queue", NAMES, lambda c, v: admin.list_dlq(c, queue=v)),
    row(
        "list_dlq.tag",
        "tag",
        NAMES,
        lambda c, v: admin.list_dlq(c, tag=v),
        skip=["empty", "10000-chars"],
    ),
    row("purge_dlq.kind", "kind", NAMES, lambda c, v: admin.purge_dlq(c, kind=v)),
    row("purge_dlq.queue", "queue", NAMES, lambda c, v: admin.purge_dlq(c, queue=v)),
    row(
        "purge_dlq.tag",
        "tag",
        NAMES,
        lambda c, v: admin.purge_dlq(c, tag=v),
        skip=["empty", "10000-chars"],
    ),
    row(
        "purge_dlq.before_id",
        "before_id",
        IDS,
        lambda c, v: admin.purge_dlq(c, queue="q", before_id=v),
    ),
    row(
        "bulk_retry_from_dlq.kind", "kind", NAMES, lambda c, v: admin.bulk_retry_from_dlq(c, kind=v)
    ),
    row(
        "bulk_retry_from_dlq.queue",
        "queue",
        NAMES,
        lambda c, v: admin.bulk_retry_from_dlq(c, queue=v),
    ),
    row(
        "bulk_retry_from_dlq.tag",
        "tag",
        NAMES,
        lambda c, v: admin.bulk_retry_from_dlq(c, tag=v),
        skip=["empty", "10000-chars"],
    ),
    row(
        "bulk_move_failed_to_dlq.kind",
        "kind",
        NAMES,
        lambda c, v: admin.bulk_move_failed_to_dlq(c, kind=v),
    ),
    row(
        "bulk_move_failed_to_dlq.queue",
        "queue",
        NAMES,
        lambda c, v: admin.bulk_move_failed_to_dlq(c, queue=v),
    ),
    row(
        "bulk_move_failed_to_dlq.reason",
        "reason",
        NAMES,
        lambda c, v: admin.bulk_move_failed_to_dlq(c, queue="q", reason=v),
    ),
    row("retry_from_dlq", "job id", IDS, lambda c, v: admin.retry_from_dlq(c, v)),
    row("retry_from_dlq.queue", "queue", NAMES, lambda c, v: admin.retry_from_dlq(c, 1, queue=v)),
    row(
        "retry_from_dlq.priority",
        "priority",
        PRIORITIES,
        lambda c, v: admin.retry_from_dlq(c, 1, priority=v),
    ),
    row("move_failed_to_dlq", "job id", IDS, lambda c, v: admin.move_failed_to_dlq(c, v, "r")),
    row(
        "move_failed_to_dlq.reason", "reason", NAMES, lambda c, v: admin.move_failed_to_dlq(c, 1, v)
    ),
    row("purge_dlq_job", "job id", IDS, lambda c, v: admin.purge_dlq_job(c, v)),
    row("dlq_depth.queue", "queue", NAMES, lambda c, v: admin.dlq_depth(c, queue=v)),
    row(
        "list_batch_operations.limit",
        "limit",
        LIMITS,
        lambda c, v: admin.list_batch_operations(c, limit=v),
    ),
    row(
        "purge_batch_operations.limit",
        "limit",
        {**LIMITS, "10001": 10_001},
        lambda c, v: admin.purge_batch_operations(c, NOW, limit=v),
        skip=["1001", "5000"],
    ),
    row(
        "purge_batch_operations.before",
        "before",
        {"naive": dt.datetime(2026, 1, 1), "str": "2026-01-01", "int": 0},
        lambda c, v: admin.purge_batch_operations(c, v),
    ),
    row(
        "submit_batch_operation.spec.priority",
        "priority",
        PRIORITIES,
        lambda c, v: admin.submit_batch_operation(
            c, "set_priority", spec={"priority": v}, filter={"queue": "q"}
        ),
    ),
    row(
        "submit_batch_operation.submitted_by",
        "submitted_by",
        TEXT,
        lambda c, v: admin.submit_batch_operation(
            c, "set_priority", spec={"priority": 1}, filter={"queue": "q"}, submitted_by=v
        ),
    ),
    row(
        "heartbeat_callback.timeout_seconds",
        "timeout_seconds",
        SECONDS,
        lambda c, v: admin.heartbeat_callback(c, CALLBACK, v),
    ),
    row(
        "complete_external.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: admin.complete_external(c, CALLBACK, run_lease=v),
    ),
    row(
        "fail_external.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: admin.fail_external(c, CALLBACK, "e", run_lease=v),
    ),
    row(
        "retry_external.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: admin.retry_external(c, CALLBACK, run_lease=v),
    ),
    row(
        "resolve_callback.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: admin.resolve_callback(c, CALLBACK, run_lease=v),
    ),
    row(
        "resume_external.run_lease",
        "run_lease",
        LEASES,
        lambda c, v: admin.resume_external(c, CALLBACK, run_lease=v),
    ),
    row(
        "fail_external.error",
        "error",
        TEXT,
        lambda c, v: admin.fail_external(c, CALLBACK, v),
        skip=["10000-chars"],
    ),
    row(
        "list_queue_descriptors.queue",
        "queue",
        NAMES,
        lambda c, v: admin.list_queue_descriptors(c, queue=v),
    ),
    row(
        "list_job_kind_descriptors.kind",
        "kind",
        NAMES,
        lambda c, v: admin.list_job_kind_descriptors(c, kind=v),
    ),
]


@pytest.fixture
def seeded(sync_client: awa.Client, conn: Conn) -> None:
    """Rows a mistaken call could touch."""
    sync_client.insert(Note("waiting"), queue="q", kind="k")
    failed = sync_client.insert(Note("failed"), queue="q", kind="k")
    set_state(conn, failed.id, "failed")
    sync_client.pause_queue("paused", paused_by="seed")


@pytest.mark.parametrize(("entry", "value"), list(cases(ADMIN_ROWS)))
async def test_bad_arguments_are_refused_before_any_sql(
    database_url: str, conn: Conn, seeded: None, entry: Row, value: Any
) -> None:
    before = snapshot(conn)
    # Inside the caller's open transaction: nothing ran, so it is still usable after.
    with psycopg.connect(database_url) as blocking:
        with pytest.raises(awa.ValidationError) as caught:
            entry.call(blocking, value)
        assert_names(caught.value, entry.field)
        assert blocking.execute("SELECT 1").fetchone() == (1,)
    async with await psycopg.AsyncConnection.connect(database_url) as asynchronous:
        with pytest.raises(awa.ValidationError) as caught:
            await maybe_await(entry.call(asynchronous, value))
        assert_names(caught.value, entry.field)
        assert await (await asynchronous.execute("SELECT 1")).fetchone() == (1,)
    assert snapshot(conn) == before


# Parameters that take ids, numbers, names or text from callers: each function of awa.admin
# taking one must have a row for it, named "function" (its job id) or "function.parameter".
CHECKED = {
    "job_id": "",
    "limit": "",
    "kind": "",
    "queue": "",
    "tag": "",
    "ids": "",
    "before_id": "",
    "paused_by": "",
    "priority": "",
    "period_bucket": "",
    "reason": "",
    "error": "",
    "run_lease": "",
    "timeout_seconds": "",
    "submitted_by": "",
    "changed_by": "",
}
# Functions outside these tables: periodic schedules (awa.periodic.operations) have their own
# checks.
ELSEWHERE = {
    ("pause_cron_job", "*"),
    ("resume_cron_job", "*"),
    ("delete_cron_job", "*"),
    ("trigger_cron_job", "*"),
}


def test_every_checked_parameter_of_awa_admin_has_a_row() -> None:
    covered = {entry.name for entry in ADMIN_ROWS}
    missing = []
    for name in admin.__all__:
        build = getattr(getattr(admin, name), "build", None)
        if build is None:
            continue  # a type, not an operation
        for parameter in inspect.signature(build).parameters:
            if parameter not in CHECKED or (name, "*") in ELSEWHERE:
                continue
            if f"{name}.{parameter}" in covered or (parameter == "job_id" and name in covered):
                continue
            missing.append(f"{name}.{parameter}")
    assert missing == [], f"add rows to ADMIN_ROWS for {missing}"
