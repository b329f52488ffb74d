"""Migrations: creating the schema, idempotence, concurrent migrators, the SQL script, and
the error a client gives on a database that was never migrated."""

from __future__ import annotations

import multiprocessing
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import awa
from awa.sql import current_version, migrations
from awa.storage.migrations import migration_script
from jobs_helpers import maybe_await


def schema_state(url: str) -> tuple[bool, list[tuple[int, str]]]:
    """Whether schema awa exists, and the recorded (version, name) rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regnamespace('awa') IS NOT NULL").fetchone()
        assert exists is not None
        if not exists[0]:
            return False, []
        rows = conn.execute(
            "SELECT version, name FROM awa.schema_migrations ORDER BY version"
        ).fetchall()
        return True, [(int(version), str(name)) for version, name in rows]


ALL_VERSIONS = [(migration.version, migration.name) for migration in migrations()]


def assert_working_schema(url: str) -> None:
    """A full round trip through the schema: insert, read back, admin."""
    with awa.Client(url) as client:
        job = client.insert({"ok": True}, kind="probe", queue="probe", unique_opts={})
        assert client.get_job(job.id) == job
        with pytest.raises(awa.UniqueConflict):
            client.insert({"ok": True}, kind="probe", unique_opts={})
        assert client.cancel(job.id) is not None
        assert [stats.queue for stats in client.queue_stats()] == ["probe"]


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_migrate_creates_the_schema_once(fresh_database: str, flavour: str) -> None:
    assert schema_state(fresh_database) == (False, [])
    client: Any = (awa.AsyncClient if flavour == "async" else awa.Client)(fresh_database)
    try:
        assert await maybe_await(client.migrate()) == [v for v, _ in ALL_VERSIONS]
        assert schema_state(fresh_database) == (True, ALL_VERSIONS)
        assert await maybe_await(client.migrate()) == []
        assert schema_state(fresh_database) == (True, ALL_VERSIONS)
    finally:
        await maybe_await(client.close())
    assert_working_schema(fresh_database)


def _migrate_in_process(url: str, barrier: Any, results: Any) -> None:
    barrier.wait(timeout=60)
    with awa.Client(url) as client:
        results.put(client.migrate())


def test_concurrent_migrators_in_separate_processes(fresh_database: str) -> None:
    processes = 4
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=_migrate_in_process, args=(fresh_database, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    applied = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sorted(applied) == [[]] * (processes - 1) + [[v for v, _ in ALL_VERSIONS]]
    assert schema_state(fresh_database) == (True, ALL_VERSIONS)
    with psycopg.connect(fresh_database) as conn:
        version = conn.execute("SELECT max(version) FROM awa.schema_migrations").fetchone()
    assert version == (current_version(),)
    assert_working_schema(fresh_database)


@pytest.fixture
def second_fresh_database(server_url: str, fresh_database: str) -> Iterator[str]:
    """Another never-migrated database (beside ``fresh_database``)."""
    name = psycopg.conninfo.conninfo_to_dict(fresh_database)["dbname"] + "_b"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(server_url, dbname=name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def test_migration_script_applied_with_psycopg_and_psql(
    fresh_database: str, second_fresh_database: str
) -> None:
    script = migration_script()
    assert script.startswith(f"-- awa schema, migrations 1 to {current_version()}")
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        conn.execute(script)
    subprocess.run(
        ["psql", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-q", "-d", second_fresh_database],
        input=script,
        text=True,
        check=True,
        capture_output=True,
    )
    for url in (fresh_database, second_fresh_database):
        assert schema_state(url) == (True, ALL_VERSIONS)
        assert_working_schema(url)
        with awa.Client(url) as client:
            assert client.migrate() == []


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_unmigrated_database_says_to_migrate(fresh_database: str, flavour: str) -> None:
    client: Any = (awa.AsyncClient if flavour == "async" else awa.Client)(fresh_database)
    calls = [
        lambda: client.insert({"a": 1}, kind="k"),
        lambda: client.insert_many([{"a": 1}], kind="k"),
        lambda: client.insert_many_copy([{"a": 1}], kind="k"),
        lambda: client.get_job(1),
        lambda: client.list_jobs(),
        lambda: client.cancel(1),
        lambda: client.queue_stats(),
        lambda: client.pause_queue("q"),
    ]
    try:
        for call in calls:
            with pytest.raises(awa.SchemaNotMigrated, match="awa migrate"):
                await maybe_await(call())
    finally:
        await maybe_await(client.close())
    assert schema_state(fresh_database) == (False, [])
