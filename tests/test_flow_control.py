"""Flow control within one process (docs/flow-control.md): the options and their validation,
the concurrency key on the row, rate limits, caps and per-key limits against the real
database, weighted pools, priority aging, and what ``queue_stats`` shows. The fleet-wide
behaviour with three worker processes is in test_flow_fleet.py."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.worker.config import QueueConfig, parse_queues
from awa.worker.lanes import LanePositions, claim_statement
from awa.worker.settings import parse_value, resolve
from awa.worker.weighted_pool import WeightedPool
from helpers_flow import RunningSampler
from helpers_worker import FAST_QUEUE, queue, start, wait_for, wait_for_all, wait_for_state
from jobs_helpers import Conn


@dataclasses.dataclass
class Call:
    seconds: float = 0.0


def register(client: awa.AsyncClient, gate: asyncio.Event | None = None) -> list[int]:
    """A handler for Call (its queue is given at insert); returns the ids it started."""
    started: list[int] = []

    @client.task(Call, queue="api")
    async def call(job: awa.Job[Call]) -> None:
        started.append(job.id)
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(job.args.seconds)

    return started


# Options and validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": (0, 1)}, "rate must be a number of jobs per second from 1e-06"),
        ({"rate_limit": (-5, 1)}, "rate must be a number of jobs per second from 1e-06"),
        ({"rate_limit": (float("nan"), 1)}, "rate must be"),
        ({"rate_limit": (float("inf"), 1)}, "rate must be"),
        ({"rate_limit": (1e300, 1)}, "to 2147483647, got 1e+300"),
        ({"rate_limit": (2**31, 1)}, "to 2147483647, got 2147483648"),
        ({"rate_limit": (1e-9, 1)}, "from 1e-06"),
        ({"rate_limit": ("5", 1)}, "rate must be"),
        ({"rate_limit": (True, 1)}, "rate must be"),
        ({"rate_limit": (5, -1)}, "burst must be an integer from 0"),
        ({"rate_limit": (5, 1.5)}, "burst must be an integer from 0"),
        ({"rate_limit": (5, 2**31)}, "burst must be an integer from 0 (0: the rate) to 2147483647"),
        ({"rate_limit": (5, "1")}, "burst must be an integer"),
        ({"rate_limit": "fast"}, "rate_limit must be a (jobs per second, burst) pair"),
        ({"rate_limit": (1, 2, 3)}, "rate_limit must be a (jobs per second, burst) pair"),
        ({"global_max_running": 0}, "global_max_running must be a positive integer"),
        ({"global_max_running": 2**31}, "global_max_running must be a positive integer (at most"),
        ({"global_max_running": 2**63}, "global_max_running must be a positive integer"),
        ({"global_max_running": "5"}, "global_max_running must be a positive integer"),
        ({"global_max_running": 5.0}, "global_max_running must be a positive integer"),
        ({"key_concurrency": -1}, "key_concurrency must be a positive integer"),
        ({"key_concurrency": True}, "key_concurrency must be a positive integer"),
        ({"key_concurrency": 2**31}, "key_concurrency must be a positive integer (at most"),
        ({"weight": 0}, "weight must be > 0"),
        ({"weight": -2}, "weight must be > 0"),
        ({"weight": 2**31}, "weight must be > 0 and at most 2147483647"),
        ({"weight": 1.5}, "weight must be an integer > 0, not float"),
        ({"min_workers": -1}, "min_workers must be an integer >= 0"),
        ({"max_workers": 2**31}, "max_workers must be a positive integer (at most 2147483647)"),
        ({"claim_batch_size": 2**31}, "claim_batch_size must be a positive integer"),
        ({"prefetch": 2**31}, "prefetch must be an integer >= 0"),
        ({"deadline_duration": float("nan")}, "deadline_duration must be a finite number"),
        ({"deadline_duration": 1e300}, "deadline_duration is 1e+300 seconds; the limit is"),
        ({"poll_interval": "1"}, "poll_interval must be a finite number of seconds, not str"),
        ({"completed_retention": float("inf")}, "completed_retention must be a finite number"),
        ({"retry": awa.RetryPolicy()}, None),
    ],
)
def test_bad_queue_options_are_named(options: dict[str, Any], message: str | None) -> None:
    if message is None:  # the table's control row: a good value passes
        QueueConfig("api", **options)
        return
    with pytest.raises(awa.ValidationError, match="queue 'api'") as error:
        QueueConfig("api", **options)
    assert message in str(error.value)


def test_rate_limit_forms() -> None:
    assert QueueConfig("a", rate_limit=(50, 10)).rate_limit == (50.0, 10)
    # A burst of 0 (or a bare rate) means the rate rounded up, at least 1.
    assert QueueConfig("a", rate_limit=(2.5, 0)).rate_limit == (2.5, 3)
    assert QueueConfig("a", rate_limit=0.2).rate_limit == (0.2, 1)
    assert QueueConfig("a", rate_limit=[5, 2]).rate_limit == (5.0, 2)  # from a TOML file


def test_capped_and_weighted_queues_do_not_prefetch() -> None:
    assert QueueConfig("a", max_workers=4).prefetch == 16
    assert QueueConfig("a", max_workers=4, global_max_running=2).prefetch == 0
    assert QueueConfig("a", min_workers=1).prefetch == 0
    assert QueueConfig("a", max_workers=4, global_max_running=2, prefetch=3).prefetch == 3
    assert QueueConfig("a", max_workers=4, key_concurrency=1).prefetch == 16


@pytest.mark.parametrize(
    ("queues", "global_max_workers", "message"),
    [
        ({"a": {"min_workers": 2}}, None, "needs start(global_max_workers=N)"),
        ({"a": {"max_workers": 2, "weight": 3}}, None, "set a weight"),
        ({"a": {"min_workers": 5}, "b": {"min_workers": 4}}, 8, "add up to 9"),
        ({"a": {"max_workers": 2, "min_workers": 1}}, 8, "not both"),
        ({"a": {"max_workers": 2, "weight": 2}}, 8, "applies only to weighted queues"),
    ],
)
def test_bad_weighted_configs_are_named(
    queues: dict[str, Any], global_max_workers: int | None, message: str
) -> None:
    with pytest.raises(awa.ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_queues(queues, [], global_max_workers=global_max_workers)


def test_weighted_mode_forms() -> None:
    configs = parse_queues(
        {"a": {"weight": 3}, "b": {"min_workers": 2}, "c": {"max_workers": 4}},
        [],
        global_max_workers=10,
    )
    by_name = {config.name: config for config in configs}
    assert (by_name["a"].weighted, by_name["a"].min_workers) == (True, 0)
    assert (by_name["b"].weighted, by_name["b"].min_workers) == (True, 2)
    assert not by_name["c"].weighted  # its own max_workers, apart from the 10
    # Weighted mode names its queues' shares: a dict, not None or tuples (as in awa-pg).
    with pytest.raises(awa.ValidationError, match="weighted mode requires explicit queue"):
        parse_queues(None, ["x", "y"], global_max_workers=4)
    with pytest.raises(awa.ValidationError, match="tuple queue config is not supported"):
        parse_queues([("x", 2)], [], global_max_workers=4)
    with pytest.raises(awa.ValidationError, match="global_max_workers must be a positive"):
        awa.RuntimeConfig(global_max_workers=0)
    with pytest.raises(awa.ValidationError, match="priority_aging_interval must be >= 0"):
        awa.RuntimeConfig(priority_aging_interval=-1)


async def test_start_rejects_bad_flow_options_before_anything_runs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client)
    with pytest.raises(awa.ValidationError, match="global_max_running"):
        await client.start({"api": {"global_max_running": 0}})
    with pytest.raises(awa.ValidationError, match="add up to 6"):
        await client.start({"api": {"min_workers": 6}}, global_max_workers=5)
    assert client.runtime is None
    assert conn.execute("SELECT count(*) FROM awa.queue_limits").fetchone() == (0,)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"rate_limit": (5, 2**31)}, "burst"),
        ({"rate_limit": (2**40, 0)}, "rate"),
        ({"global_max_running": 2**31}, "global_max_running"),
        ({"key_concurrency": 2**63}, "key_concurrency"),
        ({"global_max_running": float("nan")}, "global_max_running"),
    ],
)
async def test_limits_beyond_their_columns_are_refused_at_start(
    client: awa.AsyncClient, conn: Conn, options: dict[str, Any], field: str
) -> None:
    """Limits are stored in integer (and double) columns: a value beyond them is refused
    by start(), naming it, before anything is stored (not a NumericValueOutOfRange)."""
    register(client)
    with pytest.raises(awa.ValidationError, match=field) as error:
        await client.start({"api": options})
    assert "queue 'api'" in str(error.value)
    assert client.runtime is None
    assert conn.execute("SELECT count(*) FROM awa.queue_limits").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM awa.runtimes").fetchone() == (0,)


async def test_a_restart_with_the_same_limits_does_not_warn(
    database_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """(20, 5) and (20.0, 5) are the same limits: a restart with either logs nothing, while
    a real change is logged once, naming the old and new limits."""
    caplog.set_level("WARNING", logger="awa.worker")
    for limits in [(20, 5), (20.0, 5), (20, 5), (20.5, 5)]:
        async with awa.AsyncClient(database_url) as worker:
            register(worker)
            await start(worker, queue("api", rate_limit=limits, global_max_running=3))
    changed = [r.getMessage() for r in caplog.records if "flow limits changed" in r.getMessage()]
    assert changed == [
        "queue api: flow limits changed from (20,5,3,) to (20.5,5,3,) (rate, burst, "
        "global_max_running, key_concurrency); workers still running the old ones keep them "
        "until restarted"
    ]
    row = conn.execute("SELECT rate, burst, max_running FROM awa.queue_limits").fetchone()
    assert row == (20.5, 5, 3)


# The concurrency key ----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "x" * 201, 5, "bad\ud800"])
async def test_bad_concurrency_keys_are_named(client: awa.AsyncClient, key: Any) -> None:
    with pytest.raises(awa.ValidationError, match="concurrency_key"):
        await client.insert(Call(), queue="api", concurrency_key=key)


async def test_the_concurrency_key_is_stored_by_every_insert_path(
    client: awa.AsyncClient, conn: Conn
) -> None:
    one = await client.insert(Call(), queue="api", concurrency_key="tenant-1")
    many = await client.insert_many(
        [Call(), awa.EnqueueRequest(Call()).concurrency_key("tenant-3")],
        queue="api",
        concurrency_key="tenant-2",
    )
    copied = await client.insert_many_copy(
        [Call(), Call()], queue="api", concurrency_key="tenant-4"
    )
    async with client.transaction() as tx:
        in_tx = await tx.insert(Call(), queue="api", concurrency_key="tenant-5")
    keys = dict(conn.execute("SELECT id, concurrency_key FROM awa.jobs").fetchall())
    assert (one.concurrency_key, keys[one.id]) == ("tenant-1", "tenant-1")
    assert [keys[row.id] for row in many] == ["tenant-2", "tenant-3"]
    assert [keys[row.id] for row in copied] == ["tenant-4", "tenant-4"]
    assert keys[in_tx.id] == "tenant-5"


async def test_the_concurrency_key_stays_through_retries(
    client: awa.AsyncClient, conn: Conn
) -> None:
    seen: list[str | None] = []

    @client.task(Call, queue="api")
    async def flaky(job: awa.Job[Call]) -> None:
        seen.append(job.concurrency_key)
        if job.attempt < 2:
            raise awa.RetryAfter(0.01)

    job = await client.insert(Call(), queue="api", concurrency_key="acct-9")
    await start(client, queue("api", key_concurrency=1))
    await wait_for_state(conn, job.id, "completed")
    assert seen == ["acct-9", "acct-9"]
    stored = conn.execute("SELECT concurrency_key FROM awa.jobs WHERE id = %s", (job.id,))
    assert stored.fetchone() == ("acct-9",)


# Limits in one process ----------------------------------------------------------------------


async def test_a_burst_starts_at_once_and_the_rest_at_the_rate(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client)
    await client.insert_many([Call() for _ in range(16)], queue="api")
    began = time.monotonic()
    await start(client, queue("api", max_workers=8, rate_limit=(20, 8)))
    await wait_for_all(conn, "completed", 8, timeout=5)
    # 8 at once, then 20 per second: the other 8 need 0.4 s at least.
    await wait_for_all(conn, "completed", 16, timeout=10)
    assert time.monotonic() - began >= 0.35
    starts = sorted(
        row[0]
        for row in conn.execute(
            "SELECT extract(epoch FROM attempted_at) FROM awa.jobs ORDER BY attempted_at"
        )
    )
    assert starts[7] - starts[0] < 0.3  # the burst
    assert starts[15] - starts[8] >= 0.3  # 8 more at 20/s, after the first of them


async def test_a_cap_holds_and_frees_as_jobs_finish(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    gate = asyncio.Event()
    started = register(client, gate)
    await client.insert_many([Call(0.02) for _ in range(30)], queue="api")
    with RunningSampler(database_url, "api").running() as sampler:
        await start(client, queue("api", max_workers=6, global_max_running=2))
        await wait_for(lambda: len(started) == 2, 5)
        stats = {entry.queue: entry for entry in await client.queue_stats()}
        api = stats["api"]
        assert api.limits == awa.QueueLimits(None, None, 2, None)
        assert api.held_back == awa.HeldBack(cap=28)
        gate.set()
        await wait_for_all(conn, "completed", 30, timeout=10)
    assert sampler.most_running == 2, sampler.most_running


async def test_a_key_at_its_limit_does_not_hold_back_other_keys(
    client: awa.AsyncClient, conn: Conn
) -> None:
    gate = asyncio.Event()
    started = register(client, gate)
    await client.insert_many([Call() for _ in range(50)], queue="api", concurrency_key="big")
    other = await client.insert(Call(), queue="api", concurrency_key="small")
    plain = await client.insert(Call(), queue="api")
    await start(client, queue("api", max_workers=8, key_concurrency=2))
    await wait_for(lambda: other.id in started and plain.id in started, 5)
    assert len(started) == 4  # two of "big", "small" and the job without a key
    stats = {entry.queue: entry for entry in await client.queue_stats()}
    assert stats["api"].held_back == awa.HeldBack(keys=48)
    gate.set()
    await wait_for_all(conn, "completed", 52, timeout=20)


def test_one_claim_sees_past_a_keys_backlog(conn: Conn) -> None:
    """The claim under a per-key limit takes the other keys' jobs in the same round trip
    even when one key's backlog fills the first window of candidates."""
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args, concurrency_key)"
        " SELECT 'call', 'api', '{}', 'big' FROM generate_series(1, 500)"
    )
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args, concurrency_key)"
        " VALUES ('call', 'api', '{}', 'small'), ('call', 'api', '{}', NULL)"
    )
    rows = conn.execute(
        "SELECT id, concurrency_key, retry_after FROM awa.claim_limited("
        "'api', 8, interval '5 min', NULL, NULL, NULL, 2, NULL, NULL, '{call}')"
    ).fetchall()
    keys = sorted((key or "-") for job_id, key, _ in rows if job_id is not None)
    assert keys == ["-", "big", "big", "small"]
    # Fewer than asked while jobs wait on a full key: ask again soon.
    assert [wait for job_id, _, wait in rows if job_id is None] == [0.05]
    # The next claim skips the full key at once.
    again = conn.execute(
        "SELECT id FROM awa.claim_limited('api', 8, interval '5 min', NULL, NULL, NULL, 2,"
        " NULL, NULL, '{call}') WHERE id IS NOT NULL"
    ).fetchall()
    assert again == []


