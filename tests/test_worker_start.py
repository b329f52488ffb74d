"""Registering handlers and starting the worker: async and plain ``def`` handlers, every form
``start()`` accepts, its validation errors, ``client.run()`` and ``client.shutdown()``."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest

import awa
from awa.core.kinds import decoder_for
from helpers_worker import (
    FAST_RUNTIME,
    queue,
    running_rows,
    start,
    wait_for,
    wait_for_state,
)
from jobs_helpers import Conn


@dataclasses.dataclass
class Ping:
    n: int = 0


@dataclasses.dataclass
class Block:
    seconds: float


async def test_async_handler_runs_and_completes(client: awa.AsyncClient, conn: Conn) -> None:
    seen: list[Ping] = []

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        seen.append(job.args)

    await start(client)
    job = await client.insert(Ping(7))
    row = await wait_for_state(conn, job.id, "completed")
    await client.shutdown()
    assert seen == [Ping(7)]
    assert row["attempt"] == 1
    assert row["finalized_at"] is not None


async def test_sync_handler_runs_in_a_thread_and_the_loop_stays_responsive(
    client: awa.AsyncClient, conn: Conn
) -> None:
    loop_thread = threading.get_ident()
    sync_started = threading.Event()
    sync_release = threading.Event()
    sync_threads: list[int] = []
    sync_finished_at: list[float] = []
    async_finished_at: list[float] = []

    @client.task(Block)
    def blocking(job: awa.Job[Block]) -> None:
        sync_threads.append(threading.get_ident())
        sync_started.set()
        sync_release.wait(job.args.seconds)  # blocks its thread until the test releases it
        sync_finished_at.append(time.monotonic())

    @client.task(Ping)
    async def quick(job: awa.Job[Ping]) -> None:
        async_finished_at.append(time.monotonic())

    await start(client, queue(max_workers=2))
    slow = await client.insert(Block(30))
    await wait_for(sync_started.is_set, 5)

    # While the plain def handler sleeps in its thread, the loop keeps ticking...
    ticks = 0
    began = time.monotonic()
    while time.monotonic() - began < 0.2:
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks >= 10

    # ...and an async job on the same worker is claimed, run and completed meanwhile.
    fast = await client.insert(Ping(1))
    try:
        await wait_for_state(conn, fast.id, "completed", timeout=5)
        assert not sync_finished_at, "the async job should finish while the sync one blocks"
    finally:
        sync_release.set()

    await wait_for_state(conn, slow.id, "completed", timeout=5)
    await client.shutdown()
    assert sync_threads
    assert sync_threads[0] != loop_thread
    assert async_finished_at[0] < sync_finished_at[0]


@dataclasses.dataclass
class Prebuilt:
    n: int = 0


class NoSchema:
    """A class pydantic cannot build a schema for: its decoder fails at the job instead."""

    def __init__(self, n: int) -> None:
        self.n = n


async def test_start_builds_each_handlers_args_decoder(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Prebuilt)
    async def handle(job: awa.Job[Prebuilt]) -> None:
        pass

    @client.task(NoSchema, kind="no_schema")
    async def unbuildable(job: awa.Job[NoSchema]) -> None:
        pass

    await start(client, queue())  # a type without a schema does not stop the start
    before = decoder_for.cache_info()
    decoder_for(Prebuilt)
    assert decoder_for.cache_info().misses == before.misses  # built by start, not now
    job = await client.insert(Prebuilt(1))
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()


async def test_start_with_a_list_of_tuples(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Ping, queue="tuples")
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await client.start([("tuples", 3)], **FAST_RUNTIME)
    runtime = client.runtime
    assert runtime is not None
    assert [(q.name, q.max_workers) for q in runtime.queues] == [("tuples", 3)]
    job = await client.insert(Ping(), queue="tuples")
    await wait_for_state(conn, job.id, "completed")
    await client.shutdown()


async def test_start_with_a_dict_and_per_queue_options(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Ping, queue="plain")
    async def plain(job: awa.Job[Ping]) -> None:
        pass

    @client.task(Block, queue="tuned")
    async def tuned(job: awa.Job[Block]) -> None:
        pass

    await client.start(
        {
            "plain": 2,
            "tuned": {
                "max_workers": 5,
                "poll_interval": 0.05,
                "deadline_duration": 60,
                "claim_batch_size": 7,
                "prefetch": 0,
                "retry": awa.RetryPolicy(base=3),
            },
        },
        **FAST_RUNTIME,
    )
    runtime = client.runtime
    assert runtime is not None
    configs = {q.name: q for q in runtime.queues}
    assert configs["plain"].max_workers == 2
    tuned_config = configs["tuned"]
    assert tuned_config.max_workers == 5
    assert tuned_config.deadline_duration == 60.0
    assert tuned_config.claim_batch_size == 7
    assert tuned_config.prefetch == 0
    assert tuned_config.retry.base == 3
    a = await client.insert(Ping(), queue="plain")
    b = await client.insert(Block(0), queue="tuned")
    await wait_for_state(conn, a.id, "completed")
    await wait_for_state(conn, b.id, "completed")
    await client.shutdown()


async def test_start_with_none_runs_the_queues_tasks_declare(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Ping, queue="first")
    async def first(job: awa.Job[Ping]) -> None:
        pass

    @client.task(Block, queue="second")
    def second(job: awa.Job[Block]) -> None:
        pass

    await client.start(None, **FAST_RUNTIME)
    runtime = client.runtime
    assert runtime is not None
    assert sorted(q.name for q in runtime.queues) == ["first", "second"]
    a = await client.insert(Ping(), queue="first")
    b = await client.insert(Block(0), queue="second")
    await wait_for_state(conn, a.id, "completed")
    await wait_for_state(conn, b.id, "completed")
    await client.shutdown()


async def test_start_without_tasks_is_refused(client: awa.AsyncClient) -> None:
    with pytest.raises(
        awa.AwaError, match="register at least one worker before starting the runtime"
    ):
        await client.start([("default", 1)])
    assert client.runtime is None


async def test_start_with_a_duplicate_queue_is_refused(client: awa.AsyncClient) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    with pytest.raises(awa.ValidationError, match="configured more than once"):
        await client.start([("default", 1), ("default", 2)])
    assert client.runtime is None


async def test_start_with_an_unknown_queue_option_is_refused(client: awa.AsyncClient) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    with pytest.raises(awa.ValidationError, match="max_worker"):
        await client.start({"default": {"max_worker": 2}})
    assert client.runtime is None


async def test_start_runs_exactly_the_queues_given(client: awa.AsyncClient, conn: Conn) -> None:
    # A task on a queue this process does not run is simply not claimed here: another
    # process of the fleet runs that queue.
    @client.task(Ping, queue="elsewhere")
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    @client.task(Block, queue="here")
    async def block(job: awa.Job[Block]) -> None:
        pass

    await start(client, queue("here"))
    try:
        assert [config.name for config in client.runtime.queues] == ["here"]  # type: ignore[union-attr]
        done = await client.insert(Block(0))
        elsewhere = await client.insert(Ping(1))
        await wait_for_state(conn, done.id, "completed")
        assert (await client.get_job(elsewhere.id)).state is awa.JobState.AVAILABLE  # type: ignore[union-attr]
    finally:
        await client.shutdown()


async def test_start_twice_is_refused_and_tasks_cannot_be_added_while_running(
    client: awa.AsyncClient,
) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client)
    try:
        with pytest.raises(awa.AwaError, match="already running"):
            await start(client)
        with pytest.raises(awa.AwaError, match="before start"):
            client.task(Block)(handle)
    finally:
        await client.shutdown()
    assert client.runtime is None


async def test_bad_runtime_settings_are_refused(client: awa.AsyncClient) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    with pytest.raises(awa.ValidationError, match="heartbeat_staleness"):
        await client.start(queue(), heartbeat_interval=1.0, heartbeat_staleness=1.5)
    with pytest.raises(
        awa.ValidationError, match=r"unknown option\(s\) \['no_such_setting'\]"
    ) as e:
        await client.start(queue(), no_such_setting=1)
    assert "heartbeat_interval" in str(e.value)  # the valid ones are listed
    assert client.runtime is None


async def test_start_again_after_shutdown(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    for _ in range(2):
        await start(client)
        job = await client.insert(Ping())
        await wait_for_state(conn, job.id, "completed")
        await client.shutdown()
        assert client.runtime is None


async def test_run_context_manager(client: awa.AsyncClient, conn: Conn) -> None:
    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        await asyncio.sleep(0.2)

    async with client.run(queue(), shutdown_timeout=5, **FAST_RUNTIME) as running:
        assert running is client
        assert client.runtime is not None
        job = await client.insert(Ping())
        await wait_for_state(conn, job.id, "running")
    # Leaving the block shut the worker down after letting the job finish.
    assert client.runtime is None
    final = await client.get_job(job.id)
    assert final is not None
    assert final.state is awa.JobState.COMPLETED
    assert running_rows(conn) == []


async def test_shutdown_without_start_is_a_no_op(client: awa.AsyncClient) -> None:
    await client.shutdown(timeout=1)
    assert client.runtime is None


async def test_client_close_shuts_the_worker_down(database_url: str, conn: Conn) -> None:
    client = awa.AsyncClient(database_url)

    @client.task(Ping)
    async def handle(job: awa.Job[Ping]) -> None:
        pass

    await start(client)
    job = await client.insert(Ping())
    await wait_for_state(conn, job.id, "completed")
    await client.close()
    assert client.runtime is None


async def test_worker_refuses_to_start_on_an_unmigrated_database(fresh_database: str) -> None:
    """start() checks the schema version first and says what to do; once migrated, it runs."""
    async with awa.AsyncClient(fresh_database) as client:

        @client.task(Ping)
        async def handle(job: awa.Job[Ping]) -> None:
            pass

        with pytest.raises(awa.SchemaNotMigrated, match="awa migrate"):
            await start(client)
        assert client.runtime is None
        await client.migrate()
        await start(client)
        job = await client.insert(Ping())
        await wait_for(
            lambda: _state(client, job.id), 10, message="the worker never claimed the job"
        )
        await client.shutdown(timeout=2)
        assert client.runtime is None


async def _state(client: awa.AsyncClient, job_id: int) -> bool:
    row = await client.get_job(job_id)
    return row is not None and row.state is awa.JobState.COMPLETED
