"""Per-task defaults: ``client.task(Args, priority=..., max_attempts=..., unique_opts=...,
deadline_duration=..., retry=...)`` apply to that kind's inserts through the client (bulk,
COPY, transactions, follow-ups and staged follow-ups too) unless an insert sets the option."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

import awa
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn, must_job_row


@dataclasses.dataclass
class Invoice:
    n: int


@dataclasses.dataclass
class Reminder:
    n: int


@dataclasses.dataclass
class Plain:
    n: int


def register(client: awa.AsyncClient, **defaults: Any) -> None:
    @client.task(Invoice, queue="billing", **defaults)
    async def invoice(job: awa.Job[Invoice]) -> None:
        return None


def columns(conn: Conn, job_id: int) -> tuple[Any, ...]:
    row = must_job_row(conn, job_id)
    return row["queue"], row["priority"], row["max_attempts"], row["deadline_duration"]


DEFAULTS: dict[str, Any] = {"priority": 1, "max_attempts": 5, "deadline_duration": 30}
APPLIED = ("billing", 1, 5, dt.timedelta(seconds=30))


async def test_defaults_apply_to_every_insert_path(client: awa.AsyncClient, conn: Conn) -> None:
    register(client, **DEFAULTS)
    single = await client.insert(Invoice(1))
    assert columns(conn, single.id) == APPLIED
    many = await client.insert_many([Invoice(2), Plain(3)])
    assert columns(conn, many[0].id) == APPLIED
    assert columns(conn, many[1].id) == ("default", 2, 25, None)  # another kind: untouched
    copied = await client.insert_many_copy([Invoice(4)])
    assert columns(conn, copied[0].id) == APPLIED
    async with client.transaction() as tx:
        inside = await tx.insert(Invoice(5))
    assert columns(conn, inside.id) == APPLIED
    request = await client.insert_many([awa.EnqueueRequest(Invoice(6)).tags(["x"])])
    assert columns(conn, request[0].id) == APPLIED


async def test_explicit_options_win(client: awa.AsyncClient, conn: Conn) -> None:
    register(client, **DEFAULTS)
    job = await client.insert(Invoice(1), priority=3, queue="other")
    assert columns(conn, job.id) == ("other", 3, 5, dt.timedelta(seconds=30))
    job = await client.insert(Invoice(2), max_attempts=25, deadline_duration=0)
    assert columns(conn, job.id) == ("billing", 1, 25, dt.timedelta(0))
    job = await client.insert(Invoice(3), priority=2)  # the global default, set explicitly
    assert must_job_row(conn, job.id)["priority"] == 2
    request = awa.EnqueueRequest(Invoice(4)).priority(4)
    [job] = await client.insert_many([request])
    assert columns(conn, job.id) == ("billing", 4, 5, dt.timedelta(seconds=30))
    whole = awa.EnqueueRequest(Invoice(5)).with_opts(awa.InsertOpts(priority=3))
    [job] = await client.insert_many([whole])  # with_opts sets every option
    assert columns(conn, job.id)[1:] == (3, 25, None)


async def test_unique_default(client: awa.AsyncClient) -> None:
    register(client, unique_opts={"by_args": True})
    await client.insert(Invoice(1))
    with pytest.raises(awa.UniqueConflict):
        await client.insert(Invoice(1))
    other = await client.insert(Invoice(1), unique_opts=None)  # explicitly not unique
    assert other.unique_key is None


async def test_follow_ups_and_staged_follow_ups_take_the_defaults(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Reminder, priority=1, max_attempts=3)
    async def remind(job: awa.Job[Reminder]) -> None:
        return None

    @client.task(Plain)
    async def plain(job: awa.Job[Plain]) -> None:
        job.enqueue_on_completion(Reminder(job.args.n + 100))

    client.on_completed_enqueue(Plain, lambda args, job: Reminder(args.n))
    trigger = await client.insert(Plain(1))
    await start(client, queue("default"))

    def reminders() -> list[Any]:
        rows = conn.execute(
            "SELECT priority, max_attempts FROM awa.jobs WHERE kind = 'reminder'"
        ).fetchall()
        return rows if len(rows) == 2 else []

    assert await wait_for(reminders) == [(1, 3), (1, 3)]
    assert must_job_row(conn, trigger.id)["priority"] == 2


async def test_the_task_retry_policy_replaces_the_queue_one(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Invoice, retry=awa.RetryPolicy(base=1000.0, jitter=0.0, max_delay=3600.0))
    async def invoice(job: awa.Job[Invoice]) -> None:
        raise RuntimeError("later")

    @client.task(Plain)
    async def plain(job: awa.Job[Plain]) -> None:
        raise RuntimeError("soon")

    slow = await client.insert(Invoice(1))
    quick = await client.insert(Plain(1))
    await start(client, queue("default"))

    def retried() -> bool:
        states = {must_job_row(conn, j.id)["state"] for j in (slow, quick)}
        return states == {"retryable"}

    await wait_for(retried)
    now = dt.datetime.now(dt.UTC)
    slow_wait = (must_job_row(conn, slow.id)["run_at"] - now).total_seconds()
    quick_wait = (must_job_row(conn, quick.id)["run_at"] - now).total_seconds()
    assert 900 < slow_wait <= 1000  # 1000 ** 1 seconds
    assert quick_wait < 10  # the queue's default policy: 2-2.5 s


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"priority": 9}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"deadline_duration": -1}, "deadline_duration"),
        ({"retry": "fast"}, "retry must be an awa.RetryPolicy"),
    ],
)
def test_bad_defaults_are_refused_at_registration(defaults: dict[str, Any], message: str) -> None:
    client = awa.AsyncClient("postgresql://unused")
    with pytest.raises(awa.ValidationError, match=message):
        client.task(Invoice, **defaults)(lambda job: None)