def test_the_limited_claim_returns_the_columns_of_the_plain_claim(conn: Conn) -> None:
    """Job.from_claim reads both claims' rows: the same columns, in the same order, with the
    same effects on the row."""
    for _ in range(2):
        conn.execute(
            "INSERT INTO awa.jobs (kind, queue, args, metadata, tags, deadline_duration,"
            " concurrency_key) VALUES ('call', 'api', '{\"a\": 1}', '{\"m\": 2}',"
            " '{t}', interval '7 s', 'k')"
        )
    plain = conn.execute(
        claim_statement((1, 2, 3, 4), 256),
        {
            "queue": "api",
            "limit": 1,
            "deadline": dt.timedelta(seconds=60),
            "kinds": ["call"],
            **LanePositions().params(),
        },
    ).fetchone()
    limited = conn.execute(
        "SELECT * FROM awa.claim_limited('api', 1, interval '60 s', NULL, NULL, 5, NULL,"
        " NULL, NULL, '{call}')"
    ).fetchone()
    assert plain is not None
    assert limited is not None
    assert len(limited) == len(plain) + 1  # and retry_after
    timestamps = {0, 8, 9, 10, 11}  # id, run_at, created_at, attempted_at, deadline_at
    assert [v for i, v in enumerate(plain) if i not in timestamps] == [
        v for i, v in enumerate(limited[:-1]) if i not in timestamps
    ]
    assert plain[11] - plain[10] == pytest.approx(limited[11] - limited[10]) == 7.0


