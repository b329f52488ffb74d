"""Rolling deploys: a worker claims only the kinds it has handlers for, so a kind that a newer
release adds waits for a worker that runs it instead of failing on the old ones; health, the
queue gauges and the operator UI name the kinds that no live worker of their queue runs."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.observability.health import UnservedKind
from awa.observability.queue_samples import refresh_queue_samples, store_queue_samples
from awa.ui import create_app
from helpers_ui import browse, text
from helpers_worker import start, wait_for
from jobs_helpers import Conn, count_jobs

QUEUE = "deploy"


@dataclasses.dataclass
class Resize:
    n: int


@dataclasses.dataclass
class Thumbnail:
    n: int


def old_release(url: str, ran_by: dict[int, str], name: str = "old") -> awa.AsyncClient:
    """A worker of the release before Thumbnail existed: it runs Resize only."""
    client = awa.AsyncClient(url, application_name=name)

    @client.task(Resize, queue=QUEUE)
    async def resize(job: awa.Job[Resize]) -> None:
        ran_by[job.id] = name

    return client


def new_release(url: str, ran_by: dict[int, str]) -> awa.AsyncClient:
    client = old_release(url, ran_by, "new")

    @client.task(Thumbnail, queue=QUEUE)
    async def thumbnail(job: awa.Job[Thumbnail]) -> None:
        ran_by[job.id] = "new"

    return client


@pytest.mark.parametrize(
    "limits",
    [{}, {"global_max_running": 50}, {"key_concurrency": 2}],
    ids=["plain claim", "limited claim", "keyed claim"],
)
async def test_an_old_worker_leaves_a_new_kind_to_the_new_worker(
    database_url: str, conn: Conn, limits: dict[str, Any]
) -> None:
    ran_by: dict[int, str] = {}
    old = old_release(database_url, ran_by)
    new = new_release(database_url, ran_by)
    settings = {QUEUE: {"max_workers": 4, "poll_interval": 0.05, **limits}}
    # The new kind's jobs sit between the old kind's, at the heads of the lanes.
    inserted = await old.insert_many(
        [Thumbnail(n) if n % 2 else Resize(n) for n in range(40)], queue=QUEUE
    )
    thumbnails = {job.id for job in inserted if job.kind == "thumbnail"}
    try:
        await start(old, settings)
        # The old worker ran every Resize, passing over the Thumbnails without touching them.
        resized = "kind = 'resize' AND state = 'completed'"
        await wait_for(lambda: count_jobs(conn, resized) == 20, 15)
        untouched = "kind = 'thumbnail' AND state = 'available' AND attempt = 0"
        assert count_jobs(conn, untouched) == 20
        await start(new, settings)
        # Both release's workers run now; more of both kinds arrive.
        more = await new.insert_many(
            [Thumbnail(n) if n % 2 else Resize(n) for n in range(40)], queue=QUEUE
        )
        thumbnails |= {job.id for job in more if job.kind == "thumbnail"}
        await wait_for(lambda: count_jobs(conn, "state = 'completed'") == 80, 20)
    finally:
        await old.close()
        await new.close()
    assert {ran_by[job_id] for job_id in thumbnails} == {"new"}
    assert count_jobs(conn, "kind = 'thumbnail' AND attempt = 1 AND errors = '[]'") == 40
    assert count_jobs(conn, "state <> 'completed'") == 0


async def test_health_metrics_and_the_ui_name_a_kind_no_worker_runs(
    database_url: str, conn: Conn
) -> None:
    hostile = "<script>alert(1)</script>"
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, run_at) VALUES"
        " ('thumbnail', %(q)s, now() - interval '90 seconds'),"
        " ('thumbnail', %(q)s, now() - interval '100 seconds'),"
        " ('thumbnail', %(q)s, now() - interval '5 seconds'),"  # too young to report
        " (%(hostile)s, %(q)s, now() - interval '95 seconds'),"
        " ('thumbnail', 'nobody', now() - interval '90 seconds')",  # an unserved queue
        {"q": QUEUE, "hostile": hostile},
    )
    ran_by: dict[int, str] = {}
    old = old_release(database_url, ran_by)
    try:
        await start(old, {QUEUE: {"max_workers": 2, "poll_interval": 0.05}})
        runtime = old.runtime
        assert runtime is not None
        await wait_for(lambda: runtime.is_leader, 5)
        check = await old.health_check()
        result = await asyncio.to_thread(
            CliRunner().invoke, main, ["--database-url", database_url, "health"]
        )
        async with old.connection() as aconn:
            await store_queue_samples(aconn)
            [sample] = [s for s in await refresh_queue_samples(aconn) if s.queue == QUEUE]
        async with browse(create_app(old)) as http:
            page = await http.get("/")
    finally:
        await old.close()

    assert check.status == "degraded"
    assert [worker.kinds for worker in check.workers] == [["resize"]]
    assert [(k.queue, k.kind, k.available) for k in check.unserved_kinds] == [
        (QUEUE, hostile, 1),
        (QUEUE, "thumbnail", 2),
    ]
    assert all(isinstance(k, UnservedKind) for k in check.unserved_kinds)
    thumbnail = check.unserved_kinds[1]
    assert 100 <= thumbnail.oldest_available_age < 130
    assert (
        f"kind 'thumbnail' is unserved on queue {QUEUE!r}: 2 available job(s), the oldest "
        f"waiting {thumbnail.oldest_available_age:.0f}s, and no live worker of the queue has "
        "a handler for it"
    ) in check.problems
    assert [item.queue for item in check.unserved] == ["nobody"]  # a queue, not a kind

    assert result.exit_code == 2, result.output
    [row] = [line for line in result.stdout.splitlines() if line.startswith(QUEUE)]
    assert row.rstrip().endswith("NOT EVERY KIND")

    assert sample.unserved_kinds == {"thumbnail": 2, hostile: 1}
    # (The gauge that exposes the sample: test_observability's scrape.)

    assert page.status_code == 200
    assert hostile not in page.text  # escaped, never markup
    assert "unserved kinds thumbnail (2)" in text(page).replace(f"{hostile} (1), ", "")
    assert "resize" in text(page)  # the worker's kinds


async def test_a_worker_of_an_earlier_release_runs_every_kind(
    database_url: str, conn: Conn
) -> None:
    """A runtime row without kinds (written before workers recorded them) claims every kind:
    its queue's kinds are not reported unserved."""
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, run_at)"
        " VALUES ('thumbnail', %s, now() - interval '90 seconds')",
        (QUEUE,),
    )
    conn.execute(
        "INSERT INTO awa.runtimes (id, hostname, pid, application_name, version, queues,"
        " stale_after) VALUES (%s, 'host', 1, 'earlier', '0', %s, interval '1 hour')",
        (uuid.uuid4(), [QUEUE]),
    )
    async with awa.AsyncClient(database_url) as client:
        check = await client.health_check()
    assert check.unserved_kinds == []
    assert check.unserved == []
    assert [worker.kinds for worker in check.workers] == [None]
