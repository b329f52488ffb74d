"""The Job a handler receives: its attributes mirror the claimed row, and its progress
methods write to the row (flush), survive retries, and are cleared on completion."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid
from typing import Any

import pydantic
import pytest

import awa
from helpers_worker import db_now, queue, row, seconds, start, wait_for, wait_for_state
from jobs_helpers import Conn

# A retry policy that retries almost at once, so attempt 2 comes quickly.
QUICK_RETRY = awa.RetryPolicy(base=1.0, jitter=0.0, max_delay=0.05)


@dataclasses.dataclass
class Address:
    city: str


@dataclasses.dataclass
class ShipOrder:
    order_id: uuid.UUID
    due: dt.datetime
    address: Address


class Charge(pydantic.BaseModel):
    amount_cents: int
    currency: str = "EUR"


@dataclasses.dataclass
class Work:
    n: int = 0


async def test_job_attributes_mirror_the_claimed_row(client: awa.AsyncClient, conn: Conn) -> None:
    seen: list[awa.Job[ShipOrder]] = []

    @client.task(ShipOrder, queue="ship")
    async def handle(job: awa.Job[ShipOrder]) -> None:
        seen.append(job)

    order = ShipOrder(uuid.uuid4(), dt.datetime(2030, 1, 2, 3, 4, tzinfo=dt.UTC), Address("Oslo"))
    before = db_now(conn)
    inserted = await client.insert(
        order,
        queue="ship",
        priority=3,
        max_attempts=5,
        tags=["a", "b"],
        metadata={"tenant": 7, "nested": {"x": [1, 2]}},
    )
    await start(client, queue("ship", deadline_duration=120))
    final = await wait_for_state(conn, inserted.id, "completed")
    await client.shutdown()

    (job,) = seen
    assert job.id == inserted.id
    assert job.kind == "ship_order"
    assert job.queue == "ship"
    assert job.args == order
    assert isinstance(job.args.order_id, uuid.UUID)
    assert job.attempt == 1
    assert job.max_attempts == 5
    assert job.priority == 3
    assert job.tags == ["a", "b"]
    assert job.metadata == {"tenant": 7, "nested": {"x": [1, 2]}}
    assert job.errors == []
    assert job.run_lease == 1
    assert job.progress is None
    assert job.state is awa.JobState.RUNNING
    assert job.created_at == inserted.created_at
    assert job.run_at == inserted.run_at
    assert job.created_at >= before - dt.timedelta(seconds=1)
    assert job.attempted_at == final["attempted_at"]
    assert job.deadline is not None
    assert abs(seconds(job.deadline - final["attempted_at"]) - 120) < 0.001
    assert not job.is_cancelled()
    assert str(job.id) in repr(job)


async def test_pydantic_args_and_dict_args(client: awa.AsyncClient, conn: Conn) -> None:
    charges: list[Charge] = []
    raw: list[Any] = []

    @client.task(Charge)
    async def charge(job: awa.Job[Charge]) -> None:
        charges.append(job.args)

    @client.task(None, kind="raw_thing")
    async def raw_thing(job: awa.Job[dict[str, Any]]) -> None:
        raw.append(job.args)

    a = await client.insert(Charge(amount_cents=250))
    b = await client.insert({"free": ["form"]}, kind="raw_thing")
    await start(client)
    await wait_for_state(conn, a.id, "completed")
    await wait_for_state(conn, b.id, "completed")
    await client.shutdown()
    assert charges == [Charge(amount_cents=250, currency="EUR")]
    assert raw == [{"free": ["form"]}]


async def test_deadline_none_when_the_queue_has_none(client: awa.AsyncClient, conn: Conn) -> None:
    deadlines: list[dt.datetime | None] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        deadlines.append(job.deadline)

    job = await client.insert(Work())
    await start(client, queue(deadline_duration=0))
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert deadlines == [None]


async def test_per_job_deadline_duration_overrides_the_queue(
    client: awa.AsyncClient, conn: Conn
) -> None:
    deadlines: dict[int, dt.datetime | None] = {}
    rows: dict[int, dict[str, Any]] = {}

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        deadlines[job.args.n] = job.deadline
        rows[job.args.n] = row(conn, job.id)

    await client.insert(Work(1), deadline_duration=5)
    await client.insert(Work(2), deadline_duration=0)
    await client.insert(Work(3))
    await start(client, queue(deadline_duration=60))
    await wait_for(lambda: len(deadlines) == 3)
    await client.shutdown()

    five = deadlines[1]
    assert five is not None
    assert abs(seconds(five - rows[1]["attempted_at"]) - 5) < 0.001
    assert rows[1]["deadline_at"] == five
    assert deadlines[2] is None
    assert rows[2]["deadline_at"] is None
    sixty = deadlines[3]
    assert sixty is not None
    assert abs(seconds(sixty - rows[3]["attempted_at"]) - 60) < 0.001


async def test_errors_of_earlier_attempts_are_visible(client: awa.AsyncClient, conn: Conn) -> None:
    seen: list[tuple[int, list[dict[str, Any]]]] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        seen.append((job.attempt, list(job.errors)))
        if job.attempt == 1:
            raise ValueError("first try fails")

    job = await client.insert(Work())
    await start(client, queue(retry=QUICK_RETRY))
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert [attempt for attempt, _ in seen] == [1, 2]
    assert seen[0][1] == []
    (error,) = seen[1][1]
    assert error["attempt"] == 1
    assert error["error"].startswith("ValueError: first try fails")


async def test_flush_progress_writes_the_row(client: awa.AsyncClient, conn: Conn) -> None:
    flushed = asyncio.Event()
    release = asyncio.Event()

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        job.set_progress(30, "copying")
        job.update_metadata({"copied": 3})
        job.update_metadata({"total": 10})
        await job.flush_progress()
        flushed.set()
        await release.wait()

    job = await client.insert(Work())
    # Heartbeats far apart: only the flush can write the progress.
    await start(client, heartbeat_interval=30, heartbeat_staleness=90)
    await asyncio.wait_for(flushed.wait(), 5)
    assert row(conn, job.id)["progress"] == {
        "percent": 30,
        "message": "copying",
        "metadata": {"copied": 3, "total": 10},
    }
    release.set()
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert final["progress"] is None


async def test_progress_survives_a_retry_and_is_cleared_on_completion(
    client: awa.AsyncClient, conn: Conn
) -> None:
    seen: list[dict[str, Any] | None] = []

    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        seen.append(job.progress)
        if job.attempt == 1:
            job.set_progress(60, "checkpoint")
            job.update_metadata({"offset": 600})
            raise RuntimeError("retry me")
        job.set_progress(100)

    job = await client.insert(Work())
    await start(client, queue(retry=QUICK_RETRY))
    final = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    checkpoint = {"percent": 60, "message": "checkpoint", "metadata": {"offset": 600}}
    assert seen == [None, checkpoint]
    assert final["progress"] is None


async def test_progress_kept_by_a_retry_written_without_flush(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> None:
        job.set_progress(42, "not flushed")
        raise RuntimeError("stop here")

    job = await client.insert(Work(), max_attempts=3)
    await start(client, heartbeat_interval=30, heartbeat_staleness=90)
    retried = await wait_for_state(conn, job.id, "retryable")
    await client.shutdown()
    assert retried["progress"] == {"percent": 42, "message": "not flushed"}


def test_set_progress_clamps_and_validates() -> None:
    job = awa.Job[Work](
        id=1,
        kind="work",
        queue="default",
        raw_args={},
        priority=2,
        attempt=1,
        max_attempts=25,
        run_lease=1,
        run_at=dt.datetime.now(dt.UTC),
        created_at=dt.datetime.now(dt.UTC),
        attempted_at=None,
        deadline=None,
        errors=[],
        metadata={},
        tags=[],
        progress=None,
    )
    job.set_progress(150, "over")
    assert job.progress == {"percent": 100, "message": "over"}
    job.set_progress(-5)
    assert job.progress == {"percent": 0}
    job.set_progress(12.7)
    assert job.progress == {"percent": 12}
    with pytest.raises(TypeError):
        job.set_progress("50")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        job.set_progress(True)
    with pytest.raises(TypeError):
        job.update_metadata(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        asyncio.run(job.flush_progress())


async def test_sync_handler_flushes_progress(client: awa.AsyncClient, conn: Conn) -> None:
    import threading

    flushed = threading.Event()
    release = threading.Event()

    @client.task(Work)
    def handle(job: awa.Job[Work]) -> None:
        job.set_progress(150, "clamped")
        job.flush_progress_sync()
        flushed.set()
        release.wait(5)

    job = await client.insert(Work())
    await start(client, heartbeat_interval=30, heartbeat_staleness=90)
    await wait_for(flushed.is_set)
    assert row(conn, job.id)["progress"] == {"percent": 100, "message": "clamped"}
    release.set()
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (lambda: awa.Cancel("stop"), "cancelled"),
        (lambda: awa.Snooze(60), "scheduled"),
        (lambda: awa.RetryAfter(60), "retryable"),
        (lambda: awa.TerminalError("fatal"), "failed"),
    ],
    ids=["cancel", "snooze", "retry_after", "terminal"],
)
async def test_progress_is_kept_by_every_outcome_but_completion(
    client: awa.AsyncClient, conn: Conn, outcome: Any, state: str
) -> None:
    @client.task(Work)
    async def handle(job: awa.Job[Work]) -> Any:
        job.set_progress(70, "kept")
        result = outcome()
        if isinstance(result, BaseException):
            raise result
        return result

    job = await client.insert(Work())
    await start(client, heartbeat_interval=30, heartbeat_staleness=90)
    final = await wait_for_state(conn, job.id, state)
    await client.shutdown()
    assert final["progress"] == {"percent": 70, "message": "kept"}
