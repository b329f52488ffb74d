"""The leader's VACUUM of awa.jobs under a role that does not own the table: Postgres skips
it with a warning, which the duty notices once, logs, and stops trying."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest
from psycopg import sql

from awa.worker.maintenance import vacuum_duty


async def test_a_role_that_may_not_vacuum_stops_trying(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"awa_vacuum_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA awa TO {}").format(sql.Identifier(role)))
    try:
        info = psycopg.conninfo.conninfo_to_dict(database_url)
        info["user"] = role
        duty = vacuum_duty(60, threshold=-1)  # always over the threshold
        async with await psycopg.AsyncConnection.connect(
            psycopg.conninfo.make_conninfo(**info), autocommit=True
        ) as conn:
            with caplog.at_level(logging.DEBUG, logger="awa"):
                await duty.run(conn)
                await duty.run(conn)
        notes = [r.getMessage() for r in caplog.records if "vacuum" in r.getMessage()]
        assert len(notes) == 1, notes  # said once, then the duty stays quiet
        assert notes[0].startswith("not vacuuming awa.")
        assert "autovacuum" in notes[0]
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
