"""Upgrade in place to the storage of migration 12: a database of the schema before it,
holding jobs in every state (a running attempt whose worker died, a parked callback, a
blocked child, unique keys, a workflow), periodic schedules and dead-letter entries, is
migrated; nothing is lost, and every job then runs to its end."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import awa
from awa.sql import migrations, query
from helpers_worker import wait_for
from jobs_helpers import Conn

BEFORE_STORAGE = 11

CALLBACK = "9f1c2d3e-4b5a-4c6d-8e7f-001122334455"
WORKFLOW = "00000000-0000-4000-8000-000000000012"


@dataclasses.dataclass
class Legacy:
    n: int


def migrate_to(conn: Conn, version: int) -> None:
    """Apply migrations up to ``version`` (as an older release of awa would have)."""
    with conn.transaction():
        conn.execute(query("migrate_lock"))
        conn.execute(query("migrate_bootstrap"))
        for migration in migrations():
            if migration.version <= version:
                conn.execute(migration.sql)
                conn.execute(
                    query("migrate_record"),
                    {"version": migration.version, "name": migration.name},
                )


def seed(conn: Conn) -> dict[str, Any]:
    """Jobs in every state, in the one-table schema of migration 11."""

    def job(state: str, n: int, **columns: Any) -> int:
        names = ["kind", "queue", "args", "state", *columns]
        values = ["legacy", "legacy", Jsonb({"n": n}), state, *columns.values()]
        row = conn.execute(
            sql.SQL("INSERT INTO awa.jobs ({}) VALUES ({}) RETURNING id").format(
                sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join(sql.Placeholder() * len(names)),
            ),
            values,
        ).fetchone()
        assert row is not None
        return int(row[0])

    hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    ids = {
        "available": job("available", 1),
        "scheduled": job("scheduled", 2, run_at=later),
        "retryable": job("retryable", 3, attempt=1, run_at=hour_ago, finalized_at=hour_ago),
        # A running attempt whose worker died an hour ago: rescue retries it.
        "running": job(
            "running", 4, attempt=1, run_lease=1, attempted_at=hour_ago, heartbeat_at=hour_ago
        ),
        "parked": job(
            "waiting_external",
            5,
            attempt=1,
            run_lease=1,
            callback_id=CALLBACK,
            callback_timeout_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1),
        ),
        "completed": job("completed", 6, attempt=1, finalized_at=hour_ago),
        "failed": job("failed", 7, attempt=25, finalized_at=hour_ago),
        "cancelled": job("cancelled", 8, finalized_at=hour_ago),
        "unique": job(
            "available",
            9,
            unique_key=b"\x01" * 16,
            unique_states=0b00011111,
        ),
        "workflow": job("available", 10, workflow_id=WORKFLOW, has_dependents=True),
    }
    ids["blocked"] = job("blocked", 11, workflow_id=WORKFLOW)
    conn.execute(
        "INSERT INTO awa.job_dependencies (child_id, parent_id, policy) VALUES (%s, %s, 'cancel')",
        (ids["blocked"], ids["workflow"]),
    )
    dead = job("failed", 12, attempt=25, finalized_at=hour_ago)
    conn.execute("INSERT INTO awa.queue_settings (queue, dlq_enabled) VALUES ('legacy', false)")
    conn.execute(
        "INSERT INTO awa.dlq_entries SELECT * FROM awa.dlq_snapshot("
        "(SELECT to_jsonb(j) FROM awa.jobs AS j WHERE j.id = %s), 'max_attempts_exhausted')",
        (dead,),
    )
    conn.execute("DELETE FROM awa.jobs WHERE id = %s", (dead,))
    ids["dlq"] = dead
    conn.execute(
        "INSERT INTO awa.cron_jobs (name, cron_expr, timezone, kind, queue, args,"
        " last_enqueued_at) VALUES ('legacy-tick', '* * * * *', 'UTC', 'legacy', 'legacy',"
        " '{\"n\": 99}', date_trunc('minute', now()) - interval '1 minute')"
    )
    return ids


def states(conn: Conn) -> dict[int, str]:
    return dict(conn.execute("SELECT id, state::text FROM awa.jobs").fetchall())


@pytest.mark.slow
async def test_an_upgrade_in_place_moves_every_job_and_loses_none(fresh_database: str) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        migrate_to(conn, BEFORE_STORAGE)
        ids = seed(conn)
        before = conn.execute("SELECT * FROM awa.jobs ORDER BY id").fetchall()
        columns = [c.name for c in conn.execute("SELECT * FROM awa.jobs LIMIT 0").description or []]
        last_id = conn.execute("SELECT max(id) FROM awa.jobs").fetchone()

    async with awa.AsyncClient(fresh_database) as client:
        assert await client.migrate() == [v.version for v in migrations() if v.version > 11]

    with psycopg.connect(fresh_database, autocommit=True) as conn:
        # Every row, column by column, through the read model.
        after = conn.execute(
            sql.SQL("SELECT {} FROM awa.jobs ORDER BY id").format(
                sql.SQL(", ").join(map(sql.Identifier, columns))
            )
        ).fetchall()
        assert after == before
        homes = dict(
            conn.execute(
                "SELECT 'active', count(*) FROM awa.active_jobs UNION ALL"
                " SELECT 'held', count(*) FROM awa.held_jobs UNION ALL"
                " SELECT 'done', count(*) FROM awa.done_jobs"
            ).fetchall()
        )
        assert homes == {"active": 4, "held": 6, "done": 1}
        holder = conn.execute("SELECT job_id FROM awa.unique_keys").fetchall()
        assert holder == [(ids["unique"],)]

    client = awa.AsyncClient(fresh_database)
    ran: list[int] = []

    @client.task(Legacy, queue="legacy")
    async def legacy(job: awa.Job[Legacy]) -> None:
        ran.append(job.args.n)

    # The migrated job still holds its key.
    with (
        psycopg.connect(fresh_database, autocommit=True) as conn,
        pytest.raises(psycopg.errors.UniqueViolation, match="jobs_unique_key_idx"),
    ):
        conn.execute(
            "INSERT INTO awa.jobs (kind, unique_key, unique_states) VALUES ('legacy', %s, 31)",
            (b"\x01" * 16,),
        )
    fresh = await client.insert(Legacy(13), queue="legacy")
    assert last_id is not None
    assert fresh.id > last_id[0]
    await client.start(
        {"legacy": 4},
        heartbeat_interval=0.5,
        heartbeat_staleness=1.0,
        heartbeat_rescue_interval=0.2,
        cron_interval=0.2,
    )
    try:
        await client.complete_external(CALLBACK, {"paid": True})
        for key in ("failed", "cancelled"):
            assert await client.retry(ids[key]) is not None
        assert await client.retry_from_dlq(ids["dlq"]) is not None

        with psycopg.connect(fresh_database, autocommit=True) as conn:

            def all_done() -> bool:
                found = states(conn)
                return all(found.get(job_id) == "completed" for job_id in ids.values()) and (
                    found.get(fresh.id) == "completed"
                )

            await wait_for(all_done, 30, message=lambda: f"{states(conn)}")
            fired = conn.execute(
                "SELECT count(*) FROM awa.jobs WHERE metadata ->> 'cron_name' = 'legacy-tick'"
            ).fetchone()
    finally:
        await client.shutdown()
        await client.close()
    assert fired is not None
    assert fired[0] >= 1  # the schedule fired after the upgrade, from its stored history
    # Every job that had to run did (the parked one completed by its callback, the completed
    # one was done already; 99 is the schedule's).
    assert sorted(n for n in ran if n != 99) == [1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13]