async def test_a_limits_row_deleted_under_a_running_worker_comes_back(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client)
    await start(client, queue("api", global_max_running=3))
    conn.execute("DELETE FROM awa.queue_limits")
    job = await client.insert(Call(), queue="api")
    await wait_for_state(conn, job.id, "completed")
    assert conn.execute("SELECT queue, max_running FROM awa.queue_limits").fetchall() == [
        ("api", 3)
    ]


async def test_limits_are_stored_at_start_and_cleared_by_a_worker_without_them(
    database_url: str, conn: Conn
) -> None:
    async with awa.AsyncClient(database_url) as first:
        register(first)
        await start(first, queue("api", rate_limit=(5, 2), global_max_running=3))
        row = conn.execute(
            "SELECT rate, burst, max_running, key_concurrency FROM awa.queue_limits"
        ).fetchone()
        assert row == (5.0, 2, 3, None)
    async with awa.AsyncClient(database_url) as second:
        register(second)
        await start(second, queue("api"))
        assert conn.execute("SELECT count(*) FROM awa.queue_limits").fetchone() == (0,)


async def test_a_paused_limited_queue_claims_nothing(client: awa.AsyncClient, conn: Conn) -> None:
    started = register(client)
    await client.pause_queue("api")
    job = await client.insert(Call(), queue="api")
    await start(client, queue("api", global_max_running=5))
    await asyncio.sleep(0.3)  # several poll intervals: nothing may start
    assert started == []
    await client.resume_queue("api")
    await wait_for_state(conn, job.id, "completed")


