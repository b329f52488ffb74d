"""What the operator UI reads: bounded statements over awa's tables, as plain records.

Every list is capped and served by an index (see ``sql/queries/ui.sql``); counts come from
the leader's queue samples, refreshed here only when no leader has sampled for a while.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import psycopg

from awa.model import JobState
from awa.observability.queue_samples import store_queue_samples
from awa.sql import query
from awa.storage.db import Statement, run_async

PAGE_SIZE = 50
SEARCH_WINDOW = 100_000
"""A search in the arguments' text looks at this many of the newest jobs (by id): it reads
each row, so it is bounded like every other list."""
STALE_SAMPLE_SECONDS = 60.0
"""Samples older than this (no leader running) are refreshed by the page that reads them."""
SHOWN_STATES = (
    JobState.AVAILABLE,
    JobState.SCHEDULED,
    JobState.RUNNING,
    JobState.RETRYABLE,
    JobState.WAITING_EXTERNAL,
    JobState.BLOCKED,
    JobState.FAILED,
)


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows


def _count(value: Any) -> int:
    """A stored count, or 0 when what is stored is not a whole number."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0


def _counts(value: Any) -> dict[str, int]:
    return {str(key): _count(n) for key, n in value.items()} if isinstance(value, dict) else {}


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    counts: dict[str, int]
    finished_hour: dict[str, int]
    lag: float | None
    sampled_at: dt.datetime | None
    paused: bool
    paused_by: str | None
    workers: int
    slots: int
    display_name: str | None = None
    description: str | None = None
    owner: str | None = None
    docs_url: str | None = None
    """The queue's descriptor (``client.queue_descriptor``), where one was declared."""
    unserved_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    """Kinds whose jobs wait here while no live worker of the queue has a handler for them
    (jobs due for over a minute, as the leader last counted them)."""

    @property
    def docs_link(self) -> str | None:
        """``docs_url`` if it is a web address (a row written by other means could hold a
        ``javascript:`` URL, which must never become a link)."""
        url = self.docs_url or ""
        return url if url.lower().startswith(("http://", "https://")) else None

    @property
    def throughput(self) -> int:
        """Jobs finished in the last hour, whatever their outcome."""
        return sum(self.finished_hour.values())


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    queues: list[QueueRow]
    runtimes: list[dict[str, Any]]
    sample_age: float | None

    @property
    def leader(self) -> dict[str, Any] | None:
        return next((runtime for runtime in self.runtimes if runtime["is_leader"]), None)

    def total(self, state: str) -> int:
        return sum(queue.counts.get(state, 0) for queue in self.queues)


async def sample_age(conn: psycopg.AsyncConnection[Any]) -> float | None:
    rows = await run_async(conn, Statement(query("ui_sample_age"), None, _rows))
    age = rows[0]["age"]
    return float(age) if age is not None else None


async def fresh_sample_age(conn: psycopg.AsyncConnection[Any]) -> float | None:
    """The age of the queue samples, sampling now when none is recent (no leader runs)."""
    age = await sample_age(conn)
    if age is None or age > STALE_SAMPLE_SECONDS:
        await store_queue_samples(conn)
        age = await sample_age(conn)
    return age


# The overview's columns that QueueRow takes as they come.
_AS_STORED = (
    "queue",
    "lag",
    "sampled_at",
    "paused",
    "paused_by",
    "display_name",
    "description",
    "owner",
    "docs_url",
)


async def overview(conn: psycopg.AsyncConnection[Any]) -> Overview:
    age = await fresh_sample_age(conn)
    rows = await run_async(conn, Statement(query("ui_queue_overview"), None, _rows))
    queues = [
        QueueRow(
            **{field: row[field] for field in _AS_STORED},
            counts=_counts(row["counts"]),
            finished_hour=_counts(row["finished_hour"]),
            workers=_count(row["workers"]),
            slots=_count(row["slots"]),
            unserved_kinds=_counts(row["unserved_kinds"]),
        )
        for row in rows
    ]
    return Overview(queues, await runtimes(conn), age)


