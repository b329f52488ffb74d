"""Backpressure against the real database, with several producers at once: depth limits with
the signal and reject policies, the depth read from the leader's sample, the paced
producers, the counters, and setting limits through the clients, awa.admin and the CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.observability.queue_samples import store_queue_samples
from helpers_lifecycle import counter_value, metric_reader

SIGNALED = "awa.enqueue.backpressure.signaled"
REJECTED = "awa.enqueue.backpressure.rejected"


@dataclasses.dataclass
class Order:
    n: int


def stored(conn: psycopg.Connection[Any], queue: str) -> int:
    row = conn.execute("SELECT count(*) FROM awa.jobs WHERE queue = %s", (queue,)).fetchone()
    assert row is not None
    return int(row[0])


def counted(name: str, queue: str) -> int:
    return counter_value(name, **{"awa.job.queue": queue})


async def sample(database_url: str) -> None:
    """Take the leader's queue sample now (a running leader does it every few seconds)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await store_queue_samples(conn)


def _limits(client: Any) -> Any:
    return client.insert_rules.depth_limits


async def limit(client: awa.AsyncClient, queue: str, max_depth: int, policy: Any) -> int:
    """Limit ``queue``; the policy's counter for it so far."""
    metric_reader()
    await client.set_queue_depth_limit(queue, max_depth, policy=policy)
    return counted(SIGNALED if policy == "signal" else REJECTED, queue)


async def from_tasks(client: awa.AsyncClient, queue: str, tasks: int, each: int) -> list[Any]:
    """``tasks`` asyncio tasks at once, each inserting ``each`` jobs; the refusals."""
    refused: list[awa.QueueOverLimit] = []

    async def produce(task: int) -> None:
        for n in range(each):
            try:
                await client.insert(Order(task * 100 + n), queue=queue)
            except awa.QueueOverLimit as error:
                refused.append(error)

    await asyncio.gather(*(produce(task) for task in range(tasks)))
    return refused


def from_threads(insert: Any, threads: int, each: int) -> list[Any]:
    """``threads`` threads at once, each calling ``insert(n)`` ``each`` times; the
    refusals."""
    refused: list[awa.QueueOverLimit] = []
    lock = threading.Lock()

    def produce(thread: int) -> None:
        for n in range(each):
            try:
                insert(thread * 100 + n)
            except awa.QueueOverLimit as error:
                with lock:
                    refused.append(error)

    started = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return refused