# Weighted pools -----------------------------------------------------------------------------


def test_weighted_pool_shares_the_overflow_by_weight() -> None:
    queues = parse_queues(
        {"a": {"weight": 3}, "b": {"weight": 1}, "c": {"min_workers": 2}},
        [],
        global_max_workers=10,
    )
    pool = WeightedPool(10, queues)
    assert pool.overflow == 8
    # Alone, a queue takes the whole overflow.
    assert pool.acquire("a", 100) == 8
    assert pool.acquire("b", 5) == 0
    # c's minimum is guaranteed whatever the others hold.
    assert pool.acquire("c", 5) == 2
    # As a's jobs finish, the three queues asking for more share the overflow 3:1:1:
    # b is granted up to ceil(8 * 1 / 5) = 2, a up to ceil(8 * 3 / 5) = 5, c the last one.
    pool.release("a", 8)
    assert pool.acquire("b", 5) == 2
    assert pool.acquire("a", 100) == 5
    assert pool.acquire("c", 5) == 1
    assert pool.acquire("b", 5) == 0
    # A queue whose claim came back short stops contending: the others' shares grow.
    pool.release("b", 2, satisfied=True)
    assert pool.fair_share("a") == 6  # ceil(8 * 3 / 4)
    assert pool.acquire("a", 100) == 1
    assert pool.acquire("c", 5) == 1