async def state_totals(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """Live jobs by state over every queue, as last sampled."""
    rows = await run_async(conn, Statement(query("ui_state_totals"), None, _rows))
    return {row["state"]: _count(row["n"]) for row in rows}


def _runtimes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:  # written by workers; the page reads them as a mapping and a list
        row["concurrency"] = _counts(row["concurrency"])
        row["queues"] = list(row["queues"] or [])
    return rows


async def runtimes(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_runtimes"), None, _runtimes))


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """The jobs page's filters and cursor, as given in its query string."""

    state: JobState | None = None
    kind: str | None = None
    queue: str | None = None
    tag: str | None = None
    text: str | None = None
    sort: str = "id"
    after_id: int | None = None
    after_run_at: dt.datetime | None = None

    def params(self, limit: int) -> dict[str, Any]:
        return {
            "state": self.state.value if self.state is not None else None,
            "kind": self.kind,
            "queue": self.queue,
            "tag": self.tag,
            "text": self.text,
            "after_id": self.after_id,
            "after_run_at": self.after_run_at,
            "search_window": SEARCH_WINDOW,
            "limit": limit,
        }

    def query_string(self, **changes: Any) -> dict[str, str]:
        """The filters as query parameters (without the cursor unless given in changes)."""
        values = {
            "state": self.state.value if self.state is not None else None,
            "kind": self.kind,
            "queue": self.queue,
            "tag": self.tag,
            "q": self.text,
            "sort": self.sort if self.sort != "id" else None,
        }
        values.update(changes)
        return {key: str(value) for key, value in values.items() if value not in (None, "")}


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[dict[str, Any]]
    next_cursor: dict[str, str] | None


async def jobs_page(
    conn: psycopg.AsyncConnection[Any], where: JobFilter, limit: int = PAGE_SIZE
) -> JobPage:
    """One page of jobs and the cursor of the next (None on the last page)."""
    name = "ui_jobs_by_run_at" if where.sort == "run_at" else "ui_jobs_by_id"
    rows = await run_async(conn, Statement(query(name), where.params(limit + 1), _rows))
    if len(rows) <= limit:
        return JobPage(rows, None)
    last = rows[limit - 1]
    cursor = {"after": str(last["id"])}
    if where.sort == "run_at":
        cursor["after_run_at"] = last["run_at"].isoformat()
    return JobPage(rows[:limit], cursor)


async def matching_ids(
    conn: psycopg.AsyncConnection[Any], where: JobFilter, limit: int
) -> list[int]:
    """The ids of up to ``limit`` jobs matching the filter (bulk actions)."""
    page = await jobs_page(conn, dataclasses.replace(where, after_id=None), limit)
    return [row["id"] for row in page.jobs]


async def follow_ups_of(conn: psycopg.AsyncConnection[Any], job_id: int) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_follow_ups_of"), {"id": job_id}, _rows))


async def job_brief(conn: psycopg.AsyncConnection[Any], job_id: int) -> dict[str, Any] | None:
    rows = await run_async(conn, Statement(query("ui_job_brief"), {"id": job_id}, _rows))
    return rows[0] if rows else None


async def progress(conn: psycopg.AsyncConnection[Any], job_id: int) -> dict[str, Any] | None:
    rows = await run_async(conn, Statement(query("ui_progress"), {"id": job_id}, _rows))
    return rows[0] if rows else None


async def callbacks(conn: psycopg.AsyncConnection[Any], limit: int = 200) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_callbacks"), {"limit": limit}, _rows))


async def failed_groups(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_failed_groups"), None, _rows))


async def parents_of(conn: psycopg.AsyncConnection[Any], job_id: int) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_parents_of"), {"id": job_id}, _rows))


async def children_of(conn: psycopg.AsyncConnection[Any], job_id: int) -> list[dict[str, Any]]:
    return await run_async(conn, Statement(query("ui_children_of"), {"id": job_id}, _rows))
