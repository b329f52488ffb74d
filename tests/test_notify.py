"""Inserting an available job wakes workers: one NOTIFY on ``awa_ready`` per lane of a queue
(``"priority position_us id queue"``, where the earliest inserted job of the lane sits)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

import awa
from awa.worker.lanes import parse_ready
from jobs_helpers import (
    INSERT_PATHS,
    Conn,
    insert_many_via,
    insert_via,
    listening,
    notifications_so_far,
    payloads,
    ready_queues,
)


@dataclasses.dataclass
class Wake:
    n: int = 0


def later() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_available_insert_notifies_once_with_the_queue(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, database_url: str, path: str
) -> None:
    long_queue = "q" * 200
    with listening(database_url, "awa_ready") as listener:
        first = await insert_via(path, client, sync_client, Wake(), queue="mail")
        await insert_via(path, client, sync_client, Wake(), queue=long_queue)
        received = notifications_so_far(listener, conn, "awa_ready")
    assert ready_queues(received) == ["mail", long_queue]
    assert {notify.channel for notify in received} == {"awa_ready"}
    # The lane (priority) and position (run_at in microseconds, id) of the job.
    parsed = parse_ready(payloads(received, "awa_ready")[0])
    assert parsed is not None
    run_at_us = round(first.run_at.timestamp() * 1_000_000)
    assert parsed == ("mail", first.priority, run_at_us, first.id)


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_scheduled_insert_sends_nothing(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, database_url: str, path: str
) -> None:
    with listening(database_url, "awa_jobs", "awa_ready") as listener:
        job = await insert_via(path, client, sync_client, Wake(), run_at=later())
        received = notifications_so_far(listener, conn, "awa_ready")
    assert job.state is awa.JobState.SCHEDULED
    assert received == []


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_batch_notifies_once_per_queue_with_available_jobs(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, database_url: str, path: str
) -> None:
    batch = [
        Wake(1),
        awa.EnqueueRequest(Wake(2)).queue("b"),
        Wake(3),
        awa.EnqueueRequest(Wake(4)).queue("later").run_at(later()),
    ]
    with listening(database_url, "awa_ready") as listener:
        await insert_many_via(path, client, sync_client, batch, queue="a")
        received = notifications_so_far(listener, conn, "awa_ready")
    assert sorted(ready_queues(received)) == ["a", "b"]


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_copy_notifies(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, database_url: str, flavour: str
) -> None:
    jobs = [Wake(i) for i in range(100)] + [awa.EnqueueRequest(Wake()).queue("bulk-b")]
    with listening(database_url, "awa_ready") as listener:
        if flavour == "async":
            await client.insert_many_copy(jobs, queue="bulk-a")
            await client.insert_many_copy([Wake()], queue="bulk-c", run_at=later())
        else:
            sync_client.insert_many_copy(jobs, queue="bulk-a")
            sync_client.insert_many_copy([Wake()], queue="bulk-c", run_at=later())
        received = notifications_so_far(listener, conn, "awa_ready")
    assert sorted(ready_queues(received)) == ["bulk-a", "bulk-b"]


async def test_notification_waits_for_commit(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    with listening(database_url, "awa_ready") as listener:
        tx = await client.transaction()
        await tx.insert(Wake(), queue="tx")
        await tx.insert(Wake(), queue="tx")  # a later job of the same lane: no second one
        assert notifications_so_far(listener, conn, "awa_ready") == []
        await tx.commit()
        assert ready_queues(notifications_so_far(listener, conn, "awa_ready")) == ["tx"]
        async with client.transaction() as rolled_back:
            await rolled_back.insert(Wake(), queue="gone")
            await rolled_back.rollback()
        assert notifications_so_far(listener, conn, "awa_ready") == []


async def test_conflicting_unique_insert_sends_nothing(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    await client.insert(Wake(), queue="u", unique_opts={})
    with listening(database_url, "awa_jobs", "awa_ready") as listener:
        with pytest.raises(awa.UniqueConflict):
            await client.insert(Wake(), queue="u", unique_opts={})
        assert notifications_so_far(listener, conn, "awa_ready") == []