async def test_weighted_queues_get_their_shares(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    register(client)
    for name in ("heavy", "light", "floor"):
        await client.insert_many([Call(0.05) for _ in range(400)], queue=name)
    # Overflow 8 shared 3:1:1 by the three contending queues: heavy up to ceil(8*3/5) = 5,
    # light up to 2, floor up to 2 on top of its guaranteed 2; ten slots in all.
    queues = {
        "heavy": {"weight": 3, **FAST_QUEUE},
        "light": {"weight": 1, **FAST_QUEUE},
        "floor": {"min_workers": 2, **FAST_QUEUE},
    }
    samples: list[dict[str, int]] = []

    def sample() -> bool:
        # Handlers executing now (a finished job stays running in the database until its
        # batched completion commits, so the rows would count a few more).
        running = {name: queue["running"] for name, queue in runtime.stats().items()}
        assert sum(running.values()) <= 10, running
        samples.append(running)
        return len(samples) >= 100

    await start(client, queues, global_max_workers=10)
    runtime = client.runtime
    assert runtime is not None
    # The first claims may take the whole overflow before the others ask; shares settle as
    # those jobs finish.

    def completed_at_least(n: int) -> bool:
        row = conn.execute("SELECT count(*) FROM awa.jobs WHERE state = 'completed'").fetchone()
        return row is not None and row[0] >= n

    await wait_for(lambda: completed_at_least(60), 20)
    await wait_for(sample, 20, interval=0.01)

    def median(queue: str) -> float:
        return statistics.median(entry.get(queue, 0) for entry in samples)

    assert 4 <= median("heavy") <= 6, samples
    assert 1 <= median("light") <= 3, samples
    assert median("floor") >= 2, samples
    completed = dict(
        conn.execute(
            "SELECT queue, count(*) FROM awa.jobs WHERE state = 'completed' GROUP BY queue"
        ).fetchall()
    )
    assert completed["heavy"] > completed["light"]


# Priority aging -----------------------------------------------------------------------------


async def test_aging_moves_a_waiting_job_one_level_per_interval(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client)
    # Nobody runs "parked": the job waits, and the leader ages it.
    waiting = await client.insert(Call(), queue="parked", priority=4)
    await start(client, queue("api"), priority_aging_interval=0.4)

    def priority(job_id: int) -> tuple[int, Any]:
        row = conn.execute(
            "SELECT priority, metadata->'_awa_original_priority' FROM awa.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
        assert row is not None
        return int(row[0]), row[1]

    levels: list[int] = []

    def reached_one() -> bool:
        level, _ = priority(waiting.id)
        if not levels or levels[-1] != level:
            levels.append(level)
        return level == 1

    began = time.monotonic()
    await wait_for(reached_one, 10, interval=0.02)
    # One level per interval: 4 -> 3 -> 2 -> 1 takes three intervals at least.
    assert time.monotonic() - began >= 0.8
    assert levels == [4, 3, 2, 1]
    assert priority(waiting.id) == (1, 4)
    await asyncio.sleep(0.5)  # another pass: 1 is the floor
    assert priority(waiting.id)[0] == 1


async def test_aging_is_off_with_an_interval_of_zero(client: awa.AsyncClient, conn: Conn) -> None:
    register(client)
    job = await client.insert(Call(), queue="parked", priority=3)
    conn.execute("UPDATE awa.jobs SET run_at = now() - interval '1 hour' WHERE id = %s", (job.id,))
    await start(client, queue("api"), priority_aging_interval=0)
    runtime = client.runtime
    assert runtime is not None
    await wait_for(lambda: runtime.is_leader, 5)
    await asyncio.sleep(0.3)
    assert conn.execute("SELECT priority FROM awa.jobs WHERE id = %s", (job.id,)).fetchone() == (3,)


# The awa command ----------------------------------------------------------------------------


def test_worker_settings_carry_the_flow_options(tmp_path: Path) -> None:
    (tmp_path / "awa.toml").write_text(
        "[worker]\nglobal_max_workers = 6\n\n"
        "[queues.api]\nrate_limit = [50, 10]\nkey_concurrency = 2\n\n"
        "[queues.bulk]\nmin_workers = 1\nweight = 3\n"
    )
    settings = resolve(
        config=tmp_path / "awa.toml",
        client=None,
        queues=[],
        queue_options=["api.global_max_running=5", "bulk.rate_limit=2.5"],
        runtime={"priority_aging_interval": "30"},
        shutdown_timeout=None,
        log_level=None,
        log_format=None,
    )
    settings.check()
    queues = settings.start_queues([])
    assert queues is not None
    configs = {
        config.name: config
        for config in parse_queues(
            queues, [], global_max_workers=settings.runtime["global_max_workers"]
        )
    }
    assert configs["api"].rate_limit == (50.0, 10)
    assert (configs["api"].global_max_running, configs["api"].key_concurrency) == (5, 2)
    assert configs["bulk"].rate_limit == (2.5, 3)
    assert (configs["bulk"].min_workers, configs["bulk"].weight) == (1, 3)
    assert settings.runtime["priority_aging_interval"] == 30.0
    with pytest.raises(awa.ValidationError, match="rate_limit must be 'RATE' or 'RATE/BURST'"):
        parse_value("rate_limit", "fast/10")
    assert parse_value("rate_limit", "50/10") == (50.0, 10)


def test_queue_stats_command_shows_limits_and_held_jobs(database_url: str, conn: Conn) -> None:
    conn.execute(
        "INSERT INTO awa.queue_limits (queue, rate, burst, max_running, key_concurrency, tokens)"
        " VALUES ('api', 5, 2, 1, 1, 0)"
    )
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args, state, concurrency_key) VALUES"
        " ('call', 'api', '{}', 'running', 'a'), ('call', 'api', '{}', 'available', 'a'),"
        " ('call', 'api', '{}', 'available', 'b'), ('call', 'plain', '{}', 'available', NULL)"
    )
    runner = CliRunner()
    text = runner.invoke(main, ["--database-url", database_url, "queue", "stats"])
    assert text.exit_code == 0, text.output
    header, api, plain = text.stdout.splitlines()
    assert header.split()[-3:] == ["LIMITS", "HELD", "BACK"]
    assert "rate 5/s burst 2, cap 1, key 1" in api
    assert api.rstrip().endswith("1 by cap, 1 by keys")
    assert plain.split()[0] == "plain"
    assert plain.split()[-2:] == ["-", "0"]
    shown = runner.invoke(main, ["--database-url", database_url, "queue", "stats", "--json"])
    by_queue = {entry["queue"]: entry for entry in json.loads(shown.stdout)}
    assert by_queue["api"]["limits"] == {
        "rate": 5.0,
        "burst": 2,
        "global_max_running": 1,
        "key_concurrency": 1,
    }
    assert by_queue["api"]["held_back"] == {"rate": 0, "cap": 1, "keys": 1, "total": 2}
    assert by_queue["plain"]["limits"] is None
