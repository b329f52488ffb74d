"""The least-privilege roles of docs/deployment.md, run as the guide writes them.

The guide's one ``sql`` block is run with role names of this test's own (roles are
cluster-wide, so each run suffixes them): part 1 as the superuser, ``awa migrate`` as the
owner, part 2 as the owner. Then a real ``awa worker`` process (tests/procs/deploy_app.py)
runs under the worker role while a producer inserts under the producer role, and the test
checks that the jobs complete, that the leader's duties work under the worker role
(promotion, rescue, retention, expired runtimes, periodic fires, queue samples), and that
each role is refused what it must not do.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import awa

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "deployment.md"
PROCS = Path(__file__).parent / "procs"
AWA = Path(sys.executable).with_name("awa")
PART_2 = "-- Part 2"

# Short intervals, so that every leader duty runs within a second or two.
WORKER_ARGS = [
    "--queue", "deploy=4", "--queue", "limited=2", "--queue", "ticks=2",
    "--queue-option", "limited.rate_limit=50",
    "--queue-option", "deploy.poll_interval=0.1",
    "--promote-interval", "0.05",
    "--leader-election-interval", "0.2",
    "--heartbeat-interval", "0.2",
    "--heartbeat-staleness", "5",
    "--heartbeat-rescue-interval", "0.2",
    "--cleanup-interval", "0.2",
    "--cron-interval", "0.2",
    "--queue-sample-interval", "0.2",
    "--vacuum-interval", "0.2",
    "--vacuum-threshold", "1",
    "--shutdown-timeout", "5",
    "--metrics-port", "0",
    "--metrics-host", "127.0.0.1",
]  # fmt: skip

Conn = psycopg.Connection[Any]


def guide_sql() -> tuple[str, str]:
    """Part 1 and part 2 of the guide's only ``sql`` block."""
    blocks = re.findall(r"```sql\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/deployment.md must hold exactly one sql block"
    before, marker, after = blocks[0].partition(PART_2)
    assert marker, f"the sql block has no {PART_2!r} line"
    return before, marker + after


def personalize(text: str, roles: dict[str, str], database: str) -> str:
    """The guide's SQL with this run's role names and database."""
    text = re.sub(r"\bawa_(owner|worker|producer)\b", lambda m: roles[m.group(1)], text)
    return re.sub(r"\bappdb\b", f'"{database}"', text)


def as_role(url: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(url, user=role)


def wait_until(predicate: Callable[[], Any], timeout: float, message: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message()
        time.sleep(0.05)


def run_awa(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AWA), *args],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(conn: Conn, statement: str, *params: Any) -> None:
    """``statement`` fails for lack of privilege (in a transaction, rolled back)."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute(statement, params or None)


class Worker:
    """``awa worker deploy_app:client`` under a role, its output in a file."""

    def __init__(self, url: str, log: Path) -> None:
        self.log = log
        self._output = log.open("w")
        self.process = subprocess.Popen(
            [str(AWA), "worker", "deploy_app:client", *WORKER_ARGS],
            cwd=PROCS,
            env={**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(PROCS)},
            stdout=self._output,
            stderr=subprocess.STDOUT,
        )
        found = None
        deadline = time.monotonic() + 30
        while found is None:
            assert self.process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{found.group(1)}"

    def ready(self) -> bool:
        try:
            return httpx.get(self.base + "/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self._output.close()


@pytest.fixture
def roles(server_url: str, fresh_database: str) -> Iterator[dict[str, str]]:
    """This run's names for the guide's three roles; they and everything they own or were
    granted in the test database are dropped afterwards."""
    suffix = secrets.token_hex(4)
    names = {kind: f"awa_{kind}_{suffix}" for kind in ("owner", "worker", "producer")}
    yield names
    with psycopg.connect(server_url, autocommit=True) as conn:
        existing = {
            row[0]
            for row in conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", [list(names.values())]
            )
        }
    if existing:
        with psycopg.connect(fresh_database, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = ANY(%s) AND pid <> pg_backend_pid()",
                [sorted(existing)],
            )
            owned = ", ".join(f'"{name}"' for name in sorted(existing))
            conn.execute(f"REASSIGN OWNED BY {owned} TO CURRENT_USER")
            # One role at a time: dropping the roles' shared default privileges in one
            # statement fails ("could not find tuple for default ACL").
            for name in names.values():
                if name in existing:
                    conn.execute(f'DROP OWNED BY "{name}"')
    with psycopg.connect(server_url, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def seed_leader_work(owner: Conn) -> dict[str, Any]:
    """Rows only the leader's duties move on, written by the owner: an attempt whose
    worker died an hour ago, a job completed three days ago, a runtime that stopped
    heartbeating."""
    rescued = owner.execute(
        "INSERT INTO awa.jobs (kind, queue, args, state, attempt, run_lease, attempted_at,"
        " heartbeat_at) VALUES ('greet', 'deploy', '{\"n\": 900}', 'running', 1, 1,"
        " now() - interval '1 hour', now() - interval '1 hour') RETURNING id"
    ).fetchone()
    expired = owner.execute(
        "INSERT INTO awa.jobs (kind, queue, args, state, attempt, created_at, run_at,"
        " finalized_at) VALUES ('greet', 'deploy', '{\"n\": 901}', 'completed', 1,"
        " now() - interval '4 days', now() - interval '4 days', now() - interval '3 days')"
        " RETURNING id"
    ).fetchone()
    # As if the done ring had gone round since: the slot holding it was sealed three days
    # ago and comes next, so the leader's retention truncates it (with the owner's rights,
    # through awa.rotate_done_ring).
    owner.execute(
        "UPDATE awa.storage_slots SET opened_at = now() - interval '3 days',"
        " sealed_at = CASE WHEN slot = (awa.done_slot() + 7) % 8 THEN NULL"
        " ELSE now() - interval '3 days' END WHERE ring = 'done'"
    )
    owner.execute("SELECT setval('awa.done_slot', (awa.done_slot() + 7) % 8)")
    stale = owner.execute(
        "INSERT INTO awa.runtimes (id, hostname, pid, application_name, version, queues,"
        " stale_after, started_at, heartbeat_at) VALUES (gen_random_uuid(), 'gone', 1,"
        " 'gone', '0', '{deploy}', interval '1 second', now() - interval '1 hour',"
        " now() - interval '1 hour') RETURNING id"
    ).fetchone()
    assert rescued is not None
    assert expired is not None
    assert stale is not None
    return {"rescued": rescued[0], "expired": expired[0], "stale_runtime": stale[0]}


def produce(url: str) -> list[int]:
    """Insert jobs every way a producer does; returns their ids."""
    ids = []
    with awa.Client(url, application_name="awa-deploy-producer") as client:
        for n in range(3):
            ids.append(client.insert({"n": n}, kind="greet", queue="deploy").id)
        ids.append(client.insert({"n": 1}, kind="flaky", queue="deploy").id)
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.5)
        scheduled = client.insert({"n": 10}, kind="greet", queue="deploy", run_at=soon)
        assert scheduled.state is awa.JobState.SCHEDULED
        ids.append(scheduled.id)
        batch = [{"n": n} for n in (20, 21)]
        ids.extend(row.id for row in client.insert_many(batch, kind="greet", queue="deploy"))
        copied = [{"n": n} for n in range(4)]
        rows = client.insert_many_copy(copied, kind="limited", queue="limited")
        ids.extend(row.id for row in rows)
        unique = client.insert({"n": 30}, kind="greet", queue="deploy", unique_opts={})
        ids.append(unique.id)
        with pytest.raises(awa.UniqueConflict) as conflict:
            client.insert({"n": 30}, kind="greet", queue="deploy", unique_opts={})
        assert conflict.value.job_id == unique.id
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            client.cancel(unique.id)
    with psycopg.connect(url) as conn:  # the application's own transaction
        ids.append(awa.bridge.insert_job_sync(conn, {"n": 40}, kind="greet", queue="deploy").id)
        conn.commit()
        awa.bridge.insert_job_sync(conn, {"n": 41}, kind="greet", queue="deploy")
        conn.rollback()
    return ids


def settled(conn: Conn, ids: list[int], seeded: dict[str, Any]) -> bool:
    row = conn.execute(
        "SELECT"
        " (SELECT count(*) FROM awa.jobs WHERE id = ANY(%(ids)s) AND state = 'completed'),"
        " (SELECT count(*) FROM awa.jobs WHERE id = %(rescued)s AND state = 'completed'"
        '   AND errors @> \'[{"rescued": "stale_heartbeat"}]\'),'
        " (SELECT count(*) FROM awa.jobs WHERE id = %(expired)s),"
        " (SELECT count(*) FROM awa.runtimes WHERE id = %(stale_runtime)s),"
        " (SELECT count(*) FROM awa.jobs WHERE kind = 'greet' AND state = 'completed'),"
        " (SELECT count(*) FROM awa.jobs WHERE kind = 'receipt' AND state = 'completed'),"
        " (SELECT count(*) FROM awa.jobs WHERE metadata->>'cron_name' = 'deploy-tick'"
        "   AND state = 'completed'),"
        " (SELECT count(*) FROM awa.queue_samples WHERE queue = 'deploy'),"
        " (SELECT count(*) FROM awa.queue_limits WHERE queue = 'limited')",
        {"ids": ids, **seeded},
    ).fetchone()
    assert row is not None
    done, rescued, expired, stale, greets, receipts, ticks, samples, limits = row
    return (
        done == len(ids)
        and rescued == 1
        and expired == 0
        and stale == 0
        and receipts == greets
        and ticks > 0
        and samples == 1
        and limits == 1
    )


def describe(conn: Conn, worker: Worker) -> str:
    rows = conn.execute(
        "SELECT kind, state::text, count(*) FROM awa.jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    return f"jobs: {rows}\nworker log:\n{worker.log.read_text()}"


def test_the_guides_roles_run_a_worker_and_a_producer(
    server_url: str, fresh_database: str, roles: dict[str, str], tmp_path: Path
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(fresh_database)["dbname"]
    part_1, part_2 = (personalize(part, roles, str(dbname)) for part in guide_sql())
    owner_url, worker_url, producer_url = (
        as_role(fresh_database, roles[kind]) for kind in ("owner", "worker", "producer")
    )
    with psycopg.connect(fresh_database, autocommit=True) as admin:
        admin.execute(part_1)

    # The owner migrates (twice: the second run finds nothing to apply), then
    # grants the rest.
    for _ in range(2):
        migrated = run_awa(owner_url, "migrate")
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "up to date" in migrated.stdout
    with psycopg.connect(owner_url, autocommit=True) as owner:
        owner.execute(part_2)
        superuser = owner.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert superuser.fetchone() == (False,)
        # The schema and everything in it belong to the owner.
        schema_owner = owner.execute(
            "SELECT pg_get_userbyid(nspowner) = current_user FROM pg_namespace"
            " WHERE nspname = 'awa'"
        ).fetchone()
        not_owned = owner.execute(
            "SELECT count(*) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'awa' AND pg_get_userbyid(c.relowner) <> current_user"
        ).fetchone()
        assert schema_owner == (True,)
        assert not_owned == (0,)
        seeded = seed_leader_work(owner)

    # Neither the producer nor the worker may change the schema; a migrate with nothing to
    # apply (a process that migrates at start) succeeds for them.
    for url in (producer_url, worker_url):
        attempt = run_awa(url, "migrate")
        assert attempt.returncode == 0, attempt.stdout + attempt.stderr
        assert "up to date" in attempt.stdout
        with psycopg.connect(url, autocommit=True) as conn:
            refused(conn, "CREATE TABLE awa.intruder (id integer)")
            refused(conn, "DROP VIEW awa.jobs")
            refused(conn, "DROP TABLE awa.held_jobs")
            refused(conn, "TRUNCATE awa.done_jobs")
            refused(conn, "DELETE FROM awa.schema_migrations")
            refused(conn, "INSERT INTO awa.queues (queue, paused) VALUES ('deploy', true)")
    with psycopg.connect(producer_url, autocommit=True) as producer:
        refused(producer, "DELETE FROM awa.jobs WHERE id = %s", seeded["expired"])
        refused(producer, "UPDATE awa.jobs SET priority = 1 WHERE id = %s", seeded["rescued"])
        refused(producer, "DELETE FROM awa.runtimes")
    with psycopg.connect(worker_url, autocommit=True) as conn:
        refused(conn, "DELETE FROM awa.cron_jobs")
        # A non-owner's VACUUM is skipped with a warning, not an error.
        notices: list[str] = []
        conn.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        conn.execute("VACUUM awa.held_jobs")
        assert any("skipping" in notice for notice in notices), notices

    worker = Worker(worker_url, tmp_path / "worker.log")
    try:
        ids = produce(producer_url)
        with psycopg.connect(fresh_database, autocommit=True) as conn:
            wait_until(lambda: settled(conn, ids, seeded), 60, lambda: describe(conn, worker))
            wait_until(worker.ready, 15, lambda: httpx.get(worker.base + "/readyz").text)
            live = conn.execute(
                "SELECT count(*) FROM awa.runtimes"
                " WHERE application_name = 'awa-deploy-worker' AND is_leader"
            ).fetchone()
            assert live == (1,), describe(conn, worker)
            # Read-only tools work under the producer role; the fleet is healthy.
            for command in (["health"], ["job", "list"], ["queue", "stats"]):
                result = run_awa(producer_url, *command)
                assert result.returncode == 0, result.stdout + result.stderr
    finally:
        code = worker.stop()
    log = worker.log.read_text()
    assert code == 0, log
    assert "permission denied" not in log, log
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM awa.runtimes").fetchone()
        assert left == (0,), "the worker could not delete its runtime row at shutdown"

    # What a later migration creates as the owner gets the default grants.
    with psycopg.connect(owner_url, autocommit=True) as owner:
        owner.execute("CREATE TABLE awa.deploy_probe (id integer)")
    with psycopg.connect(worker_url, autocommit=True) as conn:
        conn.execute("INSERT INTO awa.deploy_probe VALUES (1)")
        conn.execute("UPDATE awa.deploy_probe SET id = 2")
        conn.execute("DELETE FROM awa.deploy_probe")
    with psycopg.connect(producer_url, autocommit=True) as producer:
        assert producer.execute("SELECT count(*) FROM awa.deploy_probe").fetchone() == (0,)
        refused(producer, "INSERT INTO awa.deploy_probe VALUES (1)")