async def test_signal_flags_inserts_over_the_limit_from_concurrent_tasks(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    queue = "bp-signal-tasks"
    before = await limit(client, queue, 20, "signal")
    assert not (await client.queue_pressure(queue)).over
    assert await from_tasks(client, queue, 4, 10) == []

    assert stored(conn, queue) == 40  # signal never refuses
    pressure = await client.queue_pressure(queue)
    assert pressure.over
    assert pressure.depth == 40
    assert pressure.limit == 20
    assert pressure.policy == "signal"
    # The jobs that left the queue at or over 20: the 20th to the 40th.
    assert counted(SIGNALED, queue) - before == 21


async def test_other_clients_see_the_depth_through_the_leaders_sample(
    client: awa.AsyncClient, database_url: str
) -> None:
    queue = "bp-signal-sampled"
    await client.set_queue_depth_limit(queue, 30)
    await client.insert_many([Order(n) for n in range(25)], queue=queue)
    with awa.Client(database_url) as other:
        assert (other.queue_pressure(queue)).depth == 0  # no sample yet
        await client.insert_many_copy([Order(n) for n in range(10)], queue=queue)
        await sample(database_url)
        _limits(other).expire()  # what a second does
        seen = other.queue_pressure(queue)
        assert seen.depth == 35
        assert seen.over
        assert seen.sample_age is not None
        listed = await client.list_queue_depth_limits()
        assert [(row.queue, row.depth, row.limit, row.over) for row in listed] == [
            (queue, 35, 30, True)
        ]


def test_signal_from_threads_with_the_blocking_client(
    sync_client: awa.Client, conn: psycopg.Connection[Any]
) -> None:
    metric_reader()
    queue = "bp-signal-threads"
    sync_client.set_queue_depth_limit(queue, 10, policy="signal")
    before = counted(SIGNALED, queue)
    assert from_threads(lambda n: sync_client.insert(Order(n), queue=queue), 4, 8) == []
    assert stored(conn, queue) == 32
    assert sync_client.queue_pressure(queue).over
    assert counted(SIGNALED, queue) - before == 23  # the 10th to the 32nd


async def test_reject_raises_for_concurrent_tasks_and_stores_nothing_refused(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    queue = "bp-reject-tasks"
    before = await limit(client, queue, 10, "reject")
    refused = await from_tasks(client, queue, 5, 6)

    assert stored(conn, queue) == 10  # exactly the limit: one client counts its own inserts
    assert len(refused) == 20
    error = refused[0]
    assert (error.queue, error.depth, error.limit) == (queue, 10, 10)
    assert f"queue {queue!r}" in str(error)
    assert "depth 10" in str(error)
    assert "limit 10" in str(error)
    assert isinstance(error, awa.AwaError)
    assert counted(REJECTED, queue) - before == 20


async def test_reject_rolls_back_the_callers_transaction(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    queue = "bp-reject-tx"
    await client.set_queue_depth_limit(queue, 2, policy="reject")
    await client.insert_many([Order(1), Order(2)], queue=queue)

    async def work() -> None:
        async with client.transaction() as tx:
            await tx.insert(Order(3), queue="bp-elsewhere")
            await tx.execute("CREATE TABLE bp_marker (x int)")
            await tx.insert(Order(4), queue=queue)

    with pytest.raises(awa.QueueOverLimit) as caught:
        await work()
    assert (caught.value.depth, caught.value.limit) == (2, 2)
    assert stored(conn, queue) == 2
    assert stored(conn, "bp-elsewhere") == 0
    assert conn.execute("SELECT to_regclass('bp_marker')").fetchone() == (None,)
    # COPY finds out after streaming, inside its transaction: nothing of it stays either.
    with pytest.raises(awa.QueueOverLimit):
        await client.insert_many_copy([Order(n) for n in range(5)], queue=queue)
    assert stored(conn, queue) == 2


def test_reject_from_threads_with_the_blocking_client(
    sync_client: awa.Client, conn: psycopg.Connection[Any]
) -> None:
    queue = "bp-reject-threads"
    sync_client.set_queue_depth_limit(queue, 12, policy="reject")

    def insert(n: int) -> None:
        with sync_client.transaction() as tx:
            tx.insert(Order(n), queue=queue)

    refused = from_threads(insert, 4, 5)
    assert stored(conn, queue) == 12
    assert len(refused) == 8
    assert all(error.queue == queue and error.limit == 12 for error in refused)


async def test_paced_producer_slows_down_on_the_signal(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    limited = awa.AsyncPacedProducer(client, "bp-paced", 200, adjust_every=0.1)
    free = awa.AsyncPacedProducer(client, "bp-paced-free", 200, adjust_every=0.1)
    await client.set_queue_depth_limit("bp-paced", 5)

    async def run(producer: awa.AsyncPacedProducer, seconds: float) -> int:
        done = 0
        deadline = time.monotonic() + seconds

        async def task() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await producer.insert(Order(done))
                done += 1

        await asyncio.gather(*(task() for _ in range(3)))
        return done

    limited_count, free_count = await asyncio.gather(run(limited, 1.5), run(free, 1.5))
    assert free.rate == 200
    assert limited.rate <= 200 * 0.5**5  # halved at every adjustment while over
    assert limited_count < free_count / 2
    assert stored(conn, "bp-paced") == limited_count


def test_blocking_paced_producer_recovers_when_the_limit_goes(sync_client: awa.Client) -> None:
    producer = awa.PacedProducer(sync_client, "bp-paced-sync", 100, adjust_every=0.05)
    sync_client.set_queue_depth_limit("bp-paced-sync", 1)
    threads = [
        threading.Thread(target=lambda: [producer.insert(Order(n)) for n in range(6)])
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    slowed = producer.rate
    assert slowed < 100
    sync_client.clear_queue_depth_limit("bp-paced-sync")
    for n in range(12):
        producer.insert(Order(n))
    assert producer.rate > slowed


async def test_no_limit_means_no_pressure(client: awa.AsyncClient) -> None:
    await client.insert(Order(1), queue="bp-free")
    pressure = await client.queue_pressure("bp-free")
    assert pressure == awa.QueuePressure("bp-free", None, None, None, None)
    assert not pressure.over


async def test_set_and_clear_through_admin_and_a_second_client(
    database_url: str, conn: psycopg.Connection[Any]
) -> None:
    awa.admin.set_queue_depth_limit(conn, "bp-admin", 3, policy="reject")
    awa.admin.set_queue_depth_limit(conn, "bp-admin", 1, policy="reject")  # replaces
    async with awa.AsyncClient(database_url) as client:
        await client.insert(Order(1), queue="bp-admin")
        with pytest.raises(awa.QueueOverLimit):
            await client.insert(Order(2), queue="bp-admin")
        assert awa.admin.clear_queue_depth_limit(conn, "bp-admin")
        assert not awa.admin.clear_queue_depth_limit(conn, "bp-admin")
        assert awa.admin.list_queue_depth_limits(conn) == []
        _limits(client).expire()  # other clients see it within a second
        await client.insert(Order(2), queue="bp-admin")
    assert stored(conn, "bp-admin") == 2


@pytest.mark.parametrize(
    ("max_depth", "policy", "message"),
    [
        (0, "signal", "max_depth must be between 1 and"),
        (-5, "reject", "got -5"),
        ("10", "signal", "max_depth must be an integer, not str"),
        (True, "signal", "max_depth must be an integer, not bool"),
        (10, "drop", "policy must be 'signal' or 'reject', got 'drop'"),
        (10, None, "got None"),
    ],
)
def test_bad_values_are_refused(
    sync_client: awa.Client, max_depth: Any, policy: Any, message: str
) -> None:
    with pytest.raises(awa.ValidationError, match=message.replace("(", r"\(")):
        sync_client.set_queue_depth_limit("bp-bad", max_depth, policy=policy)
    with pytest.raises(awa.ValidationError, match="queue must not be empty"):
        sync_client.set_queue_depth_limit("", 5)
    assert sync_client.list_queue_depth_limits() == []


def test_pacer_spaces_inserts_backs_off_and_recovers() -> None:
    pacer = awa.Pacer(100, min_rate=10, adjust_every=1)
    assert [pacer.delay(50.0) for _ in range(3)] == pytest.approx([0, 0.01, 0.02])
    over = awa.QueuePressure("q", 7, 5, "signal", 0.5)
    calm = awa.QueuePressure("q", 1, 5, "signal", 0.5)
    pacer.observe(over, 100.0)
    assert pacer.rate == 50
    pacer.observe(over, 100.5)  # within adjust_every: unchanged
    assert pacer.rate == 50
    for second in range(101, 106):
        pacer.observe(over, float(second))
    assert pacer.rate == 10  # min_rate
    pacer.observe(calm, 107.0)
    assert pacer.rate == 15
    for second in range(108, 115):
        pacer.observe(calm, float(second))
    assert pacer.rate == 100  # back to the target, not beyond


def test_pacer_refuses_bad_rates() -> None:
    with pytest.raises(awa.ValidationError, match="rate must be a number of jobs per second"):
        awa.Pacer(0)
    with pytest.raises(awa.ValidationError, match="backoff must be a number between 0 and 1"):
        awa.Pacer(10, backoff=1.5)
    with pytest.raises(awa.ValidationError, match=r"min_rate \(20\) must not exceed rate"):
        awa.Pacer(10, min_rate=20)


def test_cli_limits_and_lists_depth(database_url: str, sync_client: awa.Client) -> None:
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(main, ["--database-url", database_url, *args])

    result = cli("queue", "limit-depth", "bp-cli", "--max-depth", "4", "--policy", "reject")
    assert result.exit_code == 0, result.output
    assert "queue bp-cli: depth limit 4 (reject)" in result.output
    listed = cli("queue", "depth-limits", "--json")
    assert json.loads(listed.output)[0] == {
        "queue": "bp-cli",
        "depth": 0,
        "limit": 4,
        "policy": "reject",
        "sample_age": None,
    }
    table = cli("queue", "depth-limits")
    assert "bp-cli" in table.output
    assert "MAX DEPTH" in table.output
    bad = cli("queue", "limit-depth", "bp-cli", "--max-depth", "0")
    assert bad.exit_code == 2
    assert "max_depth must be between 1" in bad.output
    neither = cli("queue", "limit-depth", "bp-cli")
    assert neither.exit_code == 2
    assert "give either --max-depth N or --clear" in neither.output
    cleared = cli("queue", "limit-depth", "bp-cli", "--clear", "--json")
    assert json.loads(cleared.output) == {"queue": "bp-cli", "cleared": True}
    assert "no depth limits" in cli("queue", "depth-limits").output
    help_text = cli("queue", "limit-depth", "--help").output
    assert "--max-depth" in help_text
    assert "--policy" in help_text
    assert "--clear" in help_text


async def test_the_signal_lifts_once_workers_drain_the_queue(
    client: awa.AsyncClient, database_url: str
) -> None:
    """A real worker whose leader samples every 0.2 s: the producer's client sees the queue
    fall below its limit within the stated bound (sample interval + 1 s)."""
    queue = "bp-drain"
    await client.set_queue_depth_limit(queue, 10)
    await client.insert_many([Order(n) for n in range(15)], queue=queue)
    assert (await client.queue_pressure(queue)).over
    async with awa.AsyncClient(database_url) as worker:

        @worker.task(Order, queue=queue)
        async def handle(job: awa.Job[Order]) -> None:
            return None

        await worker.start([(queue, 4)], queue_sample_interval=0.2)
        try:
            started = time.monotonic()
            while (await client.queue_pressure(queue)).over:
                assert time.monotonic() - started < 10, "the signal never lifted"
                await asyncio.sleep(0.1)
            pressure = await client.queue_pressure(queue)
            assert pressure.depth is not None
            assert pressure.depth < 10
            assert pressure.sample_age is not None
        finally:
            await worker.shutdown()


async def test_reject_refuses_a_whole_workflow_a_batch_and_a_bridge_insert(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    """Every producer path is checked: a workflow or batch with a step in the full queue
    stores none of its jobs, and ``awa.bridge`` checks the client it is given."""
    from awa.bridge import insert_job

    queue = "bp-reject-graphs"
    await client.set_queue_depth_limit(queue, 2, policy="reject")
    await client.insert_many([Order(1), Order(2)], queue=queue)
    workflow = awa.Workflow("graph")
    first = workflow.add(Order(3), queue="bp-elsewhere")
    workflow.add(Order(4), queue=queue, depends_on=[first])
    with pytest.raises(awa.QueueOverLimit):
        await client.insert_workflow(workflow)
    with pytest.raises(awa.QueueOverLimit):
        await client.insert_batch([Order(5)], on_complete=Order(6), queue=queue)
    async with await psycopg.AsyncConnection.connect(conn.info.dsn) as own:
        with pytest.raises(awa.QueueOverLimit):
            await insert_job(own, Order(7), queue=queue, client=client)
        await own.rollback()
        # Without a client there are no limits to check (documented).
        await insert_job(own, Order(8), queue=queue)
        await own.commit()
    assert stored(conn, queue) == 3
    assert stored(conn, "bp-elsewhere") == 0


async def test_follow_ups_are_never_refused(
    client: awa.AsyncClient, conn: psycopg.Connection[Any]
) -> None:
    """Refusing a follow-up would roll back the completion that triggers it: follow-ups
    (registered or staged) go into a full queue, and count in its depth from the next
    sample."""
    queue = "bp-follow-ups"
    await client.set_queue_depth_limit(queue, 1, policy="reject")
    await client.insert(Order(0), queue=queue)

    @client.on_completed_enqueue(Order)
    def next_order(args: Order, job: awa.JobRow) -> awa.EnqueueRequest:
        return awa.EnqueueRequest(Order(args.n + 1000)).queue(queue)

    @client.task(Order, queue="bp-triggers")
    async def handle(job: awa.Job[Order]) -> None:
        job.enqueue_on_completion(Order(job.args.n + 2000), queue=queue)

    trigger = await client.insert(Order(1), queue="bp-triggers")
    await client.start([("bp-triggers", 1)], promote_interval=0.05)
    started = time.monotonic()
    while stored(conn, queue) < 3:
        assert time.monotonic() - started < 10, "the follow-ups never arrived"
        await asyncio.sleep(0.02)
    row = conn.execute("SELECT state::text FROM awa.jobs WHERE id = %s", (trigger.id,)).fetchone()
    assert row == ("completed",)


async def test_the_ui_lists_sets_and_removes_depth_limits(client: awa.AsyncClient) -> None:
    from awa.ui import create_app
    from helpers_ui import browse, csrf, flash, post, text

    hostile = "<img src=x onerror=alert(1)>"
    await client.insert_many([Order(n) for n in range(3)], queue="bp-ui")
    async with browse(create_app(client)) as http:
        token = await csrf(http, "/overrides")

        async def limit(**fields: str) -> Any:
            """Post the depth-limit form; the page it leads back to."""
            done = await post(http, "/depth-limits/set", token, action="set", **fields)
            assert done.status_code == 303
            return await http.get(done.headers["location"])

        page = await limit(queue=hostile, max_depth="5")
        assert "depth limit set" in (flash(page) or "")
        assert "<img src=x" not in page.text
        page = await limit(queue="bp-ui", max_depth="2", policy="reject")
        assert "reject" in text(page)
        page = await limit(queue="q", max_depth="x")
        assert flash(page) == "Not done: max_depth must be an integer, got 'x'"
        page = await limit(queue="q", max_depth="1", policy="drop")
        assert flash(page) == "Not done: policy must be 'signal' or 'reject', got 'drop'"
        refused = await http.post("/depth-limits/set", data={"action": "set", "queue": "q"})
        assert refused.status_code == 403
        removed = await post(http, "/depth-limits/clear", token, action="clear", queue=hostile)
        page = await http.get(removed.headers["location"])
        assert flash(page) == f"Queue {hostile}: depth limit removed."
    assert [(p.queue, p.limit, p.policy) for p in await client.list_queue_depth_limits()] == [
        ("bp-ui", 2, "reject")
    ]
    async with browse(create_app(client, read_only=True)) as http:
        page = await http.get("/overrides")
        assert "bp-ui" in text(page)
        assert "<form" not in page.text.split("<main>", 1)[1]
        refused = await http.post("/depth-limits/clear", data={"csrf_token": "x", "queue": "bp-ui"})
        assert refused.status_code == 403
