"""A program written for the reference package (awa-pg), from its documented API only
(../shared/reference/python-api.md): its spellings, options in milliseconds and hours, the
list-of-dicts queue form, ``$1`` placeholders, rows read as dicts, ``python -m awa``. It runs
here unchanged, against the real database. The dead-letter queue, descriptors, partitioned
queues and batch operations have their reference-style tests in test_reference_features.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
import warnings

import pytest

import awa
import awa.testing


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str


@dataclasses.dataclass
class ChargeCard:
    order_id: int


async def wait_until(predicate, timeout=10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_job_state_spellings() -> None:
    assert awa.JobState.Available == awa.JobState.AVAILABLE
    assert awa.JobState.WaitingExternal is awa.JobState.WAITING_EXTERNAL
    assert str(awa.JobState.Failed) == "failed"
    assert [str(state) for state in awa.JobState][:8] == [
        "scheduled",
        "available",
        "running",
        "completed",
        "retryable",
        "failed",
        "cancelled",
        "waiting_external",
    ]  # then "blocked": waiting for the jobs it depends on (workflows)


async def test_worker_with_millisecond_options_and_dict_queues(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    await client.migrate()
    sent: list[str] = []

    @client.task(SendEmail, queue="email")
    async def send_email(job):  # type: ignore[no-untyped-def]
        sent.append(job.args.to)

    @client.task(ChargeCard, queue="billing")
    async def charge(job):  # type: ignore[no-untyped-def]
        return None

    job = await client.insert(SendEmail(to="a@example.com", subject="hi"), queue="email")
    assert job["state"] == "available"
    assert job["kind"] == "send_email"
    await client.start(
        [
            {"name": "email", "max_workers": 2, "deadline_duration_ms": 60_000},
            {
                "name": "billing",
                "max_workers": 1,
                "retention": {"completed_hours": 1, "failed_hours": 2},
                "claimers": 1,
            },
        ],
        poll_interval_ms=50,
        heartbeat_interval_ms=200,
        heartbeat_staleness_ms=5_000,
        leader_election_interval_ms=200,
        promote_interval_ms=50,
        heartbeat_rescue_interval_ms=1_000,
        deadline_rescue_interval_ms=1_000,
        callback_rescue_interval_ms=1_000,
        completed_retention_hours=24,
        failed_retention_hours=72,
        cleanup_batch_size=500,
        queue_storage_queue_slot_count=16,  # the reference's other engine: no effect here
    )
    try:

        async def done():  # type: ignore[no-untyped-def]
            row = await client.get_job(job["id"])
            return row is not None and row["state"] == awa.JobState.Completed

        await wait_until(done)
        assert sent == ["a@example.com"]
        health = await client.health_check()
        assert health["postgres_connected"] is True
        assert health.poll_loop_alive is True
        stats = {stat.queue: stat for stat in await client.queue_stats()}
        assert stats["email"].completed_last_hour == 1
        assert stats["email"].total_queued == 0
        assert stats["email"].lag_seconds is None
    finally:
        await client.shutdown(timeout_ms=2000)
        await client.close()


async def test_a_seconds_option_and_its_millisecond_twin_are_refused(database_url: str) -> None:
    client = awa.AsyncClient(database_url)

    @client.task(SendEmail)
    async def send_email(job):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(awa.ValidationError, match="heartbeat_interval_ms and heartbeat_interval"):
        await client.start(heartbeat_interval=1, heartbeat_interval_ms=1000)
    with pytest.raises(awa.ValidationError, match="deadline_duration_ms and deadline_duration"):
        await client.start(
            [
                {
                    "name": "default",
                    "max_workers": 1,
                    "deadline_duration_ms": 5,
                    "deadline_duration": 5,
                }
            ]
        )
    with pytest.raises(awa.ValidationError, match=r"heartbeat_interval_ms .* integer of 1329 bits"):
        await client.start(heartbeat_interval_ms=10**400)
    with pytest.raises(awa.ValidationError, match="'name' key"):
        await client.start([{"max_workers": 1}])
    with pytest.raises(awa.ValidationError, match="timeout_ms"):
        await client.shutdown(1, timeout_ms=1000)
    await client.close()


async def test_transaction_with_dollar_placeholders(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    async with await client.transaction() as tx:
        await tx.execute("CREATE TEMP TABLE orders (id int, note text) ON COMMIT DROP")
        inserted = await tx.execute("INSERT INTO orders VALUES ($1, $2), ($1 + 1, $2)", 7, "x")
        assert inserted == 2
        row = await tx.fetch_one(
            "SELECT count(*) AS n, max(id) AS top FROM orders WHERE note = $1", "x"
        )
        assert row["n"] == 2
        assert row["top"] == 8
        literal = await tx.fetch_one("SELECT '$1 costs 5%' AS text, $1::int AS n", 3)
        assert literal == {"text": "$1 costs 5%", "n": 3}
        missing = await tx.fetch_optional("SELECT id FROM orders WHERE id = $1", 99)
        assert missing is None
        job = await tx.insert(ChargeCard(order_id=7), queue="billing")
        assert job["queue"] == "billing"
        with pytest.raises(awa.ValidationError, match="mixes"):
            await tx.fetch_all("SELECT $1::int, %s::int", 1, 2)
    async with awa.AsyncClient(database_url) as other:
        assert (await other.get_job(job["id"]))["kind"] == "charge_card"  # type: ignore[index]
    await client.close()


def test_sync_client_and_rows_as_dicts(database_url: str) -> None:
    with awa.Client(database_url) as client:
        job = client.insert(SendEmail(to="b@example.com", subject="s"), queue="email", priority=1)
        assert job["priority"] == 1
        assert job.get("no_such_field") is None
        with pytest.raises(KeyError):
            job["no_such_field"]
        with client.transaction() as tx:
            assert tx.fetch_one("SELECT $1::text || $2::text AS s", "a", "b")["s"] == "ab"
        listed = client.list_jobs(state="available", kind="send_email")
        assert [row["id"] for row in listed] == [job["id"]]
        client.cancel(job["id"])
        result = client.retry_failed(kind="send_email")
        assert result.jobs == []
        assert result.matched == 0
        assert result.pruned_failed_count is None
        with pytest.raises(ValueError, match="exactly one of"):
            client.retry_failed()


async def test_insert_many_copy_with_per_job_opts(database_url: str) -> None:
    async with awa.AsyncClient(database_url) as client:
        jobs = await client.insert_many_copy(
            [ChargeCard(order_id=n) for n in range(3)],
            queue="billing",
            ordering_key="batch",
            opts=[None, {"queue": "billing-eu"}, {"ordering_key": None}],
        )
        assert [job["queue"] for job in jobs] == ["billing", "billing-eu", "billing"]
        assert [job.ordering_key for job in jobs] == [b"batch", b"batch", None]
        with pytest.raises(awa.ValidationError, match="opts length must match jobs length"):
            await client.insert_many_copy([ChargeCard(order_id=1)], opts=[None, None])
        with pytest.raises(awa.ValidationError, match="unsupported opts key 'priority'"):
            await client.insert_many_copy([ChargeCard(order_id=1)], opts=[{"priority": 1}])


async def test_deprecated_worker_decorator(database_url: str) -> None:
    client = awa.AsyncClient(database_url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @client.worker(SendEmail, queue="email")
        async def send_email(job):  # type: ignore[no-untyped-def]
            return None

    assert "client.worker() is deprecated" in str(caught[0].message)
    assert client.insert_rules.queue_for("send_email", None) == "email"
    await client.close()


def test_module_functions_and_python_m_awa(database_url: str) -> None:
    versions = [version for version, _, _ in awa.migrations()]
    assert versions == list(range(1, awa.current_migration_version() + 1))
    assert [v for v, _, _ in awa.migrations_range(1, 3)] == [2, 3]
    assert awa.migrate(database_url) == []  # already migrated (also awaitable, as there)
    result = subprocess.run(
        [sys.executable, "-m", "awa", "migrate"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


async def test_testing_no_job(database_url: str) -> None:
    async with awa.AsyncClient(database_url) as client:
        tc = awa.testing.AwaTestClient(client)
        result = await tc.work_one(SendEmail, lambda job: None)
        assert result.is_no_job()
        assert result.job is awa.testing.NoJob
        assert not result.job
        assert repr(awa.testing.NoJob) == "NoJob"
